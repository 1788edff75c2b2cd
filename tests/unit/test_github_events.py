"""Webhook payloads into typed events, from the project's own fixtures; a malformed payload
is a usage error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from basics.errors import UsageError
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

FIXTURES = Path(__file__).parents[1] / "fixtures" / "github"
HEAD = "3f1c2a9e8b7d6c5f4e3d2c1b0a9f8e7d6c5b4a39"


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def test_pull_request_opened() -> None:
    event = parse_event("pull_request", load("pull_request.opened.json"))
    assert isinstance(event, PullRequestEvent) and event.action == "opened"
    pr = event.pull_request
    assert (pr.number, pr.author, pr.head_sha, pr.head_ref, pr.is_fork) == (12, "dana", HEAD, "exp/rope-theta", False)
    assert event.repo == "acme/lab" and pr.body.startswith("Hypothesis")


def test_null_body_becomes_empty_text() -> None:
    event = parse_event("pull_request", load("pull_request.opened.null-body.json"))
    assert isinstance(event, PullRequestEvent) and event.pull_request.body == ""


def test_fork_pull_request_keeps_hostile_text_as_data() -> None:
    event = parse_event("pull_request", load("pull_request.opened.fork.json"))
    assert isinstance(event, PullRequestEvent)
    pr = event.pull_request
    assert pr.is_fork and pr.head_repo == "mallory/lab" and pr.base_repo == "acme/lab"
    assert pr.head_ref.startswith("$(curl") and "::set-output" in pr.title  # carried, never interpreted


def test_deleted_fork_counts_as_fork() -> None:
    payload = load("pull_request.opened.fork.json")
    payload["pull_request"]["head"]["repo"] = None
    event = parse_event("pull_request", payload)
    assert isinstance(event, PullRequestEvent) and event.pull_request.head_repo is None and event.pull_request.is_fork


def test_synchronize_labeled_and_closed() -> None:
    sync = parse_event("pull_request", load("pull_request.synchronize.json"))
    assert isinstance(sync, PullRequestEvent) and sync.after == HEAD and sync.before and not sync.merged
    labeled = parse_event("pull_request", load("pull_request.labeled.json"))
    assert isinstance(labeled, PullRequestEvent) and labeled.label == "promote-override" and labeled.sender == "erin"
    merged = parse_event("pull_request", load("pull_request.closed.merged.json"))
    assert isinstance(merged, PullRequestEvent) and merged.merged
    closed = parse_event("pull_request", load("pull_request.closed.unmerged.json"))
    assert isinstance(closed, PullRequestEvent) and closed.action == "closed" and not closed.merged


def test_review_state_is_normalised_to_rest_spelling() -> None:
    event = parse_event("pull_request_review", load("pull_request_review.submitted.json"))
    assert isinstance(event, ReviewEvent)
    assert (event.reviewer, event.state, event.commit_id, event.pull_request.number) == ("erin", "APPROVED", HEAD, 12)


def test_issue_comment_on_a_pull_request_and_on_an_issue() -> None:
    on_pr = parse_event("issue_comment", load("issue_comment.created.pr.json"))
    assert isinstance(on_pr, CommentEvent) and on_pr.is_pull_request and on_pr.issue_number == 12
    assert on_pr.body.endswith("/train rope-theta-500k") and on_pr.author == "erin"
    on_issue = parse_event("issue_comment", load("issue_comment.created.issue.json"))
    assert isinstance(on_issue, CommentEvent) and not on_issue.is_pull_request


def test_workflow_run_with_and_without_pull_requests() -> None:
    with_prs = parse_event("workflow_run", load("workflow_run.completed.with-pull-requests.json"))
    assert isinstance(with_prs, WorkflowRunEvent)
    assert with_prs.pull_requests == ((12, HEAD),) and with_prs.conclusion == "success"
    fork = parse_event("workflow_run", load("workflow_run.completed.fork.json"))
    assert isinstance(fork, WorkflowRunEvent) and fork.pull_requests == () and fork.head_repo == "mallory/lab"


def test_push_and_dispatch() -> None:
    push = parse_event("push", load("push.json"))
    assert isinstance(push, PushEvent) and push.ref == "refs/heads/main" and push.head_commit is None
    dispatch = parse_event("workflow_dispatch", load("workflow_dispatch.json"))
    assert isinstance(dispatch, WorkflowDispatchEvent) and dispatch.inputs["pr"] == "14"
    assert dispatch.sender == "erin"


@pytest.mark.parametrize("path", sorted(p.name for p in FIXTURES.glob("*.json")))
def test_every_fixture_is_recognised_by_shape(path: str) -> None:
    expected = path.split(".")[0]
    assert guess_event_name(load(path)) == expected
    event = load_event(FIXTURES / path)  # name guessed from the shape
    assert event.name == expected


def test_malformed_payloads_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="malformed pull_request payload"):
        parse_event("pull_request", {"action": "opened", "pull_request": {"title": "no number"}})
    with pytest.raises(UsageError, match="unsupported GitHub event"):
        parse_event("pull_request_target", load("pull_request.opened.json"))
    bad = tmp_path / "e.json"
    bad.write_text("[1, 2]")
    with pytest.raises(UsageError, match="not a JSON object"):
        load_event(bad)
