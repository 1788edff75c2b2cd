"""A new architecture is a file in the pull request (issue 23, "done when"): in a fresh copy of
the repository, a copy of an example architecture under a new name and an experiment that
uses it with tensor parallelism go through validate, plan and smoke (one process, then 2
processes of its TP layout) with `git status` showing only the two new files. The same file
with a tensor-parallel plan that forgets the gate fails in that smoke, in the PR check, with
its first error line (reproduced on the old main: validate, plan and smoke passed; training
crashed after `/train`, was relaunched four times, and said `ended 'no result.json'`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.infra.corpus import demo_corpus

REPO = Path(__file__).resolve().parents[2]

EXPERIMENT = """\
$schema: ./schema.json
name: gated-copy
owner: octocat
extends: base.yaml
hypothesis:
  statement: A gated attention output lowers the held-out loss by at least one percent in 200 steps.
  metric: eval/loss
  direction: decrease
  min_effect: 0.01
  baseline: base
model:
  model_type: gated_copy
  qk_norm: true
  attn_gate: true
parallel:
  dp: 1
  tp: 2
resource:
  cpu_processes: 2
"""


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=a", *args], cwd=repo, check=True,
                         capture_output=True, text=True)
    return out.stdout


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's files (tracked and new, not ignored) in a fresh git repository."""
    dst = tmp_path_factory.mktemp("clone") / "repo"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    _git(dst, "init", "-q")
    _git(dst, "add", "-A")
    _git(dst, "commit", "-qm", "main")
    # The demo corpus `pipeline data demo` writes, capped as the other smoke tests cap it (the full
    # 6.5 MB one took a process and the smoke's tokenizer most of this module's time); data/ is ignored.
    demo_corpus(dst / "data" / "demo", 150_000)
    return dst


def _env(repo: Path) -> dict[str, str]:
    # The copy's own packages first (the installed checkout is another tree).
    return dict(os.environ, PYTHONPATH=str(repo), MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1",
                TRANSFORMERS_OFFLINE="1", PIPELINE_DATA_ROOTS="")


def _pipeline(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipelines", *args], cwd=repo, env=_env(repo), capture_output=True,
                          text=True, timeout=900)


def _add_architecture(repo: Path, *, drop_gate_from_plan: bool = False) -> None:
    text = (repo / "models" / "llama_qknorm.py").read_text().replace("llama_qknorm", "gated_copy")
    if drop_gate_from_plan:
        line = '        "self_attn.gate_proj": "colwise",  # its output meets the attention output, split by head\n'
        assert line in text
        text = text.replace(line, "").replace('            plan.pop("self_attn.gate_proj")\n', "            pass\n")
    (repo / "models" / "gated_copy.py").write_text(text)
    (repo / "experiments" / "gated-copy.yaml").write_text(EXPERIMENT)


def test_a_copied_architecture_goes_through_validate_plan_and_sharded_smoke(clone: Path) -> None:
    _add_architecture(clone)
    status = _git(clone, "status", "--porcelain", "--untracked-files=all")
    assert sorted(status.splitlines()) == ["?? experiments/gated-copy.yaml", "?? models/gated_copy.py"]

    validated = _pipeline(clone, "validate", "experiments/gated-copy.yaml")
    assert validated.returncode == 0, validated.stdout + validated.stderr
    planned = _pipeline(clone, "plan", "experiments/gated-copy.yaml", "--format", "json")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    params = plan["preflight"]["parameters"]

    smoked = _pipeline(clone, "smoke", "experiments/gated-copy.yaml")
    assert smoked.returncode == 0, smoked.stdout[-3000:] + smoked.stderr[-3000:]
    result = json.loads((clone / "runs" / "smoke" / "gated-copy" / "smoke.json").read_text())
    assert result["status"] == "passed"
    assert result["checks"]["parameters_match"] and result["checks"]["flops_match"]
    assert result["sharded"]["layout"] == {"dp": 1, "tp": 2} and result["checks"]["really_sharded"]
    # The full-size model the plan counted is the one the architecture builds.
    sys.path.insert(0, str(clone))
    try:
        code = ("import json,sys; from validation.loader import load_spec; from trainer.measure import "
                "parameter_count_on_meta; s = load_spec('experiments/gated-copy.yaml'); "
                "print(parameter_count_on_meta(s.model))")
        counted = subprocess.run([sys.executable, "-c", code], cwd=clone, env=_env(clone), capture_output=True,
                                 text=True, timeout=300)
    finally:
        sys.path.remove(str(clone))
    assert int(counted.stdout.strip()) == params
    # Nothing but the two new files: runs/ and data/ are ignored.
    status = _git(clone, "status", "--porcelain", "--untracked-files=all")
    assert sorted(status.splitlines()) == ["?? experiments/gated-copy.yaml", "?? models/gated_copy.py"]


def test_a_tp_plan_that_forgets_the_gate_fails_in_the_pr_smoke_with_its_first_error(clone: Path) -> None:
    _add_architecture(clone, drop_gate_from_plan=True)
    validated = _pipeline(clone, "validate", "experiments/gated-copy.yaml")
    assert validated.returncode == 0  # nothing in the YAML is wrong: the plan is code
    smoked = _pipeline(clone, "smoke", "experiments/gated-copy.yaml")
    assert smoked.returncode == 5, smoked.stdout[-2000:]
    result = json.loads((clone / "runs" / "smoke" / "gated-copy" / "smoke.json").read_text())
    assert result["status"] == "failed" and not result["checks"]["sharded_finished"]
    error = result["sharded"]["error"]
    assert "failed before the first step" in error and "size of tensor" in error, error
    assert "sharded smoke" in smoked.stderr and "size of tensor" in smoked.stderr
    launcher_log = (clone / "runs" / "smoke" / "gated-copy" / "sharded" / "logs" / "launcher.log").read_text()
    assert "restart 1/" not in launcher_log  # a startup failure is not relaunched
