"""`eval.tasks` in the spec: task names, local task files, task metrics as the hypothesis
metric; all checked by `pipeline validate` with file:line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from basics.errors import SpecError
from tests.infra.eval_task_repo import REPO, TASK_YAML, task_repo, write
from validation.eval_tasks import better_direction, read_task_file
from validation.loader import load_spec


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return task_repo(tmp_path, monkeypatch)


def issues(path: Path) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    return [i.text() for i in caught.value.issues]


def test_a_local_task_and_its_metric_validate(repo: Path):
    spec = load_spec(write(repo, """\
        eval:
          tasks:
            - path: data/tasks/tiny_choice.yaml
        """))
    assert spec.eval is not None
    assert spec.eval.tasks[0].limit == 200 and spec.eval.tasks[0].num_fewshot == 0
    assert spec.eval.examples() == 200
    assert spec.hypothesis.metric == "eval/task/tiny_choice/acc"


def test_no_eval_section_keeps_the_old_spec_hash(repo: Path):
    (repo / "experiments" / "plain.yaml").write_text(
        (REPO / "experiments" / "base.yaml").read_text(encoding="utf-8").split("\neval:")[0].replace(
            "name: base", "name: plain"), encoding="utf-8")
    assert "eval" not in load_spec(repo / "experiments" / "plain.yaml").training_dict()


def test_a_different_task_entry_than_the_baseline_is_not_comparable(repo: Path):
    found = issues(write(repo, """\
        eval:
          tasks:
            - path: data/tasks/tiny_choice.yaml
              num_fewshot: 2
        """))
    assert len(found) == 1 and "eval.tasks[tiny_choice] differ" in found[0]


def test_missing_task_file_is_reported_at_its_line(repo: Path):
    found = issues(write(repo, """\
        eval:
          tasks:
            - path: data/tasks/nope.yaml
        """))
    assert "experiments/tasks.yaml:11:13: eval.tasks[0].path: no task file data/tasks/nope.yaml" in found


def test_task_file_outside_a_data_root_is_refused(repo: Path):
    (repo / "elsewhere.yaml").write_text(TASK_YAML)
    found = issues(write(repo, """\
        eval:
          tasks:
            - path: elsewhere.yaml
        """))
    assert any(f.startswith("experiments/tasks.yaml:11:13: eval.tasks[0].path: must be inside a data root")
               for f in found)


def test_unknown_shipped_task_name_is_reported_with_a_suggestion(repo: Path):
    found = issues(write(repo, """\
        eval:
          tasks:
            - name: hellaswagg
        """, metric="eval/loss"))
    assert len(found) == 1
    assert found[0].startswith("experiments/tasks.yaml:11:13: eval.tasks[0].name: unknown lm-eval task 'hellaswagg'")
    assert "did you mean 'hellaswag'" in found[0]


def test_a_file_whose_task_is_not_its_stem_needs_a_name(repo: Path):
    shutil.copy(repo / "data" / "tasks" / "tiny_choice.yaml", repo / "data" / "tasks" / "other.yaml")
    found = issues(write(repo, """\
        eval:
          tasks:
            - path: data/tasks/other.yaml
        """, metric="eval/loss"))
    assert found == ["experiments/tasks.yaml:11:13: eval.tasks[0].path: data/tasks/other.yaml defines task "
                     "'tiny_choice': name the file tiny_choice.yaml or add `name: tiny_choice`"]


def test_hypothesis_metric_must_name_a_listed_task(repo: Path):
    found = issues(write(repo, """\
        eval:
          tasks:
            - path: data/tasks/tiny_choice.yaml
        """, metric="eval/task/tiny_choise/acc"))
    assert len(found) == 1
    assert found[0].startswith("experiments/tasks.yaml:5:11: hypothesis.metric: 'eval/task/tiny_choise/acc' names "
                               "task 'tiny_choise', which is not in eval.tasks (tiny_choice); did you mean")


def test_stderr_is_not_a_hypothesis_metric(repo: Path):
    found = issues(write(repo, """\
        eval:
          tasks:
            - path: data/tasks/tiny_choice.yaml
        """, metric="eval/task/tiny_choice/acc_stderr"))
    assert len(found) == 1 and "is a count or a standard error" in found[0]


def test_task_yaml_is_read_without_running_its_functions(repo: Path):
    data = read_task_file(repo / "data" / "tasks" / "tiny_choice.yaml")
    assert data["process_docs"] == "utils.process_docs"


def test_default_direction_of_task_metrics():
    assert better_direction("eval/task/x/acc") == "increase"
    assert better_direction("eval/task/x/acc_norm") == "increase"
    assert better_direction("eval/task/x/word_perplexity") == "decrease"
    assert better_direction("eval/loss") is None


def test_plan_shows_the_example_and_time_budget(repo: Path):
    from validation.plan import make_plan, render_plan_text

    spec = load_spec(write(repo, """\
        eval:
          tasks:
            - path: data/tasks/tiny_choice.yaml
          time_budget_s: 90
        """))
    plan = make_plan(spec)
    assert plan.to_dict()["downstream"] == ("200 examples, at most 90 s per run, rank 0 on the exported model: "
                                            "tiny_choice (200 ex, 0-shot)")
    assert "downstream     200 examples" in render_plan_text(plan)


def test_a_sweep_selecting_on_a_task_metric_must_not_prune_and_maximises_accuracy(repo: Path):
    from pipelines.sweep import selection

    body = """\
        eval:
          tasks:
            - path: data/tasks/tiny_choice.yaml
        sweep:
          parameters:
            train.lr: [0.001, 0.002]
          metric: eval/task/tiny_choice/acc
        """
    found = issues(write(repo, body, metric="eval/loss"))
    assert len(found) == 1 and "sweep.prune: 'eval/task/tiny_choice/acc' is scored once" in found[0]
    spec = load_spec(write(repo, body + "  prune: false\n", metric="eval/loss"))
    assert selection(spec) == ("eval/task/tiny_choice/acc", "max")  # not the hypothesis's "decrease"


def test_trusted_revalidation_does_not_look_for_a_task_file_the_pr_adds(repo: Path):
    from validation.spec import foreign_plugins_allowed

    (repo / "experiments" / "base.yaml").write_text(
        (repo / "experiments" / "base.yaml").read_text().replace("tiny_choice.yaml", "pr_task.yaml"))
    path = write(repo, """\
        eval:
          tasks:
            - path: data/tasks/pr_task.yaml
        """, metric="eval/task/pr_task/acc")
    assert any("no task file data/tasks/pr_task.yaml" in i for i in issues(path))
    with foreign_plugins_allowed():
        assert load_spec(path).hypothesis.metric == "eval/task/pr_task/acc"
