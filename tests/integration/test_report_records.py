"""Records from a real MLflow store (MLflow's own client on sqlite) -> report files, logged
back to the candidate's run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reports import build_report
from tests.infra.report_runs import SPEC


def test_records_from_a_real_mlflow_store_and_report_files_logged_back(tmp_path, monkeypatch):
    """MLflow's own client on a sqlite store (the laptop default); no mocks."""
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    from reports import records_from_mlflow

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = {}
    for name, final in (("higher-lr", 3.0), ("base", 3.2)):
        exp_id = client.create_experiment(name, artifact_location=(tmp_path / "artifacts" / name).as_uri())
        for seed in (1, 2):
            run = client.create_run(exp_id)
            value = final + seed / 100
            client.log_batch(
                run.info.run_id,
                metrics=[Metric("train/loss", value + 2 / s, 0, s) for s in range(1, 21)]
                + [Metric("eval/loss", value, 0, 20), Metric("perf/tokens_per_s", 4000.0, 0, 20)],
                params=[Param("train.lr", "0.006" if name == "higher-lr" else "0.003"), Param("train.seed", str(seed))],
                tags=[RunTag("pipeline.seed", str(seed)), RunTag("pipeline.trainer_version", "t1"),
                      RunTag("pipeline.data_version", "d1"), RunTag("env.torch", "2.13.0" if name == "base" else "2.14.0"),
                      RunTag("env.hostname", f"host-{seed}"), RunTag("alert.loss_rise", "P1 step 12: loss rose for 50 steps"),
                      RunTag("pipeline.hypothesis_registered", json.dumps(
                          {k: SPEC["hypothesis"].get(k, 0.05) for k in ("metric", "direction", "min_effect", "alpha",
                                                                          "seeds", "baseline")}))],
            )
            client.set_terminated(run.info.run_id)
            runs[(name, seed)] = run.info.run_id

    cands = records_from_mlflow(client, "higher-lr", public_url="https://mlflow.example.internal")
    bases = records_from_mlflow(client, "base")
    assert records_from_mlflow(client, "no-such-experiment") == []
    assert sorted(r.seed for r in cands) == [1, 2] and all(r.status == "finished" for r in cands)
    first = next(r for r in cands if r.seed == 1)
    assert first.final_metrics["eval/loss"] == pytest.approx(3.01)
    assert [s for s, _ in first.history["train/loss"]] == list(range(1, 21))
    assert first.params["train.lr"] == 0.006 and first.tags["trainer_version"] == "t1"
    assert first.mlflow_url.startswith("https://mlflow.example.internal/#/experiments/")
    assert first.env == {"torch": "2.14.0"}  # the host name does not make runs incomparable
    assert (first.alerts[0].level, first.alerts[0].kind, first.alerts[0].step) == ("P1", "loss_rise", 12)
    assert first.registrations["higher-lr"]["hypothesis"]["direction"] == "decrease"  # preregistered at start

    built = build_report(cands, bases, hypothesis=SPEC["hypothesis"], out_dir=tmp_path / "report", mlflow_client=client)
    assert built.verdict.outcome == "supported", built.verdict.reason  # 2 seeds, -6.2 % each
    assert "torch: 2.14.0 vs 2.13.0" in built.markdown and not built.report.hypothesis_changes
    logged = {Path(a.path).name for a in client.list_artifacts(built.report.candidates[0].mlflow_run_id, "report")}
    assert {"report.md", "train_loss.png"} <= logged
