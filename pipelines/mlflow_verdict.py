"""The verdict's MLflow side: what a candidate is judged against when its baseline is `champion`
(the promoted model's training run, `champion_records`), and the tags the verdict leaves on the
candidate's runs for promotion (`tag_verdict`).

MLflow is best effort here: when the server does not answer (`mlflow_client` is None), the
report is still written from the run directories and nothing is tagged.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from basics.files import read_json
from validation.spec import CHAMPION, ExperimentSpec

if TYPE_CHECKING:
    from reports.records import RunRecord


def mlflow_client(tracking_uri: str) -> Any:
    """A client for the tracking store, or None when it cannot be reached (the report still
    gets written; MLflow gets it on the next run)."""
    from trainer.mlflow_endpoint import reachable_client

    # Bounded (trainer.mlflow_endpoint.MLFLOW_HTTP_POLICY) and remembered: a dead server costs one
    # short attempt for the whole report stage, not minutes per lookup.
    return reachable_client(tracking_uri)


def champion_records(spec: ExperimentSpec, tracking_uri: str) -> list[RunRecord]:
    """The promoted model's training run (registry alias `champion`) as the baseline, when
    the hypothesis names `champion` and the registry has one; [] otherwise (the report then
    says there is no baseline run)."""
    if spec.hypothesis.baseline != CHAMPION:
        return []
    client = mlflow_client(tracking_uri)
    if client is None:
        return []
    from reports.records import records_from_mlflow

    name = os.environ.get("PIPELINE_REGISTRY_MODEL", "gitops-train")
    try:
        version = client.get_model_version_by_alias(name, CHAMPION)
        # The version belongs to its attestation run; the metrics live in the training run.
        run_id = (version.tags or {}).get("pipeline.training_run_id") or version.run_id
        run = client.get_run(run_id)
        experiment = client.get_experiment(run.info.experiment_id).name
        return records_from_mlflow(client, experiment, f"attributes.run_id = '{run_id}'")
    except Exception:  # no registered model or alias yet: nothing to compare against
        return []


def tag_verdict(experiment: str, seed_dirs: Sequence[Path], outcome: str | None, *, tracking_uri: str,
                pr: int | None) -> None:
    """Record the verdict on every MLflow run `experiment` trained: promotion reads it from there."""
    client = mlflow_client(tracking_uri)
    if client is None or outcome is None:
        return
    for d in seed_dirs:
        run_id = (read_json(d / "result.json") or {}).get("mlflow_run_id")
        # Only runs the candidate trained: a run reused from another experiment with the same
        # identity (its baseline, in an A/A case) must not carry the candidate's verdict.
        trained_for = (read_json(d / "identity.json") or {}).get("experiment")
        if run_id and trained_for in (None, experiment):
            try:
                client.set_tag(run_id, "pipeline.verdict", str(outcome))
                # Provenance for promotion (pipelines/trusted/promote.py): the PR and the
                # train workflow's run, which promotion checks against the GitHub API.
                if pr:
                    client.set_tag(run_id, "pipeline.pr", str(pr))
                if os.environ.get("GITHUB_ACTIONS") == "true" and os.environ.get("GITHUB_RUN_ID", "").isdigit():
                    client.set_tag(run_id, "pipeline.github_run_id", os.environ["GITHUB_RUN_ID"])
            except Exception:  # best effort, see mlflow_client
                pass
