"""A defect found on the way to continuing runs on another layout: report artifacts of a run
tracked in a custom sqlite store land beside that store (a real MLflow client), not in ./mlruns
of the directory the run was started from."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_a_sqlite_store_keeps_its_artifacts_beside_its_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Report artifacts of a run tracked in a custom sqlite store land beside that store, not in
    ./mlruns of whatever directory the run was started from."""
    from mlflow.tracking import MlflowClient

    from trainer.metric_sinks import MlflowSink

    db = tmp_path / "store" / "tracking.db"
    db.parent.mkdir()
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    sink = MlflowSink(f"sqlite:///{db}", "artifact-home", tmp_path / "run")
    sink.close("finished")
    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("artifact-home")
    assert exp is not None and exp.artifact_location == (db.parent / "mlruns").as_uri()
    report = tmp_path / "report.md"
    report.write_text("# report\n")
    client.log_artifact(str(sink.run_id), str(report), artifact_path="report")  # as reports.plots.log_to_mlflow
    assert not (elsewhere / "mlruns").exists()
    assert list((db.parent / "mlruns").rglob("report.md"))
