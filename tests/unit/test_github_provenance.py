"""Trusted provenance, the pure check: `check_training_run` lists every way a training run's
tags fail to match the experiment, SHA and workflow run it claims (the trust boundary itself
runs against a real auth-enabled MLflow server in tests/integration/test_github_provenance.py).
"""

from __future__ import annotations

from pipelines.trusted.provenance import check_training_run
from tests.infra.github_emulator import SHA_A, SHA_B


def test_check_training_run_lists_every_problem() -> None:
    tags = {"pipeline.git_sha": SHA_B, "pipeline.dirty": "true", "pipeline.github_run_id": "1"}
    problems = check_training_run(run_id="r", experiment_name="x", tags=tags, experiment="y", sha=SHA_A,
                                  workflow_run_id=2)
    assert len(problems) == 4
    assert check_training_run(run_id="r", experiment_name="y/job-2-1", tags={"pipeline.git_sha": SHA_A,
                              "pipeline.github_run_id": "2"}, experiment="y", sha=SHA_A, workflow_run_id=2) == []
