"""The code host behind small Protocols: PyGithub for GitHub, a file for dry runs.

Everything else in `pipelines.github` is pure and talks to these Protocols with plain
dataclasses, so gates, ChatOps decisions and the sticky comment are testable without a
server and the PyGithub details (retries, rate limits, exception types) stay here.

Retry policy, and why POST is not in it: `GithubRetry` retries 5xx and rate-limit 403s
inside urllib3. A POST that GitHub applied but whose answer was lost (a 502 from a proxy,
a read timeout) would be sent again and create a second comment. So the transport retries
only idempotent methods (GET, PUT, DELETE, PATCH: an edit to the same body is the same
edit); a failed create surfaces as `TransientGitHubError` and `StickyComment` re-lists the
comments before trying again. Rate-limit waits honour `X-RateLimit-Reset`, capped by
`max_rate_limit_wait`; a longer wait fails fast with a message that says when to retry.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import quote

from basics.errors import GitHubError, PermissionDenied, TransientGitHubError, UsageError

if TYPE_CHECKING:  # PyGithub is light (0.14 s) but only the adapter needs it.
    import github

DEFAULT_API_URL = "https://api.github.com"
DEFAULT_BOT_LOGIN = "github-actions[bot]"
REPO_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$")
WRITE_ROLES = frozenset({"admin", "maintain", "write"})
T = TypeVar("T")


# --------------------------------------------------------------------------- plain data


@dataclass(frozen=True)
class Comment:
    id: int
    body: str
    author: str
    created_at: str = ""


@dataclass(frozen=True)
class PullRequestInfo:
    """What the pipeline needs to know about a PR, from the API (fresher than any payload)."""

    number: int
    title: str
    author: str
    head_sha: str
    head_ref: str
    head_repo: str | None
    base_repo: str
    state: str
    merged: bool
    labels: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    @property
    def is_fork(self) -> bool:
        # A deleted fork shows as head.repo = null: treat it as a fork (untrusted).
        return self.head_repo != self.base_repo


@dataclass(frozen=True)
class Review:
    user: str
    state: str  # APPROVED, CHANGES_REQUESTED, COMMENTED, DISMISSED (REST spelling)
    commit_id: str
    submitted_at: str
    id: int = 0


@dataclass(frozen=True)
class LabelEvent:
    """An issue event promotion reads: `labeled`, or `head_ref_force_pushed` (label "")."""

    label: str
    actor: str
    created_at: str
    id: int = 0
    event: str = "labeled"


@dataclass(frozen=True)
class Runner:
    id: int
    name: str
    status: str  # online | offline
    busy: bool
    labels: tuple[str, ...]


# --------------------------------------------------------------------------- Protocols


class CodeHost(Protocol):
    """What posting one sticky comment needs; the dry run implements exactly this."""

    def list_comments(self, number: int) -> list[Comment]: ...

    def create_comment(self, number: int, body: str) -> Comment: ...

    def edit_comment(self, comment_id: int, body: str) -> Comment: ...

    def delete_comment(self, comment_id: int) -> None: ...


class ReviewHost(Protocol):
    """Facts the ChatOps and promotion gates decide on."""

    def pull_request(self, number: int) -> PullRequestInfo: ...

    def permission(self, login: str) -> str: ...

    def reviews(self, number: int) -> list[Review]: ...

    def label_events(self, number: int) -> list[LabelEvent]: ...

    def head_pushers(self, number: int) -> tuple[str, ...]: ...


class RepoContentHost(Protocol):
    """Commits and files as data (never checked out): promotion and the /train re-validation."""

    def pulls_for_commit(self, sha: str) -> list[MergedPull]: ...

    def files_at(self, folder: str, ref: str) -> dict[str, bytes]: ...

    def workflow_run(self, run_id: int) -> WorkflowRunInfo | None: ...


@dataclass(frozen=True)
class MergedPull:
    """A pull request a commit belongs to (`GET /commits/{sha}/pulls`)."""

    number: int
    merged: bool
    merge_commit_sha: str
    base_ref: str
    state: str


@dataclass(frozen=True)
class WorkflowRunInfo:
    id: int
    path: str  # .github/workflows/<file>.yml
    event: str
    conclusion: str | None
    head_branch: str
    created_at: str = ""  # set by GitHub when the run was triggered
    status: str = ""  # queued, waiting, in_progress, completed ...


@dataclass(frozen=True)
class RunJob:
    """One job of a workflow run (`GET /actions/runs/{id}/jobs`)."""

    name: str
    status: str  # queued, waiting, in_progress, completed


@dataclass(frozen=True)
class RunnerGroup:
    """An organisation's runner group (`GET /orgs/{org}/actions/runner-groups`)."""

    id: int
    name: str
    default: bool
    restricted_to_workflows: bool
    selected_workflows: tuple[str, ...]
    allows_public_repositories: bool
    visibility: str


@dataclass(frozen=True)
class JitRunner:
    """A just-in-time runner: registered for one job, configured by `encoded_jit_config`."""

    id: int
    name: str
    encoded_jit_config: str


class RunnerHost(Protocol):
    """Self-hosted runner administration."""

    def runners(self) -> list[Runner]: ...

    def remove_runner(self, runner_id: int) -> None: ...


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True, kw_only=True)
class GitHubConfig:
    """How to reach GitHub; `from_env` reads what GitHub Actions provides."""

    token: str | None
    repo: str
    api_url: str = DEFAULT_API_URL
    bot_login: str = DEFAULT_BOT_LOGIN
    """Login the sticky comments are posted as: only its comments are ever edited."""
    timeout: int = 15
    """Seconds per request (connect and read); PyGithub insists on an int."""
    retries: int = 5
    """Transport retries of idempotent requests on 5xx / rate limits / connection errors."""
    backoff_factor: float = 1.0
    """urllib3 exponential backoff between those retries."""
    max_rate_limit_wait: float = 300.0
    """Longest wait for a rate-limit reset; a longer one fails with a clear message."""
    seconds_between_requests: float = 0.25
    seconds_between_writes: float = 1.0

    @classmethod
    def from_env(cls, repo: str | None = None, **overrides: Any) -> GitHubConfig:
        repo = repo or os.environ.get("GITHUB_REPOSITORY", "")
        if not REPO_PATTERN.match(repo):
            raise UsageError("no repository: pass --repo owner/name or set GITHUB_REPOSITORY")
        # Tuning knobs for tests and self-hosted GitHub Enterprise: PIPELINE_GITHUB_<FIELD>.
        for name, kind in (("timeout", int), ("retries", int), ("backoff_factor", float),
                           ("max_rate_limit_wait", float), ("seconds_between_requests", float),
                           ("seconds_between_writes", float)):
            value = os.environ.get(f"PIPELINE_GITHUB_{name.upper()}")
            if value and name not in overrides:
                try:
                    overrides[name] = kind(value)
                except ValueError as exc:
                    raise UsageError(f"PIPELINE_GITHUB_{name.upper()}={value!r} is not a number") from exc
        return cls(
            token=os.environ.get("GITHUB_TOKEN") or None,
            repo=repo,
            api_url=os.environ.get("GITHUB_API_URL") or DEFAULT_API_URL,
            bot_login=os.environ.get("GITHUB_BOT_LOGIN") or DEFAULT_BOT_LOGIN,
            **overrides,
        )


# --------------------------------------------------------------------------- error mapping


def map_error(exc: BaseException, action: str, config: GitHubConfig | None = None) -> GitHubError:
    """Translate a PyGithub/requests exception into the project's one-line error."""
    import requests
    from github import GithubException
    from github.GithubException import (
        BadCredentialsException,
        RateLimitExceededExceedsMaxWait,
        RateLimitExceededException,
        UnknownObjectException,
    )

    if isinstance(exc, RateLimitExceededExceedsMaxWait):
        wait = exc.wait or 0
        return GitHubError(f"{action}: GitHub rate limit; it resets in {wait:.0f}s, longer than we wait; retry later")
    if isinstance(exc, RateLimitExceededException):
        reset = (exc.headers or {}).get("X-RateLimit-Reset") or (exc.headers or {}).get("x-ratelimit-reset")
        retry_after = max(0.0, int(reset) - time.time()) if reset and str(reset).isdigit() else None
        return TransientGitHubError(f"{action}: GitHub rate limit exceeded", retry_after)
    if isinstance(exc, BadCredentialsException):
        return GitHubError(f"{action}: bad credentials (401): check GITHUB_TOKEN")
    if isinstance(exc, UnknownObjectException) or (isinstance(exc, GithubException) and exc.status == 404):
        return GitHubError(f"{action}: not found (404): check the repository, number and token scope")
    if isinstance(exc, GithubException):
        message = _gh_message(exc)
        if exc.status >= 500:
            return TransientGitHubError(f"{action}: GitHub answered {exc.status} {message}".rstrip())
        if exc.status == 403:
            return PermissionDenied(f"{action}: forbidden (403): the token may not do this: {message}".rstrip(": "))
        return GitHubError(f"{action}: GitHub answered {exc.status}: {message}".rstrip(": "))
    if isinstance(exc, requests.exceptions.RetryError):
        return TransientGitHubError(f"{action}: GitHub kept failing (5xx or rate limit) after retries")
    if isinstance(exc, requests.exceptions.Timeout):
        timeout = f" within {config.timeout:g}s" if config else ""
        return TransientGitHubError(f"{action}: no answer from GitHub{timeout} (timeout)")
    if isinstance(exc, requests.exceptions.RequestException):
        return TransientGitHubError(f"{action}: cannot reach GitHub: {type(exc).__name__}")
    raise exc


def _gh_message(exc: Any) -> str:
    data = exc.data
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return str(data["message"]).splitlines()[0][:200]
    return ""


@contextmanager
def _mapped(action: str, config: GitHubConfig) -> Iterator[None]:
    import requests
    from github import GithubException

    try:
        yield
    except (GithubException, requests.exceptions.RequestException) as exc:
        raise map_error(exc, action, config) from exc


def retrying(call: Callable[[], T], *, attempts: int = 3, sleep: Callable[[float], None] = time.sleep,
             cap: float = 60.0) -> T:
    """Run `call`, retrying `TransientGitHubError` (for requests that are safe to repeat)."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except TransientGitHubError as exc:
            if attempt == attempts:
                raise
            sleep(min(cap, exc.retry_after if exc.retry_after is not None else 2 ** (attempt - 1)))
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- PyGithub adapter


def connect(config: GitHubConfig) -> github.Github:
    """A PyGithub client with the retry policy described in the module docstring."""
    from github import Auth, Github, GithubRetry

    if not config.token:
        raise UsageError("no GitHub token: set GITHUB_TOKEN, or use --dry-run")
    retry = GithubRetry(
        total=config.retries,
        backoff_factor=config.backoff_factor,
        max_rate_limit_wait=config.max_rate_limit_wait,
        secondary_rate_wait=min(60.0, config.max_rate_limit_wait),
        allowed_methods=frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "PATCH"}),
    )
    return Github(
        base_url=config.api_url.rstrip("/"),
        auth=Auth.Token(config.token),
        retry=retry,
        timeout=int(config.timeout),
        seconds_between_requests=config.seconds_between_requests,
        seconds_between_writes=config.seconds_between_writes,
    )


class PyGithubHost:
    """`CodeHost`, `ReviewHost` and `RunnerHost` over PyGithub, errors mapped at this boundary."""

    def __init__(self, config: GitHubConfig, client: github.Github | None = None):
        self.config = config
        self.gh = client or connect(config)
        self._repo: Any = None

    @property
    def repo(self) -> Any:
        if self._repo is None:
            from github.Repository import Repository

            # Not completed: no request until one is needed; every call below makes its own.
            self._repo = Repository(self.gh.requester, url=f"/repos/{self.config.repo}", completed=False)
        return self._repo

    def _do(self, action: str, call: Callable[[], T]) -> T:
        with _mapped(action, self.config):
            return call()

    # CodeHost ---------------------------------------------------------------

    def list_comments(self, number: int) -> list[Comment]:
        def call() -> list[Comment]:
            # Every page, oldest first: the marker comment may be anywhere in a long thread.
            return [_comment(c) for c in self._issue_lazy(number).get_comments()]

        return self._do(f"list comments of #{number}", call)

    def create_comment(self, number: int, body: str) -> Comment:
        # No transport retry for POST (see module docstring); StickyComment re-lists on failure.
        return self._do(f"comment on #{number}",
                        lambda: _comment(self._issue_lazy(number).create_comment(body)))

    def edit_comment(self, comment_id: int, body: str) -> Comment:
        def call() -> Comment:
            comment = self._comment_lazy(comment_id)
            comment.edit(body)
            return _comment(comment)

        return self._do(f"edit comment {comment_id}", call)

    def delete_comment(self, comment_id: int) -> None:
        from github import GithubException

        def call() -> None:
            try:
                self._comment_lazy(comment_id).delete()
            except GithubException as exc:
                # A retried DELETE whose first attempt landed answers 404: already gone is done.
                if exc.status != 404:
                    raise

        self._do(f"delete comment {comment_id}", call)

    def _issue_lazy(self, number: int) -> Any:
        from github.Issue import Issue

        return Issue(self.gh.requester, url=f"{self.repo.url}/issues/{number}", completed=False)

    def _comment_lazy(self, comment_id: int) -> Any:
        from github.IssueComment import IssueComment

        return IssueComment(self.gh.requester, url=f"{self.repo.url}/issues/comments/{comment_id}", completed=False)

    # ReviewHost -------------------------------------------------------------

    def pull_request(self, number: int) -> PullRequestInfo:
        def call() -> PullRequestInfo:
            pr = self.repo.get_pull(number)
            files = tuple(f.filename for f in pr.get_files() if f.status != "removed")
            raw = pr.raw_data
            head_repo = (raw.get("head") or {}).get("repo") or None
            return PullRequestInfo(
                number=pr.number,
                title=pr.title or "",
                author=pr.user.login,
                head_sha=pr.head.sha,
                head_ref=pr.head.ref,
                head_repo=head_repo.get("full_name") if head_repo else None,
                base_repo=raw["base"]["repo"]["full_name"],
                state=pr.state,
                merged=bool(raw.get("merged")),
                labels=tuple(label.name for label in pr.labels),
                files=files,
            )

        return self._do(f"read pull request #{number}", call)

    def permission(self, login: str) -> str:
        """The user's role on the repository: admin, maintain, write, triage, read or none.

        GitHub's `permission` field folds maintain into write; `role_name` keeps it."""
        from github import GithubException

        def call() -> str:
            try:
                _, data = self.gh.requester.requestJsonAndCheck(
                    "GET", f"{self.repo.url}/collaborators/{quote(login, safe='')}/permission")
            except GithubException as exc:
                if exc.status == 404:  # not a user at all: no permission
                    return "none"
                raise
            return str(data.get("role_name") or data.get("permission") or "none")

        return self._do(f"check permission of {login}", call)

    def reviews(self, number: int) -> list[Review]:
        def call() -> list[Review]:
            out = []
            for r in self.repo.get_pull(number).get_reviews():
                submitted = r.submitted_at.isoformat() if r.submitted_at else ""
                out.append(Review(user=r.user.login if r.user else "", state=(r.state or "").upper(),
                                  commit_id=r.commit_id or "", submitted_at=submitted, id=r.id))
            return out

        return self._do(f"list reviews of #{number}", call)

    def label_events(self, number: int) -> list[LabelEvent]:
        def call() -> list[LabelEvent]:
            out = []
            for ev in self._issue_lazy(number).get_events():
                when = ev.created_at.isoformat() if ev.created_at else ""
                if ev.event == "labeled" and ev.label is not None and ev.actor is not None:
                    out.append(LabelEvent(label=ev.label.name, actor=ev.actor.login, created_at=when, id=ev.id))
                elif ev.event == "head_ref_force_pushed":
                    out.append(LabelEvent(label="", actor=ev.actor.login if ev.actor else "", created_at=when,
                                          id=ev.id, event=ev.event))
            return out

        return self._do(f"list label events of #{number}", call)

    def head_pushers(self, number: int) -> tuple[str, ...]:
        """Who may have pushed the PR's head: the head commit's author and committer (GitHub
        users) and the actor of the latest `head_ref_force_pushed` event. Their approvals do
        not count (branch protection's "approval of the most recent reviewable push"). The head
        is the pull request's `head.sha`: `GET /pulls/{n}/commits` stops at 250 commits."""

        def call() -> tuple[str, ...]:
            pull = self.repo.get_pull(number)
            head = self.repo.get_commit(pull.head.sha)
            logins = {u.login for u in (head.author, head.committer) if u is not None and u.login}
            forced = [ev for ev in self._issue_lazy(number).get_events()
                      if ev.event == "head_ref_force_pushed" and ev.actor is not None]
            if forced:
                logins.add(forced[-1].actor.login)
            return tuple(sorted(logins))

        return self._do(f"list the head pushers of #{number}", call)

    # RepoContentHost --------------------------------------------------------

    def pulls_for_commit(self, sha: str) -> list[MergedPull]:
        """The pull requests GitHub associates with a commit (for a merge commit: the merged PR)."""

        def call() -> list[MergedPull]:
            _, data = self.gh.requester.requestJsonAndCheck(
                "GET", f"{self.repo.url}/commits/{sha}/pulls", parameters={"per_page": 100})
            out = []
            for pr in data if isinstance(data, list) else []:
                out.append(MergedPull(number=int(pr["number"]), merged=bool(pr.get("merged_at")),
                                      merge_commit_sha=str(pr.get("merge_commit_sha") or ""),
                                      base_ref=str((pr.get("base") or {}).get("ref") or ""),
                                      state=str(pr.get("state") or "")))
            return out

        return self._do(f"list pull requests of commit {sha[:12]}", call)

    def files_at(self, folder: str, ref: str) -> dict[str, bytes]:
        """Every file under `folder` at commit `ref`, read through the contents API as data."""
        import base64

        from github import GithubException

        def walk(path: str, out: dict[str, bytes]) -> None:
            _, data = self.gh.requester.requestJsonAndCheck(
                "GET", f"{self.repo.url}/contents/{quote(path)}", parameters={"ref": ref})
            if isinstance(data, dict):
                if data.get("type") == "file":
                    out[str(data["path"])] = base64.b64decode(data.get("content") or "")
                return
            for item in data:
                if item.get("type") == "dir":
                    walk(str(item["path"]), out)
                elif item.get("type") == "file":
                    walk(str(item["path"]), out)

        def call() -> dict[str, bytes]:
            out: dict[str, bytes] = {}
            try:
                walk(folder, out)
            except GithubException as exc:
                if exc.status != 404:
                    raise
            return out

        return self._do(f"read {folder}/ at {ref[:12]}", call)

    def workflow_run(self, run_id: int) -> WorkflowRunInfo | None:
        from github import GithubException

        def call() -> WorkflowRunInfo | None:
            try:
                _, data = self.gh.requester.requestJsonAndCheck("GET", f"{self.repo.url}/actions/runs/{run_id}")
            except GithubException as exc:
                if exc.status == 404:
                    return None
                raise
            return WorkflowRunInfo(id=int(data["id"]), path=str(data.get("path") or ""),
                                   event=str(data.get("event") or ""), conclusion=data.get("conclusion"),
                                   head_branch=str(data.get("head_branch") or ""),
                                   created_at=str(data.get("created_at") or ""), status=str(data.get("status") or ""))

        return self._do(f"read workflow run {run_id}", call)

    # Actions: cancelling a training (`/cancel`) -----------------------------

    def unfinished_runs(self, workflow_file: str) -> list[WorkflowRunInfo]:
        """Runs of `.github/workflows/<workflow_file>` that have not completed (every status GitHub
        uses before `completed`), newest first."""
        assert re.fullmatch(r"[A-Za-z0-9_.-]+\.ya?ml", workflow_file), workflow_file

        def call() -> list[WorkflowRunInfo]:
            found: dict[int, WorkflowRunInfo] = {}
            for status in ("requested", "queued", "pending", "waiting", "in_progress"):
                _, data = self.gh.requester.requestJsonAndCheck(
                    "GET", f"{self.repo.url}/actions/workflows/{workflow_file}/runs",
                    parameters={"status": status, "per_page": 100})
                for run in (data or {}).get("workflow_runs", []):
                    found[int(run["id"])] = WorkflowRunInfo(
                        id=int(run["id"]), path=str(run.get("path") or ""), event=str(run.get("event") or ""),
                        conclusion=run.get("conclusion"), head_branch=str(run.get("head_branch") or ""),
                        created_at=str(run.get("created_at") or ""), status=str(run.get("status") or ""))
            return sorted(found.values(), key=lambda r: r.id, reverse=True)

        return self._do(f"list unfinished runs of {workflow_file}", call)

    def run_jobs(self, run_id: int) -> list[RunJob]:
        def call() -> list[RunJob]:
            out: list[RunJob] = []
            page = 1
            while True:
                _, data = self.gh.requester.requestJsonAndCheck(
                    "GET", f"{self.repo.url}/actions/runs/{run_id}/jobs", parameters={"per_page": 100, "page": page})
                jobs = (data or {}).get("jobs", [])
                out += [RunJob(name=str(j.get("name") or ""), status=str(j.get("status") or "")) for j in jobs]
                if len(jobs) < 100:
                    return out
                page += 1

        return self._do(f"list the jobs of workflow run {run_id}", call)

    def cancel_run(self, run_id: int) -> bool:
        """`POST /actions/runs/{id}/cancel`; False when it had completed meanwhile (409)."""
        from github import GithubException

        def call() -> bool:
            try:
                self.gh.requester.requestJsonAndCheck("POST", f"{self.repo.url}/actions/runs/{run_id}/cancel")
            except GithubException as exc:
                if exc.status == 409:
                    return False
                raise
            return True

        return self._do(f"cancel workflow run {run_id}", call)

    # RunnerHost -------------------------------------------------------------

    def runners(self) -> list[Runner]:
        def call() -> list[Runner]:
            return [Runner(id=r.id, name=r.name, status=r.status, busy=bool(r.busy),
                           labels=tuple(lab["name"] for lab in r.labels))
                    for r in self.repo.get_self_hosted_runners()]

        return self._do("list self-hosted runners", call)

    def remove_runner(self, runner_id: int) -> None:
        self._do(f"remove runner {runner_id}", lambda: self.repo.remove_self_hosted_runner(runner_id))

    # Organisation runners (just-in-time) ------------------------------------

    def _org_url(self, org: str) -> str:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]{0,38}", org), org
        return f"/orgs/{org}"

    def runner_groups(self, org: str) -> list[RunnerGroup]:
        def call() -> list[RunnerGroup]:
            _, data = self.gh.requester.requestJsonAndCheck(
                "GET", f"{self._org_url(org)}/actions/runner-groups", parameters={"per_page": 100})
            return [RunnerGroup(id=int(g["id"]), name=str(g["name"]), default=bool(g.get("default")),
                                restricted_to_workflows=bool(g.get("restricted_to_workflows")),
                                selected_workflows=tuple(str(w) for w in g.get("selected_workflows") or ()),
                                allows_public_repositories=bool(g.get("allows_public_repositories")),
                                visibility=str(g.get("visibility", "")))
                    for g in (data or {}).get("runner_groups", [])]

        return self._do(f"list the runner groups of {org}", call)

    def generate_jitconfig(self, org: str, body: dict[str, object]) -> JitRunner:
        """`POST /orgs/{org}/actions/runners/generate-jitconfig`: one runner for one job. Not
        retried (each call registers a runner)."""

        def call() -> JitRunner:
            _, data = self.gh.requester.requestJsonAndCheck(
                "POST", f"{self._org_url(org)}/actions/runners/generate-jitconfig", input=body)
            return JitRunner(id=int(data["runner"]["id"]), name=str(data["runner"]["name"]),
                             encoded_jit_config=str(data["encoded_jit_config"]))

        return self._do(f"generate a just-in-time runner in {org}", call)


def _comment(c: Any) -> Comment:
    created = c.created_at.isoformat() if getattr(c, "created_at", None) else ""
    return Comment(id=c.id, body=c.body or "", author=c.user.login if c.user else "", created_at=created)


# --------------------------------------------------------------------------- dry run


@dataclass
class DryRunCodeHost:
    """`CodeHost` without GitHub: comments live in `<out_dir>/comments.json` and each one is
    also written as `pr-<N>-comment-<id>.md` to read. Used without a token or with --dry-run;
    it behaves like the real thing (ids, find-then-edit), so the sticky logic is the same."""

    out_dir: Path
    bot_login: str = DEFAULT_BOT_LOGIN
    _state: dict[str, Any] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir).resolve()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        store = self.out_dir / "comments.json"
        self._state = json.loads(store.read_text()) if store.exists() else {"next_id": 1, "comments": []}

    def _save(self) -> None:
        tmp = self.out_dir / "comments.json.tmp"
        tmp.write_text(json.dumps(self._state, indent=1))
        tmp.replace(self.out_dir / "comments.json")

    def _write_md(self, c: dict[str, Any]) -> None:
        (self.out_dir / f"pr-{c['number']}-comment-{c['id']}.md").write_text(c["body"])

    def list_comments(self, number: int) -> list[Comment]:
        return [Comment(c["id"], c["body"], c["author"], c["created_at"])
                for c in self._state["comments"] if c["number"] == number]

    def create_comment(self, number: int, body: str) -> Comment:
        c = {"id": self._state["next_id"], "number": number, "body": body, "author": self.bot_login,
             "created_at": datetime.now(UTC).isoformat()}
        self._state["next_id"] += 1
        self._state["comments"].append(c)
        self._save()
        self._write_md(c)
        return Comment(c["id"], body, self.bot_login, c["created_at"])

    def edit_comment(self, comment_id: int, body: str) -> Comment:
        for c in self._state["comments"]:
            if c["id"] == comment_id:
                c["body"] = body
                self._save()
                self._write_md(c)
                return Comment(c["id"], body, c["author"], c["created_at"])
        raise GitHubError(f"edit comment {comment_id}: not found in the dry-run store {self.out_dir}")

    def delete_comment(self, comment_id: int) -> None:
        self._state["comments"] = [c for c in self._state["comments"] if c["id"] != comment_id]
        self._save()
        for path in self.out_dir.glob(f"pr-*-comment-{comment_id}.md"):
            path.unlink()

    def path_of(self, comment: Comment) -> Path:
        return next(self.out_dir.glob(f"pr-*-comment-{comment.id}.md"))
