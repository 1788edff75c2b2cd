"""Continuing a run on another layout (`pipeline train FILE --continue-from RUN_DIR`) end to end.

A 2-rank FSDP run is killed through `ExperimentFlow` (what `pipeline train` runs), continued on
one process and on two processes with TP, and the one history is compared with an
uninterrupted 2-rank run.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pytest

from tests.infra.layout_specs import FSDP2, ONE, TP2, scratch_repo, write_spec


def _losses(seed_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (seed_dir / "metrics.jsonl").read_text().splitlines()]
    keys = [(r["key"], r["step"]) for r in rows]
    assert len(keys) == len(set(keys)), "each (key, step) once"
    return {int(r["step"]): float(r["value"]) for r in rows if r["key"] == "train/loss"}


def _alerts(seed_dir: Path, kind: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (seed_dir / "alerts.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


def test_a_killed_fsdp_run_continues_on_one_process_then_on_tp_with_one_history(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2-rank FSDP killed at step 6 (checkpoint 4) -> one process (same global batch: accum 2),
    killed at step 10 (checkpoint 8) -> two processes with TP, to step 12. One metrics.jsonl,
    one MLflow run, two `resharded` events in the report; losses within 1e-6 of an
    uninterrupted 2-rank run after each reshard, bitwise before the first."""
    from mlflow.tracking import MlflowClient

    from basics.errors import TrainingError, UsageError
    from pipelines.orchestrate import ExperimentFlow, Reporter, RunOptions
    from tests.infra.corpus import demo_corpus

    repo = scratch_repo(tmp_path / "repo")
    demo_corpus(repo / "data" / "demo", 150_000)
    (tmp_path / "store").mkdir()
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"

    def flow(tracking_uri: str = uri, **kw: Any) -> ExperimentFlow:
        return ExperimentFlow(repo, RunOptions(smoke=False, tracking_uri=tracking_uri, **kw), Reporter())

    spec = write_spec(repo, FSDP2)
    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(tmp_path / "reference-runs"))
    # Its own tracking store: a finished run recorded in the shared one would be reused by
    # identity (pipelines/tracked_runs.py) instead of trained and killed below.
    reference_uri = f"sqlite:///{tmp_path / 'store' / 'reference.db'}"
    reference = _losses(flow(reference_uri).run(spec)[0].seed_dirs[0])
    assert sorted(reference) == list(range(1, 13))

    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("TRAINER_FAULT_SIGKILL_AT_STEP", "6")
    with pytest.raises(TrainingError):
        flow().run(spec)
    (killed,) = (tmp_path / "runs").glob("*/cont/*/train/seed-1234")
    mlflow_run = json.loads((killed / "mlflow_run.json").read_text())["run_id"]

    write_spec(repo, ONE | {"accum": 1})  # another global batch: refused, nothing trained
    with pytest.raises(UsageError, match=r"global batch changes .* set train.grad_accum_steps to 2"):
        flow(continue_from=killed.parent.parent).run(spec)

    write_spec(repo, ONE)
    monkeypatch.setenv("TRAINER_FAULT_SIGKILL_AT_STEP", "10")
    with pytest.raises(TrainingError):
        flow(continue_from=killed.parent.parent).run(spec)
    (one,) = (d for d in (tmp_path / "runs").glob("*/cont/*/train/seed-1234") if d != killed)
    monkeypatch.delenv("TRAINER_FAULT_SIGKILL_AT_STEP")

    write_spec(repo, TP2)
    candidate, _ = flow(continue_from=one).run(spec)
    (tp,) = candidate.seed_dirs
    result = json.loads((tp / "result.json").read_text())
    assert result["status"] == "finished" and result["resumed_from"].endswith("step_000008")
    assert result["mlflow_run_id"] == mlflow_run

    losses = _losses(tp)
    assert sorted(losses) == list(range(1, 13))
    for step in range(1, 7):  # the killed 2-rank run's own steps
        assert losses[step] == reference[step], step
    for step in range(7, 13):  # after a reshard
        assert losses[step] == pytest.approx(reference[step], abs=1e-6), step
    history = sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(mlflow_run, "train/loss"))
    assert [s for s, _ in history] == list(range(1, 13))

    events = [(a["step"], a["message"]) for a in _alerts(tp, "resharded")]
    assert events == [(4, "resharded at step 4: 2 -> 1 processes (dp 2, fsdp -> dp 1)"),
                      (8, "resharded at step 8: 1 -> 2 processes (dp 1 -> dp 1 x tp 2)")]
    report = html.unescape((candidate.report_dir / "report.md").read_text())  # type: ignore[operator]
    assert "resharded at step 4: 2 -> 1 processes" in report and "resharded at step 8: 1 -> 2 processes" in report

    identity = json.loads((tp / "identity.json").read_text())
    assert identity["continued_from"] == str(one) and identity["continued_at_step"] == 8
    assert identity["layouts"] == [{"processes": 1, "dp": 1, "tp": 1, "fsdp": False},
                                   {"processes": 2, "dp": 1, "tp": 2, "fsdp": False}]
    assert json.loads((one / "identity.json").read_text())["layouts"][0] == {"processes": 2, "dp": 2, "tp": 1,
                                                                             "fsdp": True}
    run = MlflowClient(uri).get_run(mlflow_run)
    assert run.info.status == "FINISHED" and run.data.tags["pipeline.continued_from"] == str(one)

    # The TP log line names the layout as it is: no "fsdp True" with a data-parallel degree of 1.
    log = (tp / "logs" / "rank0.log").read_text()
    assert "world 2 (dp 1 x tp 2)" in log and "fsdp True" not in log

    # Report artifacts live beside the sqlite store, not in ./mlruns of the working directory.
    exp = MlflowClient(uri).get_experiment(run.info.experiment_id)
    assert exp.artifact_location == (tmp_path / "store" / "mlruns").as_uri()

    # A run that was continued elsewhere is not resumed again: that would fork its MLflow history.
    write_spec(repo, FSDP2)
    with pytest.raises(UsageError, match=f"{killed} was continued in {one} under another layout"):
        flow().run(spec)
