"""Self-hosted runner tooling through PyGithub against the emulator: list / token / prune, the
`pipeline runners` CLI, and the just-in-time runner scripts."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipelines.github.client import PyGithubHost
from pipelines.github.runners import prune
from tests.infra.github_emulator import REPO, GitHubEmulator, emulated_repo, emulator_config


@pytest.fixture
def gh() -> Iterator[GitHubEmulator]:
    with GitHubEmulator() as emulator:
        yield emulator


def test_list_and_prune_through_pygithub(gh: GitHubEmulator, tmp_path: Path) -> None:
    emulated_repo(gh)
    gh.add_runner(REPO, name="gpu-a", labels=["gpu", "h100"], busy=True)
    dead = gh.add_runner(REPO, name="gpu-b", labels=["gpu", "h100"], status="offline")
    host = PyGithubHost(emulator_config(gh))
    listed = host.runners()
    assert [(r.name, r.status, r.busy) for r in listed] == [("gpu-a", "online", True), ("gpu-b", "offline", False)]
    assert "h100" in listed[0].labels
    assert not hasattr(host, "registration_token")  # issue 28: no repository-level registration tokens
    state = tmp_path / "state.json"
    now = datetime.now(UTC)
    assert prune(host, state, timedelta(hours=24), now=now) == []  # first sighting offline
    removed = prune(host, state, timedelta(hours=24), now=now + timedelta(hours=25))
    assert [r.id for r in removed] == [dead["id"]]
    assert [r.name for r in host.runners()] == ["gpu-a"]


def test_runner_commands(gh: GitHubEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.cli import app

    n = emulated_repo(gh)
    gh.add_runner(REPO, name="gpu-a", labels=["gpu", "h100"], busy=True)
    env = {"GITHUB_TOKEN": gh.token, "GITHUB_API_URL": gh.base_url, "GITHUB_REPOSITORY": REPO,
           "PIPELINE_GITHUB_SECONDS_BETWEEN_REQUESTS": "0", "PIPELINE_GITHUB_SECONDS_BETWEEN_WRITES": "0",
           "GITHUB_ACTIONS": "true"}
    cli = CliRunner()
    listed = cli.invoke(app, ["runners", "list"], env=env)
    assert listed.exit_code == 0 and "gpu-a" in listed.output and "busy" in listed.output
    # Issue 28: a repository-level runner cannot be limited to a workflow, so no registration
    # token is minted for one: the command says what to use instead and asks GitHub nothing.
    token = cli.invoke(app, ["runners", "token"], env=env)
    assert token.exit_code == 2 and "pipeline runners jit" in token.output and "Traceback" not in token.output
    assert not gh.registration_tokens and not gh.requests_made("POST", r"registration-token")
    cap = cli.invoke(app, ["runners", "capacity", "--labels", "gpu,h100", "--nodes", "2", "--pr", str(n),
                           "--experiment", "rope-theta"], env=env)
    assert cap.exit_code == 0 and "waiting for 2 runners labelled gpu,h100: 1 online, busy" in cap.output
    (sticky,) = gh.comments(REPO, n)
    assert "waiting for 2 runners" in sticky["body"]
    pruned = cli.invoke(app, ["runners", "prune", "--offline-for", "1h", "--state-file", str(tmp_path / "s.json")], env=env)
    assert pruned.exit_code == 0 and "removed 0 runner(s)" in pruned.output
    bad = cli.invoke(app, ["runners", "list"], env={**env, "GITHUB_TOKEN": "wrong"})
    assert bad.exit_code == 8 and "bad credentials" in bad.output
    # A separate runners token lists runners; the comment token stays the workflow's own.
    split = cli.invoke(app, ["runners", "list"], env={**env, "GITHUB_TOKEN": "wrong", "GITHUB_RUNNERS_TOKEN": gh.token})
    assert split.exit_code == 0 and "gpu-a" in split.output


ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "pipelines" / "github" / "ephemeral-runner.sh"
REGISTER = ROOT / "scripts" / "register-runner.sh"
GATE = f"{REPO}/.github/workflows/experiment-train.yml@refs/heads/main"


def _fake_runner(tmp_path: Path) -> Path:
    """A stand-in for the actions/runner release: run.sh records what the job would see."""
    runner_dir = tmp_path / "actions-runner"
    runner_dir.mkdir()
    (runner_dir / "run.sh").write_text(
        '#!/bin/sh\n{ echo "args=$*"; echo "jit=$ACTIONS_RUNNER_INPUT_JITCONFIG"; echo "home=$HOME"; '
        'echo "tmp=$TMPDIR"; echo "pip=$PIP_CACHE_DIR"; echo "token=${GITHUB_TOKEN:-}${GITHUB_RUNNERS_TOKEN:-}"; '
        'echo "pwd=$(pwd)"; } > "$RECORD"\necho left-behind > "$HOME/state"\necho ran one job\n')
    (runner_dir / "run.sh").chmod(0o755)
    return runner_dir


def test_a_jit_runner_takes_one_job_in_fresh_folders_without_a_registration_token(gh: GitHubEmulator,
                                                                                   tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    emulated_repo(gh)
    gid = gh.add_runner_group("acme", "gpu-pool", restricted_to_workflows=True, selected_workflows=[GATE])
    gh.add_runner_group("acme", "Default", default=True)
    _fake_runner(tmp_path).rename(tmp_path / "runner-release")  # read only: copied per job
    record, scratch = tmp_path / "record", tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "GITHUB_RUNNERS_TOKEN": gh.token, "GITHUB_API_URL": gh.base_url, "GITHUB_REPOSITORY": REPO,
           "RUNNER_ORG": "acme", "RUNNER_GROUP": "gpu-pool", "RUNNER_NAME": "node-1", "RECORD": str(record),
           "PIPELINE": str(Path(sys.executable).parent / "pipeline"), "HOME": str(tmp_path),
           "PIPELINE_GITHUB_SECONDS_BETWEEN_WRITES": "0", "SLURM_TMPDIR": str(scratch)}
    env.pop("GITHUB_TOKEN", None)
    done = subprocess.run([str(REGISTER), "--org", "acme", "--group", "gpu-pool", "--labels", "gpu,h100",
                           "--repo", REPO, "--name", "node-1", "--runner-dir", str(tmp_path / "runner-release"),
                           "--scratch", str(scratch)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = dict(line.split("=", 1) for line in record.read_text().splitlines())
    (body,) = gh.jit_requests
    assert body == {"name": "node-1", "runner_group_id": gid, "labels": ["self-hosted", "gpu", "h100"],
                    "work_folder": "_work"}
    assert seen["jit"].startswith("eyJ") and seen["args"] == ""  # the config in the environment, never argv
    assert seen["jit"] not in done.stdout + done.stderr and seen["token"] == ""
    assert not gh.registration_tokens  # no registration token was ever minted
    for key in ("home", "tmp", "pip", "pwd"):
        assert seen[key].startswith(str(scratch)), (key, seen[key])
    assert list(scratch.iterdir()) == []  # the job's folders (and what it left in HOME) are gone
    assert not (tmp_path / "runner-release" / "state").exists()


def test_no_runner_in_a_group_any_workflow_can_use(gh: GitHubEmulator, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pipelines.cli import app

    emulated_repo(gh)
    gh.add_runner_group("acme", "open-pool")  # not restricted to workflows
    env = {"GITHUB_TOKEN": gh.token, "GITHUB_API_URL": gh.base_url, "GITHUB_REPOSITORY": REPO,
           "PIPELINE_GITHUB_SECONDS_BETWEEN_WRITES": "0", "PIPELINE_GITHUB_SECONDS_BETWEEN_REQUESTS": "0"}
    out = tmp_path / "jit"
    result = CliRunner().invoke(app, ["runners", "jit", "--org", "acme", "--group", "open-pool", "--labels", "gpu",
                                      "--out", str(out)], env=env)
    assert result.exit_code != 0 and "not restricted to selected workflows" in result.output
    assert gh.jit_requests == [] and not out.exists()


def test_the_scripts_refuse_reuse_and_registration_tokens(tmp_path: Path) -> None:
    import subprocess

    for bad, why in ((["--loop"], "refused"), (["--token", "x"], "not used")):
        done = subprocess.run([str(REGISTER), *bad], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and why in done.stderr
    text = REGISTER.read_text() + SCRIPT.read_text()
    assert "config.sh" not in text and "registration-token" not in text and "runners token" not in text
