"""The trusted re-validation of a pull request (default-branch code, no PR Python) accepts an
architecture or optimizer the PR adds as a file, as a labelled stand-in; ordinary validation
refuses a name that is not a file (issue 23, parts 2 and 6)."""

from __future__ import annotations

from pathlib import Path

from validation.loader import check_spec
from validation.spec import ForeignArchitecture, ForeignOptimizer, foreign_plugins_allowed

REPO = Path(__file__).resolve().parents[2]


def _pr_experiment(tmp: Path) -> Path:
    (tmp / "experiments").mkdir()
    (tmp / "experiments" / "base.yaml").write_text((REPO / "experiments" / "base.yaml").read_text())
    (tmp / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    path = tmp / "experiments" / "my-attention.yaml"
    path.write_text(
        "$schema: ./schema.json\nname: my-attention\nowner: octocat\nextends: base.yaml\n"
        "hypothesis:\n  statement: A sliding window of 64 tokens keeps the held-out loss within one percent.\n"
        "  metric: eval/loss\n  direction: decrease\n  min_effect: 0.01\n  baseline: base\n"
        "model:\n  model_type: my_attention\n  window: 64\n"
        "train:\n  optimizer:\n    name: my_optimizer\n    rho: 0.5\n")
    return path


def test_an_unknown_architecture_is_refused_by_plain_validation(tmp_path: Path):
    spec, issues = check_spec(_pr_experiment(tmp_path), repo_root=tmp_path)
    assert spec is None
    fields = {i.field: i.message for i in issues}
    assert "no models/my_attention.py" in fields["model.model_type"]
    assert "no models/optimizers/my_optimizer.py" in fields["train.optimizer.name"]


def test_the_trusted_revalidation_accepts_it_as_a_stand_in(tmp_path: Path):
    path = _pr_experiment(tmp_path)
    with foreign_plugins_allowed():
        spec, issues = check_spec(path, repo_root=tmp_path)
    assert issues == [] and spec is not None
    assert isinstance(spec.model, ForeignArchitecture) and spec.model.model_type == "my_attention"
    assert isinstance(spec.train.optimizer, ForeignOptimizer)
    assert spec.model.parameter_count() > 0  # a generic estimate for the budget tier
    # Outside the block the rule is back.
    assert check_spec(path, repo_root=tmp_path)[0] is None


def test_the_trusted_revalidation_does_not_need_the_prs_task_files(tmp_path: Path):
    """It holds only the PR's experiments/ (as data): an eval task file elsewhere in the PR is
    PR content the unprivileged check validated (found by the act trust test: /train would have
    been refused for every PR with an eval task)."""
    path = _pr_experiment(tmp_path)
    text = path.read_text().replace("train:\n  optimizer:\n    name: my_optimizer\n    rho: 0.5\n", "")
    path.write_text(text + "eval:\n  tasks:\n    - path: data/tasks/demo_next_line.yaml\n")
    spec, issues = check_spec(path, repo_root=tmp_path)
    assert any("no task file" in i.message for i in issues)
    with foreign_plugins_allowed():
        spec, issues = check_spec(path, repo_root=tmp_path)
    assert not [i for i in issues if "task" in i.message], issues
