"""Self-hosted runner tooling: capacity (pure), pruning by observed offline time (pure),
and list / token / prune through PyGithub against the emulator and the CLI."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from github_emulator import REPO, GitHubEmulator, emulated_repo, emulator_config
from typer.testing import CliRunner

from pipelines.github.client import PyGithubHost, Runner
from pipelines.github.runners import capacity, parse_duration, prune, runner_labels, stale_runners
from validation.errors import UsageError


def runner(i: int, labels: tuple[str, ...], status: str = "online", busy: bool = False) -> Runner:
    return Runner(id=i, name=f"gpu-{i}", status=status, busy=busy, labels=("self-hosted", "Linux", *labels))


@pytest.mark.unit
def test_capacity_says_what_it_is_waiting_for() -> None:
    runners = [runner(1, ("gpu", "h100"), busy=True), runner(2, ("gpu", "a100")), runner(3, ("gpu", "h100"), "offline")]
    result = capacity(runners, ["gpu", "h100"], nodes=2)
    assert not result.ok
    assert result.message == "waiting for 2 runners labelled gpu,h100: 1 online, busy; 1 offline"
    assert capacity(runners, ["gpu", "a100"], nodes=1).ok
    assert capacity([], ["gpu", "h100"], 1).message == "waiting for 1 runner labelled gpu,h100: 0 online"


@pytest.mark.unit
def test_runner_labels_from_the_spec_resources() -> None:
    assert runner_labels("h100", 8) == ("gpu", "h100")
    assert runner_labels("cpu", 0) == ("cpu",)


@pytest.mark.unit
def test_stale_runners_are_those_seen_offline_long_enough() -> None:
    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    runners = [runner(1, ("gpu",), "offline"), runner(2, ("gpu",), "offline"), runner(3, ("gpu",))]
    seen = {"1": (now - timedelta(hours=30)).isoformat(), "3": (now - timedelta(hours=99)).isoformat()}
    remove, new_seen = stale_runners(runners, seen, now, timedelta(hours=24))
    assert [r.id for r in remove] == [1]
    assert set(new_seen) == {"1", "2"}  # 3 came back online: forgotten; 2 first seen now


@pytest.mark.unit
def test_durations() -> None:
    assert parse_duration("24h") == timedelta(hours=24) and parse_duration("2d") == timedelta(days=2)
    with pytest.raises(UsageError):
        parse_duration("yesterday")


@pytest.fixture
def gh() -> Iterator[GitHubEmulator]:
    with GitHubEmulator() as emulator:
        yield emulator


@pytest.mark.integration
def test_list_token_and_prune_through_pygithub(gh: GitHubEmulator, tmp_path: Path) -> None:
    emulated_repo(gh)
    gh.add_runner(REPO, name="gpu-a", labels=["gpu", "h100"], busy=True)
    dead = gh.add_runner(REPO, name="gpu-b", labels=["gpu", "h100"], status="offline")
    host = PyGithubHost(emulator_config(gh))
    listed = host.runners()
    assert [(r.name, r.status, r.busy) for r in listed] == [("gpu-a", "online", True), ("gpu-b", "offline", False)]
    assert "h100" in listed[0].labels
    token, expires = host.registration_token()
    assert token in gh.registration_tokens and expires
    state = tmp_path / "state.json"
    now = datetime.now(UTC)
    assert prune(host, state, timedelta(hours=24), now=now) == []  # first sighting offline
    removed = prune(host, state, timedelta(hours=24), now=now + timedelta(hours=25))
    assert [r.id for r in removed] == [dead["id"]]
    assert [r.name for r in host.runners()] == ["gpu-a"]


@pytest.mark.integration
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
    token = cli.invoke(app, ["runners", "token"], env=env)
    assert token.exit_code == 0 and f"::add-mask::{gh.registration_tokens[0]}" in token.output
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


SCRIPT = Path(__file__).resolve().parents[1] / "pipelines" / "github" / "ephemeral-runner.sh"


@pytest.mark.integration
def test_ephemeral_runner_script_registers_with_a_fresh_token(gh: GitHubEmulator, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    emulated_repo(gh)
    runner_dir = tmp_path / "actions-runner"
    runner_dir.mkdir()
    (runner_dir / "config.sh").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > config.args\n')
    (runner_dir / "run.sh").write_text("#!/bin/sh\necho ran one job\n")
    for f in runner_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "GITHUB_TOKEN": gh.token, "GITHUB_API_URL": gh.base_url, "GITHUB_REPOSITORY": REPO,
           "RUNNER_DIR": str(runner_dir), "RUNNER_NAME": "node-1", "PIPELINE": str(Path(sys.executable).parent / "pipeline"),
           "PIPELINE_GITHUB_SECONDS_BETWEEN_WRITES": "0"}
    done = subprocess.run([str(SCRIPT), "gpu,h100"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ran one job" in done.stdout and gh.registration_tokens[0] not in done.stdout + done.stderr
    args = (runner_dir / "config.args").read_text().split("\n")
    assert "--ephemeral" in args and args[args.index("--token") + 1] == gh.registration_tokens[0]
    assert args[args.index("--labels") + 1] == "gpu,h100"
    bad = subprocess.run([str(SCRIPT), "gpu;reboot"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "labels must be" in bad.stderr
