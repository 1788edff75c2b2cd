"""Self-hosted runner tooling, the pure half: capacity, runner labels, pruning by observed
offline time, durations, and which runner group is the GPU pool."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from basics.errors import UsageError
from pipelines.github.client import Runner
from pipelines.github.runners import capacity, parse_duration, runner_labels, stale_runners
from tests.infra.github_emulator import REPO


def runner(i: int, labels: tuple[str, ...], status: str = "online", busy: bool = False) -> Runner:
    return Runner(id=i, name=f"gpu-{i}", status=status, busy=busy, labels=("self-hosted", "Linux", *labels))


def test_capacity_says_what_it_is_waiting_for() -> None:
    runners = [runner(1, ("gpu", "h100"), busy=True), runner(2, ("gpu", "a100")), runner(3, ("gpu", "h100"), "offline")]
    result = capacity(runners, ["gpu", "h100"], nodes=2)
    assert not result.ok
    assert result.message == "waiting for 2 runners labelled gpu,h100: 1 online, busy; 1 offline"
    assert capacity(runners, ["gpu", "a100"], nodes=1).ok
    assert capacity([], ["gpu", "h100"], 1).message == "waiting for 1 runner labelled gpu,h100: 0 online"


def test_runner_labels_from_the_spec_resources() -> None:
    assert runner_labels("h100", 8) == ("gpu", "h100")
    assert runner_labels("cpu", 0) == ("cpu",)


def test_stale_runners_are_those_seen_offline_long_enough() -> None:
    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    runners = [runner(1, ("gpu",), "offline"), runner(2, ("gpu",), "offline"), runner(3, ("gpu",))]
    seen = {"1": (now - timedelta(hours=30)).isoformat(), "3": (now - timedelta(hours=99)).isoformat()}
    remove, new_seen = stale_runners(runners, seen, now, timedelta(hours=24))
    assert [r.id for r in remove] == [1]
    assert set(new_seen) == {"1", "2"}  # 3 came back online: forgotten; 2 first seen now


def test_durations() -> None:
    assert parse_duration("24h") == timedelta(hours=24) and parse_duration("2d") == timedelta(days=2)
    with pytest.raises(UsageError):
        parse_duration("yesterday")


GATE = f"{REPO}/.github/workflows/experiment-train.yml@refs/heads/main"


def test_only_a_group_limited_to_the_train_workflow_on_main_is_the_gpu_pool() -> None:
    """Issue 19 item 3: repository runners (or a group any workflow may use) let a writer's
    branch workflow with `runs-on: [self-hosted, gpu]` skip /train, authorize and the reviewers."""
    from pipelines.github.client import RunnerGroup
    from pipelines.github.runners import group_problems

    def g(**kw: object) -> RunnerGroup:
        values: dict = dict(id=1, name="gpu-pool", default=False, restricted_to_workflows=True,
                            selected_workflows=(GATE,), allows_public_repositories=False, visibility="selected")
        values.update(kw)
        return RunnerGroup(**values)

    assert group_problems(g(), repo=REPO) == []
    assert group_problems(g(restricted_to_workflows=False, selected_workflows=()), repo=REPO)
    assert group_problems(g(selected_workflows=(GATE.replace("refs/heads/main", "refs/heads/dev"),)), repo=REPO)
    assert group_problems(g(selected_workflows=(GATE, f"{REPO}/.github/workflows/ci.yml@refs/heads/main")),
                          repo=REPO)
    assert group_problems(g(default=True), repo=REPO) and group_problems(g(allows_public_repositories=True), repo=REPO)
