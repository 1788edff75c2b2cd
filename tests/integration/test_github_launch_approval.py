"""The train job's approval check (issue 28), run as the workflow runs it (a subprocess,
standard library only) against the GitHub emulator: GitHub's "prevent self-review" stops only
the `/train` commenter, so a PR author who is a `gpu-training` reviewer could approve their own
code once another writer comments `/train`. The check stops that run before any PR code."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.infra.github_emulator import REPO, GitHubEmulator, emulated_repo

SCRIPT = Path(__file__).resolve().parents[2] / ".github" / "scripts" / "launch_approval.py"
TRAIN = ".github/workflows/experiment-train.yml"


@pytest.fixture
def gh() -> Iterator[GitHubEmulator]:
    with GitHubEmulator() as emulator:
        yield emulator


def check(gh: GitHubEmulator, pr: int, run_id: int) -> tuple[int, str]:
    env = {"PATH": os.environ["PATH"], "GITHUB_API_URL": gh.base_url, "GITHUB_REPOSITORY": REPO,
           "GITHUB_TOKEN": gh.token, "PR_NUMBER": str(pr), "GITHUB_RUN_ID": str(run_id)}
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_authors_own_approval_stops_the_training(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh, author="dana")
    gh.add_workflow_run(REPO, 31, path=TRAIN, event="issue_comment", status="in_progress", conclusion=None)
    gh.add_approval(REPO, 31, user="dana")  # erin commented /train; dana approved her own PR
    rc, out = check(gh, n, 31)
    assert rc == 1 and "::error::not training" in out and "dana" in out
    gh.add_workflow_run(REPO, 32, path=TRAIN, event="issue_comment", status="in_progress", conclusion=None)
    gh.add_approval(REPO, 32, user="mia")
    gh.add_approval(REPO, 32, user="dana", environments=("runner-status",))  # another environment
    rc, out = check(gh, n, 32)
    assert rc == 0 and "approved by mia" in out
