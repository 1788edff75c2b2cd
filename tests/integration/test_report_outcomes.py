"""Outcomes beyond the t-test: the verdict tag goes only on the MLflow runs the candidate
trained, never on a run it reused.

Run directories are written in the trainer's format by `tests/infra/report_runs.write_run`.
"""

from __future__ import annotations

import json

from tests.infra.report_runs import write_run


def test_the_verdict_tag_goes_only_on_runs_the_candidate_trained(tmp_path):
    """A candidate that reuses another experiment's run (same identity) must not tag it."""
    from mlflow.tracking import MlflowClient

    from pipelines.mlflow_verdict import tag_verdict

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    seed_dirs = []
    for name in ("base", "higher-lr"):
        exp = client.create_experiment(name)
        run = client.create_run(exp)
        d = write_run(tmp_path / "runs", name, 1, final_loss=3.0, lr=6e-3, check_ok=None)
        result = json.loads((d / "result.json").read_text())
        (d / "result.json").write_text(json.dumps({**result, "mlflow_run_id": run.info.run_id}))
        seed_dirs.append(d)
    tag_verdict("higher-lr", seed_dirs, "supported", tracking_uri=uri, pr=None)
    tags = {d.parent.parent.name: client.get_run(json.loads((d / "result.json").read_text())["mlflow_run_id"]).data.tags
            for d in seed_dirs}
    assert tags["higher-lr"].get("pipeline.verdict") == "supported"
    assert "pipeline.verdict" not in tags["base"]
