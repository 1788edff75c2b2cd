"""`/cancel` through the Actions API (issue 28), against the GitHub emulator through PyGithub:
only the trusted run (the default branch's train workflow, from a comment or a dispatch) that
trains the PR's experiment is cancelled; a run of a branch's copy of the workflow with a
look-alike job, another PR's training and finished runs are left alone. No concurrency group
is involved, so no other workflow run can cancel a training by joining one."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.infra.github_emulator import REPO, GitHubEmulator, emulated_repo

TRAIN = ".github/workflows/experiment-train.yml"


@pytest.fixture
def gh() -> Iterator[GitHubEmulator]:
    with GitHubEmulator() as emulator:
        yield emulator


def test_cancel_training_cancels_only_the_prs_trusted_training(gh: GitHubEmulator, tmp_path: Path) -> None:
    from pipelines.cli import app

    n = emulated_repo(gh)
    gh.add_workflow_run(REPO, 11, path=TRAIN, event="issue_comment", status="in_progress", conclusion=None)
    gh.add_job(REPO, 11, "authorize")
    gh.add_job(REPO, 11, f"train #{n} rope-theta")
    gh.add_workflow_run(REPO, 12, path=TRAIN, event="pull_request", status="in_progress", conclusion=None,
                        head_branch="attacker")
    gh.add_job(REPO, 12, f"train #{n} rope-theta")
    gh.add_workflow_run(REPO, 13, path=TRAIN, event="issue_comment", status="queued", conclusion=None)
    gh.add_job(REPO, 13, f"train #{n + 1} rope-theta", status="queued")
    gh.add_workflow_run(REPO, 14, path=TRAIN, event="issue_comment")  # completed
    gh.add_job(REPO, 14, f"train #{n} rope-theta", status="completed", conclusion="success")
    summary = tmp_path / "summary.md"
    env = {"GITHUB_TOKEN": gh.token, "GITHUB_API_URL": gh.base_url, "GITHUB_REPOSITORY": REPO,
           "GITHUB_RUN_ID": "20", "GITHUB_STEP_SUMMARY": str(summary),
           "PIPELINE_GITHUB_SECONDS_BETWEEN_REQUESTS": "0", "PIPELINE_GITHUB_SECONDS_BETWEEN_WRITES": "0"}
    result = CliRunner().invoke(app, ["cancel-training", "--pr", str(n), "--experiments", json.dumps(["rope-theta"])],
                                env={**os.environ, **env})
    assert result.exit_code == 0, result.output
    runs = gh.repos[REPO].workflow_runs
    assert runs[11]["conclusion"] == "cancelled"
    assert runs[12]["status"] == "in_progress" and runs[13]["status"] == "queued" and runs[14]["conclusion"] == "success"
    assert [p for _, p, _ in gh.requests_made("POST", r"/cancel$")] == [f"/repos/{REPO}/actions/runs/11/cancel"]
    assert "cancelled workflow run 11" in summary.read_text()
    again = CliRunner().invoke(app, ["cancel-training", "--pr", str(n), "--experiments", '["rope-theta"]'],
                               env={**os.environ, **env})
    assert again.exit_code == 0 and "no unfinished training" in again.output
    bad = CliRunner().invoke(app, ["cancel-training", "--pr", str(n), "--experiments", "rope-theta; rm -rf /"],
                             env={**os.environ, **env})
    assert bad.exit_code == 2 and "JSON list" in bad.output
