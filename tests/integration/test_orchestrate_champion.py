"""`baseline: champion`: the promoted model's training run (registry alias) is the baseline."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.mlflow_verdict import champion_records
from validation.spec import ExperimentSpec


def _spec(baseline: str) -> ExperimentSpec:
    return ExperimentSpec.model_validate({
        "name": "cand", "owner": "octocat",
        "hypothesis": {"statement": "The candidate lowers held-out loss against the promoted champion.",
                       "metric": "eval/loss", "direction": "decrease", "min_effect": 0.01, "baseline": baseline},
        "model": {"model_type": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "vocab_size": 512},
        "data": {"sources": [{"name": "code", "path": "data/demo/code.jsonl", "weight": 1.0}]},
        "train": {"max_steps": 10},
    })


def test_champion_run_becomes_the_baseline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("PIPELINE_REGISTRY_MODEL", "lab-model")
    client = MlflowClient(tracking_uri=uri)
    assert champion_records(_spec("champion"), uri) == []  # no registered model yet

    exp = client.create_experiment("old-winner")
    run = client.create_run(exp, tags={"pipeline.seed": "1234", "pipeline.experiment": "old-winner"})
    client.log_metric(run.info.run_id, "eval/loss", 5.0, step=10)
    client.set_terminated(run.info.run_id)
    client.create_registered_model("lab-model")
    version = client.create_model_version("lab-model", source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id)
    client.set_registered_model_alias("lab-model", "champion", version.version)

    (record,) = champion_records(_spec("champion"), uri)
    assert record.run_id == run.info.run_id and record.seed == 1234
    assert record.final_metrics["eval/loss"] == 5.0
    assert champion_records(_spec("some-base"), uri) == []  # only for `champion`
