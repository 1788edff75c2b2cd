"""The train job's first step and the one experiment-file rule (issue 19 items 2 and 7).

`.github/scripts/train_gate.py head` runs as the workflow runs it (a subprocess, standard
library only) against the GitHub emulator: `/train` approved C1, the writer pushed C2 while
the job waited for the environment's reviewers: nothing trains, the output says why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.github.chatops import experiment_file
from tests.infra.github_emulator import REPO, SHA_A, SHA_B, GitHubEmulator, emulated_repo

SCRIPT = Path(__file__).resolve().parents[2] / ".github" / "scripts" / "train_gate.py"


@pytest.fixture
def gh() -> Iterator[GitHubEmulator]:
    with GitHubEmulator() as emulator:
        yield emulator


def gate(gh: GitHubEmulator, tmp: Path, pr: int, approved: str) -> tuple[int, str, dict[str, str], str]:
    out, summary = tmp / "output", tmp / "summary"
    out.write_text(""), summary.write_text("")
    env = {"PATH": os.environ["PATH"], "GITHUB_API_URL": gh.base_url, "GITHUB_REPOSITORY": REPO,
           "GITHUB_TOKEN": gh.token, "PR_NUMBER": str(pr), "HEAD_SHA": approved,
           "GITHUB_OUTPUT": str(out), "GITHUB_STEP_SUMMARY": str(summary)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "head"], env=env, capture_output=True, text=True, timeout=60)
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    return proc.returncode, proc.stdout, outputs, summary.read_text()


def test_a_push_after_train_stops_the_training_before_any_pr_code(gh: GitHubEmulator, tmp_path: Path) -> None:
    n = emulated_repo(gh, head_sha=SHA_A)
    rc, _, outputs, summary = gate(gh, tmp_path, n, SHA_A)
    assert rc == 0 and outputs == {"fresh": "true", "head": SHA_A}
    assert f"Training commit `{SHA_A}`" in summary
    gh.push(REPO, n, SHA_B)  # force-pushed while the job waited for the environment approval
    rc, stdout, outputs, summary = gate(gh, tmp_path, n, SHA_A)
    assert rc == 1 and outputs == {"fresh": "false", "head": SHA_B}
    assert "::error::not training" in stdout and SHA_B[:12] in stdout
    assert "Not trained" in summary and SHA_B in summary


def test_malformed_inputs_never_pass(gh: GitHubEmulator, tmp_path: Path) -> None:
    n = emulated_repo(gh, head_sha=SHA_A)
    rc, _, outputs, _ = gate(gh, tmp_path, n, "not-a-sha")
    assert rc == 1 and outputs["fresh"] == "false"


def _gate_file(root: Path, name: str) -> str | None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "experiment-file", str(root), name], capture_output=True,
                          text=True, timeout=60, env={"PATH": os.environ["PATH"]})
    return proc.stdout.strip() if proc.returncode == 0 else None


@pytest.mark.parametrize("layout,expected", [
    ({"exp-a.yaml": "x"}, "experiments/exp-a.yaml"),
    ({"exp-a.yml": "x"}, "experiments/exp-a.yml"),
    ({"exp-a.yaml": "x", "exp-a.yml": "x"}, None),  # ambiguous
    ({"exp-a.yaml": "->other.yaml", "other.yaml": "x"}, None),  # a symlink
    ({}, None),
])
def test_one_experiment_file_rule_in_every_job(tmp_path: Path, layout: dict[str, str], expected: str | None) -> None:
    """The API re-check (chatops), the capacity job and the train job (train_gate.py) agree."""
    exp = tmp_path / "experiments"
    exp.mkdir()
    for name, content in layout.items():
        if content.startswith("->"):
            (exp / name).symlink_to(exp / content[2:])
        else:
            (exp / name).write_text(content)
    found = experiment_file(tmp_path, "exp-a")
    assert (None if found is None else found.relative_to(tmp_path).as_posix()) == expected
    assert _gate_file(tmp_path, "exp-a") == expected


def test_a_symlinked_experiments_folder_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    (real / "exp-a.yaml").write_text("x")
    (tmp_path / "experiments").symlink_to(real)
    assert experiment_file(tmp_path, "exp-a") is None and _gate_file(tmp_path, "exp-a") is None


def test_train_on_c1_push_c2_approve_nothing_trains(gh: GitHubEmulator, tmp_path: Path) -> None:
    """The whole sequence at the component level: `/train` on C1 is accepted and the sticky
    comment names C1 (what the environment reviewer approves); C2 is pushed; the train job's
    first step refuses before any PR code."""
    from pipelines.github.chatops import handle_event
    from pipelines.github.client import PyGithubHost
    from pipelines.github.comment import StickyComment
    from pipelines.github.events import CommentEvent
    from tests.infra.github_emulator import emulator_config

    n = emulated_repo(gh, head_sha=SHA_A)
    host = PyGithubHost(emulator_config(gh))
    StickyComment.for_experiment(host, n, "rope-theta", author=gh.bot_login).upsert(
        "## awaiting /train", {"validated_sha": SHA_A}, head_sha=SHA_A)
    event = CommentEvent(action="created", comment_id=77, body="/train", author="erin", author_association="MEMBER",
                         issue_number=n, is_pull_request=True, repo=REPO, sender="erin")
    decision = handle_event(event, host, bot_login=gh.bot_login)
    assert decision.action == "launch" and decision.sha == SHA_A
    (sticky,) = gh.comments(REPO, n)
    assert f"training commit `{SHA_A}`" in sticky["body"]
    gh.push(REPO, n, SHA_B)
    rc, stdout, outputs, _ = gate(gh, tmp_path, n, decision.sha)
    assert rc == 1 and outputs["fresh"] == "false" and outputs["head"] == SHA_B
