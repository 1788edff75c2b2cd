"""A launch whose runner was lost resumes from its own last checkpoint on the next `/train`
(issue 36 item 3), and never from a checkpoint anyone else planted.

Real trainings of the tiny experiment (8 steps, checkpoints at 4) through the flow the GPU job
runs, with the storage the runners share (`PIPELINE_RUNS_DIR`) and a local MLflow store:

1. launch 501: the trusted plan, then training; the trainer is SIGKILLed after step 6 with no
   restart left (the runner is gone). Its MLflow run, in the launch's job experiment, carries
   the checkpoint it published (`pipeline.checkpoint`: path, sha256 of its manifest).
2. launch 502, a fresh launch directory: the trusted plan (`resume_points`) names that
   checkpoint; the flow verifies its manifest digest, copies it in and resumes at step 4.
3. launch 503, after the checkpoint was rewritten on the shared storage (weights and manifest
   together, as another job could): its digest is not the recorded one, so it trains from zero.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pipelines.launch_plan import PLAN_ENV
from pipelines.orchestrate import ExperimentFlow, Reporter, RunOptions
from pipelines.rundir import LAUNCH_ENV, LAUNCH_NONCE_ENV, read_json
from pipelines.trusted.registry import plan_launch, with_resume_points
from tests.infra.tiny_experiments import BASE

EXPERIMENT = "tiny-base"


class Recorder(Reporter):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    def stage(self, experiment: str, stage: str, event: str, detail: str = "") -> None:
        self.events.append((experiment, stage, event, detail))

    def training(self, label: str, run_dir: Path, total_steps: int):  # noqa: ANN201 - a callable
        return lambda: None


def _checkout(root: Path) -> tuple[Path, str]:
    from tests.infra.corpus import demo_corpus

    root.mkdir()
    (root / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    (root / "experiments").mkdir()
    # No automatic restart: a kill ends the job, as a lost runner does.
    (root / "experiments" / f"{EXPERIMENT}.yaml").write_text(BASE.replace(
        "keep_last: 1}", "keep_last: 1, max_restarts: 0}"))
    demo_corpus(root / "data" / "demo", 60_000)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    return root, sha


def _launch(repo: Path, sha: str, uri: str, run_id: int, tmp: Path, monkeypatch: pytest.MonkeyPatch,
            *, kill_after: int | None = None) -> tuple[Recorder, dict, BaseException | None]:
    """One launch: the trusted plan (before any PR code), the job experiment the job-identity job
    makes, then the flow in the launch's own directory on the shared storage."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    plan = with_resume_points(plan_launch(repo, [EXPERIMENT], registry=None, sha=sha, pr=7), client)
    plan_file = tmp / f"plan-{run_id}.json"
    plan_file.write_text(plan.to_json())
    job_experiment = f"{EXPERIMENT}/job-{run_id}-1"
    client.create_experiment(job_experiment, tags={"pipeline.job_user": f"job-{run_id}-1"})
    monkeypatch.setenv(PLAN_ENV, str(plan_file))
    monkeypatch.setenv(LAUNCH_ENV, f"{run_id}-1-{EXPERIMENT}")
    monkeypatch.delenv(LAUNCH_NONCE_ENV, raising=False)
    monkeypatch.setenv("PIPELINE_MLFLOW_EXPERIMENT", job_experiment)
    if kill_after is None:
        monkeypatch.delenv("TRAINER_FAULT_SIGKILL_AT_STEP", raising=False)
    else:
        monkeypatch.setenv("TRAINER_FAULT_SIGKILL_AT_STEP", str(kill_after))
    rec = Recorder()
    failure = None
    try:
        ExperimentFlow(repo, RunOptions(tracking_uri=uri, smoke=False, sha=sha, pr=7), rec).run(
            repo / "experiments" / f"{EXPERIMENT}.yaml")
    except Exception as exc:  # noqa: BLE001 - the killed launch fails; the test says how
        failure = exc
    return rec, plan.experiments[0].facts, failure


def test_a_lost_runners_launch_resumes_from_its_own_checkpoint_and_never_a_planted_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    repo, sha = _checkout(tmp_path / "repo")
    shared = tmp_path / "shared"
    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(shared / "runs"))
    monkeypatch.setenv("PIPELINE_DATA_CACHE", str(shared / "cache"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    # 1. The runner is lost after step 6: the checkpoint of step 4 is published and recorded.
    _, facts, failure = _launch(repo, sha, uri, 501, tmp_path, monkeypatch, kill_after=6)
    assert failure is not None and "resume" not in facts
    client = MlflowClient(tracking_uri=uri)
    (lost,) = client.search_runs([client.get_experiment_by_name(f"{EXPERIMENT}/job-501-1").experiment_id])
    point = json.loads(lost.data.tags["pipeline.checkpoint"])
    assert point["step"] == 4 and lost.info.status != "FINISHED"
    assert Path(point["path"]).is_relative_to(shared / "runs" / f"launch-501-1-{EXPERIMENT}")

    # 2. The next /train: the trusted plan names that checkpoint; the flow verifies and resumes.
    rec, facts, failure = _launch(repo, sha, uri, 502, tmp_path, monkeypatch)
    assert failure is None, failure
    planned = facts["resume"]["candidate"]["1234"]
    assert planned["manifest_sha256"] == point["manifest_sha256"] and planned["run_id"] == lost.info.run_id
    assert [e for e in rec.events if e[2] == "resumed"], rec.events
    (seed_dir,) = (shared / "runs" / f"launch-502-1-{EXPERIMENT}").glob("*/*/*/train/seed-1234")
    done = read_json(seed_dir / "result.json")
    assert done["status"] == "finished" and done["resumed_from"].endswith("step_000004"), done

    # 3. The recorded checkpoint rewritten on the shared storage (weights and manifest together):
    # not what launch 501 recorded, so launch 503 trains from the start and says why.
    from trainer.checkpoint.format import write_manifest

    planted = Path(point["path"])
    weights = planted / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(8)
    weights.write_bytes(bytes(data))
    write_manifest(planted, 4)
    (exp,) = [e for e in client.search_experiments() if e.name == f"{EXPERIMENT}/job-502-1"]
    for run in client.search_runs([exp.experiment_id]):  # 502 finished: only 501's point is left
        assert run.info.status == "FINISHED"
    rec, facts, failure = _launch(repo, sha, uri, 503, tmp_path, monkeypatch)
    assert failure is None, failure
    assert facts["resume"]["candidate"]["1234"]["manifest_sha256"] == point["manifest_sha256"]
    refused = [e for e in rec.events if e[2] == "warning" and "not resuming" in e[3]]
    assert refused and "not the one that launch recorded" in refused[0][3], rec.events
    (seed_dir,) = (shared / "runs" / f"launch-503-1-{EXPERIMENT}").glob("*/*/*/train/seed-1234")
    assert read_json(seed_dir / "result.json").get("resumed_from") in (None, "")
