"""Webhook payloads ($GITHUB_EVENT_PATH) parsed into small typed events (pure).

Payload text is untrusted: titles, bodies, branch names and comments are carried as data
and never interpolated into commands. Optional fields are optional for real (a PR body
is null when empty, a deleted fork's `head.repo` is null, `workflow_run.pull_requests`
is empty for runs from forks), so every access below tolerates absence.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from basics.errors import UsageError


@dataclass(frozen=True)
class PullRequestRef:
    number: int
    title: str
    body: str  # "" when GitHub sends null
    author: str
    head_sha: str
    head_ref: str
    head_repo: str | None  # None when the fork was deleted
    base_repo: str
    base_ref: str
    state: str
    merged: bool
    draft: bool
    labels: tuple[str, ...]
    author_association: str = ""

    @property
    def is_fork(self) -> bool:
        return self.head_repo != self.base_repo


@dataclass(frozen=True)
class PullRequestEvent:
    action: str  # opened, synchronize, labeled, closed, reopened, ...
    pull_request: PullRequestRef
    repo: str
    sender: str
    label: str | None = None
    before: str | None = None
    after: str | None = None
    name: str = "pull_request"

    @property
    def merged(self) -> bool:
        return self.action == "closed" and self.pull_request.merged


@dataclass(frozen=True)
class ReviewEvent:
    action: str  # submitted, edited, dismissed
    review_id: int
    reviewer: str
    state: str  # upper case, as the REST API spells it: APPROVED, CHANGES_REQUESTED, COMMENTED, DISMISSED
    commit_id: str
    pull_request: PullRequestRef
    repo: str
    sender: str
    name: str = "pull_request_review"


@dataclass(frozen=True)
class CommentEvent:
    action: str  # created, edited, deleted
    comment_id: int
    body: str
    author: str
    author_association: str
    issue_number: int
    is_pull_request: bool
    repo: str
    sender: str
    name: str = "issue_comment"


@dataclass(frozen=True)
class WorkflowRunEvent:
    action: str  # requested, in_progress, completed
    run_id: int
    workflow_name: str
    conclusion: str | None
    event: str  # what triggered the run: pull_request, push, ...
    head_sha: str
    head_branch: str | None
    head_repo: str | None
    repo: str
    pull_requests: tuple[tuple[int, str], ...]  # (number, head sha); empty for fork PRs
    name: str = "workflow_run"


@dataclass(frozen=True)
class PushEvent:
    ref: str
    before: str
    after: str
    deleted: bool
    repo: str
    pusher: str
    head_commit: str | None
    default_branch: str = "main"
    name: str = "push"


@dataclass(frozen=True)
class WorkflowDispatchEvent:
    ref: str
    inputs: dict[str, str] = field(default_factory=dict)
    workflow: str = ""
    repo: str = ""
    sender: str = ""
    name: str = "workflow_dispatch"


Event = PullRequestEvent | ReviewEvent | CommentEvent | WorkflowRunEvent | PushEvent | WorkflowDispatchEvent
EVENT_NAMES = ("pull_request", "pull_request_review", "issue_comment", "workflow_run", "push", "workflow_dispatch")


def _s(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _d(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _login(user: Any) -> str:
    return _s(_d(user).get("login"))


def _repo_name(repo: Any) -> str | None:
    name = _d(repo).get("full_name")
    return name if isinstance(name, str) and name else None


def _pull_request(pr: dict[str, Any], repo: str) -> PullRequestRef:
    head, base = _d(pr.get("head")), _d(pr.get("base"))
    return PullRequestRef(
        number=int(pr["number"]),
        title=_s(pr.get("title")),
        body=_s(pr.get("body")),
        author=_login(pr.get("user")),
        head_sha=_s(head.get("sha")),
        head_ref=_s(head.get("ref")),
        head_repo=_repo_name(head.get("repo")),
        base_repo=_repo_name(base.get("repo")) or repo,
        base_ref=_s(base.get("ref")),
        state=_s(pr.get("state")),
        merged=bool(pr.get("merged")) or bool(pr.get("merged_at")),
        draft=bool(pr.get("draft")),
        labels=tuple(_s(lab.get("name")) for lab in pr.get("labels") or [] if isinstance(lab, dict)),
        author_association=_s(pr.get("author_association")),
    )


def guess_event_name(payload: dict[str, Any]) -> str:
    """The event name from the payload's shape (when GITHUB_EVENT_NAME is not set)."""
    if "workflow_run" in payload:
        return "workflow_run"
    if "review" in payload and "pull_request" in payload:
        return "pull_request_review"
    if "comment" in payload and "issue" in payload:
        return "issue_comment"
    if "pull_request" in payload:
        return "pull_request"
    if "pusher" in payload or ("commits" in payload and "ref" in payload):
        return "push"
    if "inputs" in payload or ("workflow" in payload and "ref" in payload):
        return "workflow_dispatch"
    raise UsageError("cannot tell which GitHub event this payload is; set GITHUB_EVENT_NAME")


def parse_event(name: str, payload: dict[str, Any]) -> Event:
    """Typed event from a webhook payload; `UsageError` for a payload that is not that event."""
    if name not in EVENT_NAMES:
        raise UsageError(f"unsupported GitHub event {name!r}; expected one of {', '.join(EVENT_NAMES)}")
    try:
        return _PARSERS[name](payload)
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"malformed {name} payload: missing or invalid {exc}") from exc


def _parse_pull_request(p: dict[str, Any]) -> PullRequestEvent:
    repo = _repo_name(p.get("repository")) or ""
    label = _d(p.get("label")).get("name")
    return PullRequestEvent(
        action=_s(p.get("action")),
        pull_request=_pull_request(p["pull_request"], repo),
        repo=repo,
        sender=_login(p.get("sender")),
        label=label if isinstance(label, str) else None,
        before=p.get("before") if isinstance(p.get("before"), str) else None,
        after=p.get("after") if isinstance(p.get("after"), str) else None,
    )


def _parse_review(p: dict[str, Any]) -> ReviewEvent:
    repo = _repo_name(p.get("repository")) or ""
    review = p["review"]
    return ReviewEvent(
        action=_s(p.get("action")),
        review_id=int(review["id"]),
        reviewer=_login(review.get("user")),
        state=_s(review.get("state")).upper(),
        commit_id=_s(review.get("commit_id")),
        pull_request=_pull_request(p["pull_request"], repo),
        repo=repo,
        sender=_login(p.get("sender")),
    )


def _parse_comment(p: dict[str, Any]) -> CommentEvent:
    issue, comment = p["issue"], p["comment"]
    return CommentEvent(
        action=_s(p.get("action")),
        comment_id=int(comment["id"]),
        body=_s(comment.get("body")),
        author=_login(comment.get("user")),
        author_association=_s(comment.get("author_association")),
        issue_number=int(issue["number"]),
        # GitHub marks a PR's conversation by `issue.pull_request` (present, an object).
        is_pull_request=isinstance(issue.get("pull_request"), dict),
        repo=_repo_name(p.get("repository")) or "",
        sender=_login(p.get("sender")),
    )


def _parse_workflow_run(p: dict[str, Any]) -> WorkflowRunEvent:
    run = p["workflow_run"]
    prs = tuple(
        (int(pr["number"]), _s(_d(pr.get("head")).get("sha")))
        for pr in run.get("pull_requests") or []
        if isinstance(pr, dict) and "number" in pr
    )
    head_branch = run.get("head_branch")
    return WorkflowRunEvent(
        action=_s(p.get("action")),
        run_id=int(run["id"]),
        workflow_name=_s(run.get("name")) or _s(_d(p.get("workflow")).get("name")),
        conclusion=run.get("conclusion") if isinstance(run.get("conclusion"), str) else None,
        event=_s(run.get("event")),
        head_sha=_s(run.get("head_sha")),
        head_branch=head_branch if isinstance(head_branch, str) else None,
        head_repo=_repo_name(run.get("head_repository")),
        repo=_repo_name(p.get("repository")) or _repo_name(run.get("repository")) or "",
        pull_requests=prs,
    )


def _parse_push(p: dict[str, Any]) -> PushEvent:
    head_commit = _d(p.get("head_commit")).get("id")
    return PushEvent(
        ref=_s(p["ref"]),
        before=_s(p.get("before")),
        after=_s(p.get("after")),
        deleted=bool(p.get("deleted")),
        repo=_repo_name(p.get("repository")) or "",
        pusher=_s(_d(p.get("pusher")).get("name")),
        head_commit=head_commit if isinstance(head_commit, str) else None,
        default_branch=_s(_d(p.get("repository")).get("default_branch")) or "main",
    )


def _parse_dispatch(p: dict[str, Any]) -> WorkflowDispatchEvent:
    inputs = {str(k): "" if v is None else str(v) for k, v in _d(p.get("inputs")).items()}
    return WorkflowDispatchEvent(
        ref=_s(p["ref"]),
        inputs=inputs,
        workflow=_s(p.get("workflow")),
        repo=_repo_name(p.get("repository")) or "",
        sender=_login(p.get("sender")),
    )


_PARSERS: dict[str, Callable[[dict[str, Any]], Event]] = {
    "pull_request": _parse_pull_request,
    "pull_request_review": _parse_review,
    "issue_comment": _parse_comment,
    "workflow_run": _parse_workflow_run,
    "push": _parse_push,
    "workflow_dispatch": _parse_dispatch,
}


def load_event(path: str | Path, name: str | None = None) -> Event:
    """Read `$GITHUB_EVENT_PATH`; the name comes from `name`, `$GITHUB_EVENT_NAME` or the shape."""
    p = Path(path)
    try:
        payload = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UsageError(f"{p}: no such event file") from exc
    except ValueError as exc:
        raise UsageError(f"{p}: not a JSON event payload") from exc
    if not isinstance(payload, dict):
        raise UsageError(f"{p}: not a JSON object")
    name = name or os.environ.get("GITHUB_EVENT_NAME") or guess_event_name(payload)
    return parse_event(name, payload)
