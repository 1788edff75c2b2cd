"""Webhook payloads into typed events: the project's own fixtures (always) and GitHub's
real payloads in ../shared when present (conformance: parser and emulator through PyGithub)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from github_emulator import GitHubEmulator, emulator_config

from pipelines.github.events import (
    CommentEvent,
    PullRequestEvent,
    PushEvent,
    ReviewEvent,
    WorkflowDispatchEvent,
    WorkflowRunEvent,
    guess_event_name,
    load_event,
    parse_event,
)
from validation.errors import UsageError

FIXTURES = Path(__file__).parent / "fixtures" / "github"
REAL = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "github" / "webhooks"
HEAD = "3f1c2a9e8b7d6c5f4e3d2c1b0a9f8e7d6c5b4a39"


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


@pytest.mark.unit
def test_pull_request_opened() -> None:
    event = parse_event("pull_request", load("pull_request.opened.json"))
    assert isinstance(event, PullRequestEvent) and event.action == "opened"
    pr = event.pull_request
    assert (pr.number, pr.author, pr.head_sha, pr.head_ref, pr.is_fork) == (12, "dana", HEAD, "exp/rope-theta", False)
    assert event.repo == "acme/lab" and pr.body.startswith("Hypothesis")


@pytest.mark.unit
def test_null_body_becomes_empty_text() -> None:
    event = parse_event("pull_request", load("pull_request.opened.null-body.json"))
    assert isinstance(event, PullRequestEvent) and event.pull_request.body == ""


@pytest.mark.unit
def test_fork_pull_request_keeps_hostile_text_as_data() -> None:
    event = parse_event("pull_request", load("pull_request.opened.fork.json"))
    assert isinstance(event, PullRequestEvent)
    pr = event.pull_request
    assert pr.is_fork and pr.head_repo == "mallory/lab" and pr.base_repo == "acme/lab"
    assert pr.head_ref.startswith("$(curl") and "::set-output" in pr.title  # carried, never interpreted


@pytest.mark.unit
def test_deleted_fork_counts_as_fork() -> None:
    payload = load("pull_request.opened.fork.json")
    payload["pull_request"]["head"]["repo"] = None
    event = parse_event("pull_request", payload)
    assert isinstance(event, PullRequestEvent) and event.pull_request.head_repo is None and event.pull_request.is_fork


@pytest.mark.unit
def test_synchronize_labeled_and_closed() -> None:
    sync = parse_event("pull_request", load("pull_request.synchronize.json"))
    assert isinstance(sync, PullRequestEvent) and sync.after == HEAD and sync.before and not sync.merged
    labeled = parse_event("pull_request", load("pull_request.labeled.json"))
    assert isinstance(labeled, PullRequestEvent) and labeled.label == "promote-override" and labeled.sender == "erin"
    merged = parse_event("pull_request", load("pull_request.closed.merged.json"))
    assert isinstance(merged, PullRequestEvent) and merged.merged
    closed = parse_event("pull_request", load("pull_request.closed.unmerged.json"))
    assert isinstance(closed, PullRequestEvent) and closed.action == "closed" and not closed.merged


@pytest.mark.unit
def test_review_state_is_normalised_to_rest_spelling() -> None:
    event = parse_event("pull_request_review", load("pull_request_review.submitted.json"))
    assert isinstance(event, ReviewEvent)
    assert (event.reviewer, event.state, event.commit_id, event.pull_request.number) == ("erin", "APPROVED", HEAD, 12)


@pytest.mark.unit
def test_issue_comment_on_a_pull_request_and_on_an_issue() -> None:
    on_pr = parse_event("issue_comment", load("issue_comment.created.pr.json"))
    assert isinstance(on_pr, CommentEvent) and on_pr.is_pull_request and on_pr.issue_number == 12
    assert on_pr.body.endswith("/train rope-theta-500k") and on_pr.author == "erin"
    on_issue = parse_event("issue_comment", load("issue_comment.created.issue.json"))
    assert isinstance(on_issue, CommentEvent) and not on_issue.is_pull_request


@pytest.mark.unit
def test_workflow_run_with_and_without_pull_requests() -> None:
    with_prs = parse_event("workflow_run", load("workflow_run.completed.with-pull-requests.json"))
    assert isinstance(with_prs, WorkflowRunEvent)
    assert with_prs.pull_requests == ((12, HEAD),) and with_prs.conclusion == "success"
    fork = parse_event("workflow_run", load("workflow_run.completed.fork.json"))
    assert isinstance(fork, WorkflowRunEvent) and fork.pull_requests == () and fork.head_repo == "mallory/lab"


@pytest.mark.unit
def test_push_and_dispatch() -> None:
    push = parse_event("push", load("push.json"))
    assert isinstance(push, PushEvent) and push.ref == "refs/heads/main" and push.head_commit is None
    dispatch = parse_event("workflow_dispatch", load("workflow_dispatch.json"))
    assert isinstance(dispatch, WorkflowDispatchEvent) and dispatch.inputs["pr"] == "14"
    assert dispatch.sender == "erin"


@pytest.mark.unit
@pytest.mark.parametrize("path", sorted(p.name for p in FIXTURES.glob("*.json")))
def test_every_fixture_is_recognised_by_shape(path: str) -> None:
    expected = path.split(".")[0]
    assert guess_event_name(load(path)) == expected
    event = load_event(FIXTURES / path)  # name guessed from the shape
    assert event.name == expected


@pytest.mark.unit
def test_malformed_payloads_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="malformed pull_request payload"):
        parse_event("pull_request", {"action": "opened", "pull_request": {"title": "no number"}})
    with pytest.raises(UsageError, match="unsupported GitHub event"):
        parse_event("pull_request_target", load("pull_request.opened.json"))
    bad = tmp_path / "e.json"
    bad.write_text("[1, 2]")
    with pytest.raises(UsageError, match="not a JSON object"):
        load_event(bad)


# --------------------------------------------------------------------------- conformance

REAL_PAYLOADS = sorted(REAL.glob("*.json")) if REAL.is_dir() else []
needs_real = pytest.mark.skipif(not REAL_PAYLOADS, reason="../shared/fixtures/github/webhooks not present")


@pytest.mark.integration
@needs_real
@pytest.mark.parametrize("path", REAL_PAYLOADS, ids=lambda p: p.name)
def test_real_payload_parses_and_is_served_to_pygithub(path: Path) -> None:
    from pipelines.github.client import PyGithubHost

    payload = json.loads(path.read_text(encoding="utf-8"))
    name = path.name.split(".")[0]
    event = parse_event(name, payload)
    assert event.name == name
    assert guess_event_name(payload) == name
    with GitHubEmulator() as gh:
        gh.load_payload(payload)
        repo = (payload.get("repository") or {}).get("full_name")
        if not repo:
            return
        host = PyGithubHost(emulator_config(gh, repo=repo))
        if "pull_request" in payload and payload["pull_request"].get("head"):
            pr = host.pull_request(payload["pull_request"]["number"])
            assert pr.head_sha == payload["pull_request"]["head"]["sha"]
            assert pr.author == payload["pull_request"]["user"]["login"]
            if "review" in payload:
                (review,) = host.reviews(pr.number)
                assert review.commit_id == payload["review"]["commit_id"]
                assert review.state == payload["review"]["state"].upper()
        if "comment" in payload:
            number = payload["issue"]["number"]
            (comment,) = host.list_comments(number)
            assert comment.id == payload["comment"]["id"] and comment.body == payload["comment"]["body"]
            assert comment.author == payload["comment"]["user"]["login"]


def _keys(obj: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in obj.items():
        out.add(prefix + k)
        if isinstance(v, dict) and k in ("head", "base", "user"):
            out |= _keys(v, f"{prefix}{k}.")
    return out


@pytest.mark.integration
@needs_real
def test_emulator_objects_have_the_fields_of_the_real_ones() -> None:
    """The emulator's own pull request, comment and review carry every field (and the nesting
    of head/base/user) that GitHub's objects have, so code tested here meets no surprise there."""
    import urllib.request

    real = {name: json.loads((REAL / f"{name}.payload.json").read_text()) for name in
            ("pull_request.opened", "issue_comment.created", "pull_request_review.submitted")}
    with GitHubEmulator() as gh:
        from github_emulator import emulated_repo

        n = emulated_repo(gh)
        gh.add_comment("acme/lab", n, user="erin", body="hi")
        gh.add_review("acme/lab", n, user="erin")

        def get(path: str) -> object:
            req = urllib.request.Request(gh.base_url + path, headers={"Authorization": f"token {gh.token}"})
            with urllib.request.urlopen(req) as resp:
                return json.load(resp)

        ours = {"pull_request": get(f"/repos/acme/lab/pulls/{n}"),
                "comment": get(f"/repos/acme/lab/issues/{n}/comments")[0],
                "review": get(f"/repos/acme/lab/pulls/{n}/reviews")[0]}
    missing = {
        "pull_request": _keys(real["pull_request.opened"]["pull_request"]) - _keys(ours["pull_request"]),
        "comment": _keys(real["issue_comment.created"]["comment"]) - _keys(ours["comment"]),
        "review": _keys(real["pull_request_review.submitted"]["review"]) - _keys(ours["review"]),
    }
    assert missing == {"pull_request": set(), "comment": set(), "review": set()}
