"""The sticky comment through PyGithub against the emulator: once, then edited in place,
and never duplicated by retries, lost responses, 5xx, rate limits or timeouts."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from pipelines.github.client import PyGithubHost, TransientGitHubError
from pipelines.github.comment import StickyComment, parse_state, strip_header
from tests.infra.github_emulator import REPO, GitHubEmulator, emulated_repo, emulator_config

MARKER = "<!-- gitops-train:experiment=rope-theta -->"


@pytest.fixture
def gh() -> Iterator[GitHubEmulator]:
    with GitHubEmulator() as emulator:
        yield emulator


def sticky(gh: GitHubEmulator, number: int, **config: object) -> StickyComment:
    host = PyGithubHost(emulator_config(gh, **config))
    return StickyComment.for_experiment(host, number, "rope-theta", author=gh.bot_login, sleep=lambda s: None)


def ours(gh: GitHubEmulator, number: int) -> list[dict]:
    return [c for c in gh.comments(REPO, number) if c["body"].startswith(MARKER)]


def test_created_once_then_edited_in_place(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    gh.add_comment(REPO, n, user="erin", body="Nice idea.")
    s = sticky(gh, n)
    first = s.upsert("## validated", {"validated_sha": "a" * 40, "stage": "validate"})
    second = s.upsert("## training: step 10", {"stage": "training"})
    assert first.id == second.id
    (comment,) = ours(gh, n)
    assert comment["body"].endswith("## training: step 10")
    # Later stages keep what earlier ones recorded.
    state = parse_state(comment["body"])
    assert state.pop("version") == 2 and len(state.pop("writer")) == 16
    assert state == {"validated_sha": "a" * 40, "stage": "training"}
    assert len(gh.requests_made("POST", r"/comments$")) == 1
    assert len(gh.comments(REPO, n)) == 2  # the human's comment is untouched


def test_same_body_twice_makes_no_write(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    s = sticky(gh, n)
    s.upsert("same")
    s.upsert("same")
    assert len(gh.requests_made("PATCH")) == 0
    assert len(ours(gh, n)) == 1


@pytest.mark.parametrize("failure", [dict(status=502), dict(drop=True), dict(delay=2.0)],
                         ids=["502-after-write", "connection-dropped", "timeout"])
def test_lost_response_after_the_write_leaves_no_duplicate(gh: GitHubEmulator, failure: dict) -> None:
    n = emulated_repo(gh)
    gh.inject("POST", rf"/issues/{n}/comments$", apply=True, **failure)
    comment = sticky(gh, n, timeout=1).upsert("## validated")
    (only,) = ours(gh, n)
    assert only["id"] == comment.id
    # The client saw a failure and listed again instead of posting twice.
    assert len(gh.requests_made("POST", r"/comments$")) == 1


def test_a_502_before_the_write_is_retried_and_creates_one(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    gh.inject("POST", rf"/issues/{n}/comments$", status=502, count=2)
    sticky(gh, n).upsert("## validated")
    assert len(ours(gh, n)) == 1
    assert [e[2] for e in gh.requests_made("POST")] == [502, 502, 201]


def test_5xx_on_reads_is_retried_by_the_transport(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    gh.inject("GET", rf"/issues/{n}/comments$", status=503, count=2)
    sticky(gh, n).upsert("## validated")
    assert len(ours(gh, n)) == 1
    # Then one more read: the write is read back (optimistic concurrency).
    assert [e[2] for e in gh.requests_made("GET", r"/comments$")] == [503, 503, 200, 200]


def test_rate_limited_create_waits_for_the_reset_then_succeeds(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    waits: list[float] = []
    gh.inject("POST", rf"/issues/{n}/comments$", status=403, rate_limit_reset=int(time.time()) + 20)
    host = PyGithubHost(emulator_config(gh))
    StickyComment.for_experiment(host, n, "rope-theta", author=gh.bot_login, sleep=waits.append).upsert("x")
    assert len(ours(gh, n)) == 1
    # It waited for GitHub's reset time (about 20 s), not a blind backoff.
    assert len(waits) == 1 and 10 < waits[0] <= 21


def test_two_copies_are_merged_into_the_oldest(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    old = gh.add_comment(REPO, n, user=gh.bot_login, body=MARKER + "\nold")
    gh.add_comment(REPO, n, user=gh.bot_login, body=MARKER + "\nraced copy")
    sticky(gh, n).upsert("new")
    (only,) = ours(gh, n)
    assert only["id"] == old["id"] and strip_header(only["body"]) == "new"


def test_a_user_quoting_the_marker_cannot_take_over_the_state(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    forged = MARKER + '\n<!-- gitops-train:state {"validated_sha": "' + "f" * 40 + '"} -->\n'
    gh.add_comment(REPO, n, user="frank", body=forged)
    s = sticky(gh, n)
    assert s.state() == {}
    s.upsert("ok")
    assert [c["user"]["login"] for c in ours(gh, n)] == ["frank", gh.bot_login]
    # State-looking text inside the body (report text quoting user input) does not count either.
    assert parse_state(MARKER + "\nreport\n" + forged) == {}


def test_persistent_failure_is_one_clear_error(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    gh.inject("POST", rf"/issues/{n}/comments$", status=500, count=10)
    with pytest.raises(TransientGitHubError, match=rf"comment on #{n}: GitHub answered 500"):
        sticky(gh, n).upsert("x")
    assert ours(gh, n) == []


def test_long_bodies_are_cut_to_githubs_limit_with_a_note(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    sticky(gh, n).upsert("x" * 70000)
    (only,) = ours(gh, n)
    assert len(only["body"]) <= 65536 and "truncated" in only["body"]


def test_a_duplicate_removed_despite_a_lost_delete_answer(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    gh.add_comment(REPO, n, user=gh.bot_login, body=MARKER + "\nold")
    extra = gh.add_comment(REPO, n, user=gh.bot_login, body=MARKER + "\ncopy")
    gh.inject("DELETE", rf"/issues/comments/{extra['id']}$", status=502, apply=True)
    sticky(gh, n).upsert("new")
    assert len(ours(gh, n)) == 1
    assert [e[2] for e in gh.requests_made("DELETE")] == [502, 404]
