"""A local GitHub REST emulator: the code host the tests drive through PyGithub itself.

Why an emulator and not mocks: the adapter's real risks live in HTTP (retries that repeat a
POST, pagination, rate-limit headers, absolute URLs PyGithub follows). This server answers on
127.0.0.1 with objects shaped like GitHub's (the field names and nesting of the real payloads;
every absolute URL points back at the emulator, as PyGithub requires) and can misbehave on
request: 5xx, rate-limit 403s with reset headers, slow answers, and "the write happened but
the answer was lost" (apply, then drop or time out).

Only the endpoints the project uses are implemented:

    GET    /rate_limit                                   GET /user
    GET    /repos/{o}/{r}
    GET    /repos/{o}/{r}/pulls/{n}      .../files       .../reviews     .../commits
    GET    /repos/{o}/{r}/issues/{n}     .../labels (GET, POST)   .../events
    GET    /repos/{o}/{r}/issues/{n}/comments (paginated)   POST (create)
    GET    /repos/{o}/{r}/issues/comments/{id}   PATCH   DELETE
    GET    /repos/{o}/{r}/collaborators/{user}/permission
    POST   /repos/{o}/{r}/statuses/{sha}
    GET    /repos/{o}/{r}/actions/runners (paginated)   GET/DELETE .../runners/{id}
    POST   /repos/{o}/{r}/actions/runners/registration-token
    GET    /repos/{o}/{r}/commits/{sha}/pulls           (the PRs a commit belongs to / was merged by)
    GET    /repos/{o}/{r}/contents/{path}?ref=          (files of a commit: `add_tree` or a git repo)
    GET    /repos/{o}/{r}/actions/runs/{id}             (workflow runs: `add_workflow_run`)
    GET    /orgs/{org}/actions/runner-groups            (`add_runner_group`)
    POST   /orgs/{org}/actions/runners/generate-jitconfig (just-in-time runners; bodies in `jit_requests`)

Tokens: `token` never expires; `issue_token(ttl)` mints one that answers 401 after `ttl`
seconds, like a job's GITHUB_TOKEN after its lifetime. `latency` delays every request
(races between concurrent writers show up the way they do against the real API).

Usage::

    with GitHubEmulator() as gh:
        gh.add_repo("acme/lab")
        gh.add_user("alice", permission="write")
        gh.add_pull("acme/lab", author="bob", head_sha="a" * 40, files=["experiments/x.yaml"])
        gh.inject("POST", r"/issues/\\d+/comments$", status=502, apply=True)
        ... PyGithub with base_url=gh.base_url ...
        assert len(gh.comments("acme/lab", 1)) == 1
"""

from __future__ import annotations

import base64
import copy
import json
import re
import secrets
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

REAL_API = "https://api.github.com"


def _now_iso() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


@dataclass
class Fault:
    """One injected misbehaviour, consumed `count` times by matching requests."""

    method: str
    path_regex: str
    status: int | None = None
    count: int = 1
    delay: float = 0.0
    rate_limit_reset: int | None = None
    apply: bool = False
    drop: bool = False
    message: str | None = None
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        return self.count > 0 and self.method in (method, "*") and re.search(self.path_regex, path) is not None


@dataclass
class Repo:
    full_name: str
    id: int
    private: bool = False
    pulls: dict[int, dict[str, Any]] = field(default_factory=dict)
    issues: dict[int, dict[str, Any]] = field(default_factory=dict)
    files: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    reviews: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    events: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    comments: dict[int, dict[str, Any]] = field(default_factory=dict)
    runners: dict[int, dict[str, Any]] = field(default_factory=dict)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] | None = None
    next_number: int = 1
    trees: dict[str, dict[str, bytes]] = field(default_factory=dict)
    git_dir: str | None = None
    workflow_runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    commits: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # PR -> its commits, oldest first


@dataclass
class Org:
    """An organisation's runner groups and the just-in-time runners registered in them."""

    login: str
    runner_groups: dict[int, dict[str, Any]] = field(default_factory=dict)
    runners: dict[int, dict[str, Any]] = field(default_factory=dict)


class GitHubEmulator:
    """The server, its state (inspect it in asserts) and the fault-injection switchboard."""

    def __init__(self, *, token: str = "emulator-token", bot_login: str = "github-actions[bot]"):
        self.token = token
        self.tokens: dict[str, float | None] = {token: None}  # token -> expiry (epoch s), None = never
        self.latency = 0.0
        self.bot_login = bot_login
        self.users: dict[str, dict[str, Any]] = {}
        self.permissions: dict[tuple[str, str], str] = {}
        self.repos: dict[str, Repo] = {}
        self.orgs: dict[str, Org] = {}
        self.hooks: list[list[Any]] = []  # [method, path regex, body text, action], see `after`
        self.jit_requests: list[dict[str, Any]] = []  # bodies of generate-jitconfig calls
        self.faults: list[Fault] = []
        self.log: list[list[Any]] = []  # [method, path, status, token]; status 0 until answered (or dropped)
        self.registration_tokens: list[str] = []
        self.history: list[tuple[int, str]] = []  # (comment id, body) of every create and edit, in order
        self._ids = 1000
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.add_user(bot_login, type="Bot")

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> GitHubEmulator:
        handler = _make_handler(self)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        server = self._server
        self._thread = threading.Thread(target=lambda: server.serve_forever(poll_interval=0.05),
                                        name="github-emulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> GitHubEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        assert self._server is not None, "start() the emulator first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # ------------------------------------------------------------------ faults

    def inject(
        self,
        method: str,
        path_regex: str,
        *,
        status: int | None = None,
        count: int = 1,
        delay: float = 0.0,
        rate_limit_reset: int | None = None,
        apply: bool = False,
        drop: bool = False,
        message: str | None = None,
    ) -> Fault:
        """Misbehave on the next `count` requests matching `method` (or "*") and `path_regex`.

        status: answer with this code instead (403 + `rate_limit_reset` = primary rate limit
        with `X-RateLimit-Remaining: 0` and `X-RateLimit-Reset`); delay: wait this long before
        answering (longer than the client's timeout = a timeout); apply: perform the request
        first, so a write lands even though the client sees a failure; drop: close the
        connection without any answer.
        """
        fault = Fault(method.upper(), path_regex, status, count, delay, rate_limit_reset, apply, drop, message)
        with self._lock:
            self.faults.append(fault)
        return fault

    def after(self, method: str, path_regex: str, action: Callable[[], None], *,
              body_contains: str | None = None) -> None:
        """Run `action` once, after the first successful request matching `method`, `path_regex`
        and (for writes) a JSON body whose text contains `body_contains`: the world changing at a
        given moment of a run (e.g. a push right after the bot says which commit it will train)."""
        with self._lock:
            self.hooks.append([method.upper(), path_regex, body_contains, action])

    def _run_hooks(self, method: str, path: str, body: Any) -> None:
        with self._lock:
            due = [h for h in self.hooks if h[0] in (method, "*") and re.search(h[1], path)
                   and (h[2] is None or h[2] in json.dumps(body, ensure_ascii=False))]
            for h in due:
                self.hooks.remove(h)
        for h in due:
            h[3]()

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.matches(method, path):
                    fault.count -= 1
                    fault.hits += 1
                    return fault
        return None

    # ------------------------------------------------------------------ state builders

    def _next_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids

    def add_user(self, login: str, *, type: str = "User") -> dict[str, Any]:
        user = {"login": login, "id": self._next_id(), "type": type}
        self.users[login] = user
        return user

    def set_permission(self, repo: str, login: str, permission: str) -> None:
        """permission: admin, maintain, write, triage, read or none (GitHub's role names)."""
        if login not in self.users:
            self.add_user(login)
        self.permissions[(repo, login)] = permission

    def add_repo(self, full_name: str, *, private: bool = False) -> Repo:
        repo = Repo(full_name=full_name, id=self._next_id(), private=private)
        self.repos[full_name] = repo
        owner = full_name.split("/")[0]
        if owner not in self.users:
            self.add_user(owner)
        self.permissions.setdefault((full_name, owner), "admin")
        return repo

    def add_pull(
        self,
        repo: str,
        *,
        author: str,
        head_sha: str,
        number: int | None = None,
        title: str = "Add an experiment",
        body: str | None = "Proposes an experiment.",
        head_ref: str = "experiment",
        base_ref: str = "main",
        base_sha: str = "0" * 40,
        head_repo: str | None = None,
        files: list[str] | tuple[str, ...] = (),
        labels: list[str] | tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """A pull request; `head_repo` other than `repo` makes it a PR from a fork."""
        r = self.repos[repo]
        if author not in self.users:
            self.add_user(author)
        number = number or r.next_number
        r.next_number = max(r.next_number, number) + 1
        now = _now_iso()
        pr = {
            "id": self._next_id(),
            "node_id": f"PR_{secrets.token_hex(6)}",
            "number": number,
            "state": "open",
            "locked": False,
            "title": title,
            "user": author,
            "body": body,
            "created_at": now,
            "updated_at": now,
            "closed_at": None,
            "merged_at": None,
            "merge_commit_sha": None,
            "draft": False,
            "merged": False,
            "merged_by": None,
            "head": {"ref": head_ref, "sha": head_sha, "repo": head_repo or repo},
            "base": {"ref": base_ref, "sha": base_sha, "repo": repo},
            "labels": [self._label(repo, name) for name in labels],
        }
        r.pulls[number] = pr
        r.issues[number] = {"number": number, "pull": True}
        r.files[number] = [{"filename": f, "status": "added"} for f in files]
        r.reviews[number] = []
        r.events[number] = []
        r.commits[number] = [{"sha": head_sha, "author": author, "committer": author, "date": now}]
        return pr

    def issue_token(self, ttl: float | None = None) -> str:
        """A new valid token; after `ttl` seconds it answers 401 Bad credentials."""
        token = "ghs_" + secrets.token_hex(18)
        self.tokens[token] = None if ttl is None else time.time() + ttl
        return token

    def expire_token(self, token: str) -> None:
        self.tokens[token] = time.time() - 1

    def add_tree(self, repo: str, sha: str, files: dict[str, str | bytes]) -> None:
        """The files of commit `sha`, served by the contents API."""
        self.repos[repo].trees[sha] = {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}

    def serve_git(self, repo: str, git_dir: str) -> None:
        """Serve the contents API for any commit of this local git repository."""
        self.repos[repo].git_dir = git_dir

    def add_workflow_run(self, repo: str, run_id: int, *, path: str, event: str, head_sha: str = "0" * 40,
                         status: str = "completed", conclusion: str | None = "success",
                         head_branch: str = "main") -> dict[str, Any]:
        run = {"id": run_id, "path": path, "event": event, "head_sha": head_sha, "status": status,
               "conclusion": conclusion, "head_branch": head_branch, "created_at": _now_iso(),
               "name": path.rsplit("/", 1)[-1].rsplit(".", 1)[0]}
        self.repos[repo].workflow_runs[run_id] = run
        return run

    def add_job(self, repo: str, run_id: int, name: str, *, status: str = "in_progress",
                conclusion: str | None = None) -> None:
        """A job of workflow run `run_id` (`GET /actions/runs/{id}/jobs`)."""
        run = self.repos[repo].workflow_runs[run_id]
        run.setdefault("_jobs", []).append({"id": self._next_id(), "run_id": run_id, "name": name,
                                            "status": status, "conclusion": conclusion})

    def add_approval(self, repo: str, run_id: int, *, user: str, environments: tuple[str, ...] = ("gpu-training",),
                     state: str = "approved") -> None:
        """An environment review of run `run_id` (`GET /actions/runs/{id}/approvals`)."""
        if user not in self.users:
            self.add_user(user)
        self.repos[repo].workflow_runs[run_id].setdefault("_approvals", []).append(
            {"state": state, "comment": "", "environments": [{"name": e} for e in environments], "user": user})

    def add_issue(self, repo: str, *, author: str, title: str = "A question", body: str | None = None) -> int:
        r = self.repos[repo]
        number = r.next_number
        r.next_number += 1
        r.issues[number] = {"number": number, "pull": False, "title": title, "user": author, "body": body,
                            "created_at": _now_iso()}
        return number

    def push(self, repo: str, number: int, new_sha: str, files: dict[str, str | bytes] | None = None,
             *, pusher: str | None = None, force: bool = False) -> None:
        """A new commit on the PR's head branch (its tree: the old head's, updated with `files`),
        authored and committed by `pusher` (default the PR's author); `force` also records the
        `head_ref_force_pushed` issue event GitHub writes, with the pusher as actor."""
        r = self.repos[repo]
        pr = r.pulls[number]
        who = pusher or pr["user"]
        if who not in self.users:
            self.add_user(who)
        r.commits.setdefault(number, []).append({"sha": new_sha, "author": who, "committer": who, "date": _now_iso()})
        if force:
            r.events.setdefault(number, []).append({"id": self._next_id(), "actor": who, "event": "head_ref_force_pushed",
                                                    "created_at": _now_iso(), "label": None})
        old_tree = r.trees.get(pr["head"]["sha"])
        if old_tree is not None or files:
            self.add_tree(repo, new_sha, {**(old_tree or {}), **(files or {})})
        pr["head"]["sha"] = new_sha
        pr["updated_at"] = _now_iso()

    def merge(self, repo: str, number: int, *, merged_by: str, merge_commit_sha: str | None = None) -> str:
        """Merge the PR; returns the merge commit's SHA (what the push to the base branch carries)."""
        pr = self.repos[repo].pulls[number]
        sha = merge_commit_sha or secrets.token_hex(20)
        pr.update(state="closed", merged=True, merged_by=merged_by, merged_at=_now_iso(), closed_at=_now_iso(),
                  merge_commit_sha=sha)
        return sha

    def add_review(
        self, repo: str, number: int, *, user: str, state: str = "APPROVED", commit_id: str | None = None,
        body: str = "",
    ) -> dict[str, Any]:
        """A submitted review; `commit_id` defaults to the PR's current head (state in REST's upper case)."""
        r = self.repos[repo]
        if user not in self.users:
            self.add_user(user)
        review = {
            "id": self._next_id(),
            "user": user,
            "body": body,
            "state": state.upper(),
            "commit_id": commit_id or r.pulls[number]["head"]["sha"],
            "submitted_at": _now_iso(),
        }
        r.reviews[number].append(review)
        return review

    def add_comment(self, repo: str, number: int, *, user: str, body: str) -> dict[str, Any]:
        if user not in self.users:
            self.add_user(user)
        return self._create_comment(self.repos[repo], number, user, body)

    def add_label(self, repo: str, number: int, name: str, *, actor: str) -> None:
        """Apply a label as `actor` (recorded as a `labeled` issue event, like GitHub does)."""
        r = self.repos[repo]
        pr = r.pulls[number]
        if name not in [lab["name"] for lab in pr["labels"]]:
            pr["labels"].append(self._label(repo, name))
        r.events[number].append({"id": self._next_id(), "event": "labeled", "actor": actor, "label": name,
                                 "created_at": _now_iso()})

    def add_runner_group(self, org: str, name: str, *, default: bool = False, restricted_to_workflows: bool = False,
                         selected_workflows: list[str] | tuple[str, ...] = (), allows_public_repositories: bool = False,
                         visibility: str = "selected") -> int:
        """A runner group of organisation `org` (created on first use), as the REST API shows it."""
        o = self.orgs.setdefault(org, Org(org))
        gid = self._next_id()
        o.runner_groups[gid] = {"id": gid, "name": name, "visibility": visibility, "default": default,
                                "inherited": False, "allows_public_repositories": allows_public_repositories,
                                "restricted_to_workflows": restricted_to_workflows,
                                "selected_workflows": list(selected_workflows),
                                "workflow_restrictions_read_only": False,
                                "runners_url": f"{self.base_url}/orgs/{org}/actions/runner-groups/{gid}/runners"}
        return gid

    def add_runner(
        self, repo: str, *, name: str, labels: list[str] | tuple[str, ...], status: str = "online",
        busy: bool = False, os: str = "Linux",
    ) -> dict[str, Any]:
        runner_id = self._next_id()
        runner = {
            "id": runner_id,
            "name": name,
            "os": os,
            "status": status,
            "busy": busy,
            "labels": [{"id": i + 1, "name": lab, "type": "read-only" if lab == "self-hosted" else "custom"}
                       for i, lab in enumerate(["self-hosted", "Linux", "X64", *labels])],
        }
        self.repos[repo].runners[runner_id] = runner
        return runner

    def load_payload(self, payload: dict[str, Any]) -> None:
        """Serve the objects of a real webhook payload (conformance): its repository, pull
        request, issue and comment, with their URLs rebased onto this emulator."""
        data = self._rebase(copy.deepcopy(payload))
        repo_obj = data.get("repository")
        if not repo_obj:
            return
        full_name = repo_obj["full_name"]
        r = self.repos.get(full_name) or self.add_repo(full_name)
        r.raw = repo_obj
        if "pull_request" in data and data["pull_request"].get("head"):
            pr = data["pull_request"]
            pr["_raw"] = True
            r.pulls[pr["number"]] = pr
            r.files.setdefault(pr["number"], [])
            r.reviews.setdefault(pr["number"], [])
            r.events.setdefault(pr["number"], [])
            if "review" in data:
                review = data["review"]
                review["_raw"] = True
                r.reviews[pr["number"]].append(review)
            # Some published examples point the PR's own `url` at another repository/number;
            # PyGithub follows that URL for files and reviews, so serve it there too.
            m = re.match(r"^/repos/([^/]+/[^/]+)/pulls/(\d+)$", urlparse(pr.get("url", "")).path)
            if m and (m.group(1), int(m.group(2))) != (full_name, pr["number"]):
                alias = self.repos.get(m.group(1)) or self.add_repo(m.group(1))
                n = int(m.group(2))
                alias.pulls[n] = pr
                alias.files[n] = r.files[pr["number"]]
                alias.reviews[n] = r.reviews[pr["number"]]
                alias.events[n] = r.events[pr["number"]]
        if "issue" in data:
            issue = data["issue"]
            issue["_raw"] = True
            r.issues[issue["number"]] = issue
            if "comment" in data:
                comment = data["comment"]
                comment["_raw"] = True
                comment["_issue"] = issue["number"]
                r.comments[comment["id"]] = comment

    def _rebase(self, obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: self._rebase(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._rebase(v) for v in obj]
        if isinstance(obj, str) and obj.startswith(REAL_API):
            return self.base_url + obj[len(REAL_API):]
        return obj

    # ------------------------------------------------------------------ inspection

    def comments(self, repo: str, number: int) -> list[dict[str, Any]]:
        """The PR's (or issue's) comments as GitHub would list them, oldest first."""
        r = self.repos[repo]
        return [self._comment_json(r, c) for c in sorted(r.comments.values(), key=lambda c: c["id"])
                if c["_issue"] == number]

    def requests_by_token(self, token: str) -> list[tuple[str, str, int]]:
        """(method, path, status) of every request that presented `token`."""
        return [(e[0], e[1], e[2]) for e in list(self.log) if len(e) > 3 and e[3] == token]

    def requests_made(self, method: str | None = None, path_regex: str = "") -> list[tuple[str, str, int]]:
        """(method, path, status) of every request received, in arrival order (status 0: no answer)."""
        return [(e[0], e[1], e[2]) for e in list(self.log)
                if (method is None or e[0] == method) and re.search(path_regex, e[1])]

    # ------------------------------------------------------------------ JSON shapes

    def _user_json(self, login: str) -> dict[str, Any]:
        user = self.users.get(login) or self.add_user(login)
        b = self.base_url
        return {
            "login": login, "id": user["id"], "node_id": f"U_{user['id']}", "avatar_url": f"{b}/avatars/{login}",
            "gravatar_id": "", "url": f"{b}/users/{login}", "html_url": f"{b}/{login}",
            "followers_url": f"{b}/users/{login}/followers",
            "following_url": f"{b}/users/{login}/following{{/other_user}}",
            "gists_url": f"{b}/users/{login}/gists{{/gist_id}}",
            "starred_url": f"{b}/users/{login}/starred{{/owner}}{{/repo}}",
            "subscriptions_url": f"{b}/users/{login}/subscriptions", "organizations_url": f"{b}/users/{login}/orgs",
            "repos_url": f"{b}/users/{login}/repos", "events_url": f"{b}/users/{login}/events{{/privacy}}",
            "received_events_url": f"{b}/users/{login}/received_events",
            "type": user["type"], "user_view_type": "public", "site_admin": False,
        }

    def _label(self, repo: str, name: str) -> dict[str, Any]:
        return {"id": abs(hash((repo, name))) % 10**9, "node_id": f"LA_{name}", "name": name, "color": "ededed",
                "default": False, "description": None, "_repo": repo}

    def _label_json(self, label: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in label.items() if not k.startswith("_")}
        out["url"] = f"{self.base_url}/repos/{label['_repo']}/labels/{label['name']}"
        return out

    def _repo_json(self, r: Repo) -> dict[str, Any]:
        if r.raw is not None:
            return r.raw
        b, fn = self.base_url, r.full_name
        owner, name = fn.split("/")
        api = f"{b}/repos/{fn}"
        return {
            "id": r.id, "node_id": f"R_{r.id}", "name": name, "full_name": fn, "private": r.private,
            "owner": self._user_json(owner), "html_url": f"{b}/{fn}", "description": None, "fork": False,
            "url": api, "issues_url": f"{api}/issues{{/number}}", "pulls_url": f"{api}/pulls{{/number}}",
            "collaborators_url": f"{api}/collaborators{{/collaborator}}",
            "statuses_url": f"{api}/statuses/{{sha}}", "created_at": "2026-01-05T09:00:00Z",
            "updated_at": "2026-01-05T09:00:00Z", "pushed_at": "2026-01-05T09:00:00Z",
            "default_branch": "main", "visibility": "private" if r.private else "public",
            "permissions": {"admin": False, "maintain": False, "push": True, "triage": True, "pull": True},
        }

    def _ref_json(self, ref: dict[str, Any]) -> dict[str, Any]:
        repo_name = ref["repo"]
        owner = repo_name.split("/")[0]
        r = self.repos.get(repo_name)
        repo_json = self._repo_json(r) if r else {**self._repo_json(Repo(repo_name, 0)), "fork": True}
        return {"label": f"{owner}:{ref['ref']}", "ref": ref["ref"], "sha": ref["sha"],
                "user": self._user_json(owner), "repo": repo_json}

    def _pull_json(self, r: Repo, pr: dict[str, Any]) -> dict[str, Any]:
        if pr.get("_raw"):
            return {k: v for k, v in pr.items() if not k.startswith("_")}
        b, fn, n = self.base_url, r.full_name, pr["number"]
        api = f"{b}/repos/{fn}"
        out = {k: v for k, v in pr.items() if k not in ("user", "head", "base", "labels", "merged_by")}
        out.update(
            url=f"{api}/pulls/{n}", html_url=f"{b}/{fn}/pull/{n}", diff_url=f"{b}/{fn}/pull/{n}.diff",
            patch_url=f"{b}/{fn}/pull/{n}.patch", issue_url=f"{api}/issues/{n}",
            commits_url=f"{api}/pulls/{n}/commits", review_comments_url=f"{api}/pulls/{n}/comments",
            review_comment_url=f"{api}/pulls/comments{{/number}}", comments_url=f"{api}/issues/{n}/comments",
            statuses_url=f"{api}/statuses/{pr['head']['sha']}",
            user=self._user_json(pr["user"]), head=self._ref_json(pr["head"]), base=self._ref_json(pr["base"]),
            labels=[self._label_json(lab) for lab in pr["labels"]],
            merged_by=self._user_json(pr["merged_by"]) if pr["merged_by"] else None,
            assignee=None, assignees=[], requested_reviewers=[], requested_teams=[], milestone=None,
            author_association=self._association(r, pr["user"]), auto_merge=None, active_lock_reason=None,
            mergeable=True, rebaseable=True, mergeable_state="clean",
            comments=sum(1 for c in r.comments.values() if c["_issue"] == n),
            review_comments=0, maintainer_can_modify=False, commits=1, additions=1, deletions=0,
            changed_files=len(r.files.get(n, [])),
            _links={"self": {"href": f"{api}/pulls/{n}"}, "issue": {"href": f"{api}/issues/{n}"},
                    "comments": {"href": f"{api}/issues/{n}/comments"}},
        )
        return out

    def _issue_json(self, r: Repo, number: int) -> dict[str, Any]:
        issue = r.issues[number]
        if issue.get("_raw"):
            return {k: v for k, v in issue.items() if not k.startswith("_")}
        b, fn = self.base_url, r.full_name
        api = f"{b}/repos/{fn}"
        if issue["pull"]:
            pr = r.pulls[number]
            title, user, body, created, labels = pr["title"], pr["user"], pr["body"], pr["created_at"], pr["labels"]
        else:
            title, user, body, created, labels = (issue["title"], issue["user"], issue["body"],
                                                  issue["created_at"], [])
        out = {
            "url": f"{api}/issues/{number}", "repository_url": api, "html_url": f"{b}/{fn}/issues/{number}",
            "comments_url": f"{api}/issues/{number}/comments", "labels_url": f"{api}/issues/{number}/labels{{/name}}",
            "events_url": f"{api}/issues/{number}/events", "id": self._ids + number, "node_id": f"I_{number}",
            "number": number, "title": title, "user": self._user_json(user),
            "labels": [self._label_json(lab) for lab in labels], "state": "open", "locked": False,
            "assignee": None, "assignees": [], "milestone": None,
            "comments": sum(1 for c in r.comments.values() if c["_issue"] == number),
            "created_at": created, "updated_at": created, "closed_at": None,
            "author_association": self._association(r, user), "active_lock_reason": None, "body": body,
        }
        if issue["pull"]:
            out["pull_request"] = {"url": f"{api}/pulls/{number}", "html_url": f"{b}/{fn}/pull/{number}",
                                   "diff_url": f"{b}/{fn}/pull/{number}.diff",
                                   "patch_url": f"{b}/{fn}/pull/{number}.patch", "merged_at": None}
        return out

    def _association(self, r: Repo, login: str) -> str:
        perm = self.permissions.get((r.full_name, login), "none")
        if login == r.full_name.split("/")[0]:
            return "OWNER"
        return "COLLABORATOR" if perm in ("admin", "maintain", "write", "triage") else "CONTRIBUTOR"

    def _comment_json(self, r: Repo, c: dict[str, Any]) -> dict[str, Any]:
        if c.get("_raw"):
            return {k: v for k, v in c.items() if not k.startswith("_")}
        b, fn, n, cid = self.base_url, r.full_name, c["_issue"], c["id"]
        api = f"{b}/repos/{fn}"
        return {
            "url": f"{api}/issues/comments/{cid}", "html_url": f"{b}/{fn}/issues/{n}#issuecomment-{cid}",
            "issue_url": f"{api}/issues/{n}", "id": cid, "node_id": f"IC_{cid}", "user": self._user_json(c["user"]),
            "created_at": c["created_at"], "updated_at": c["updated_at"],
            "author_association": self._association(r, c["user"]), "performed_via_github_app": None,
            "body": c["body"],
            "reactions": {"url": f"{api}/issues/comments/{cid}/reactions", "total_count": 0, "+1": 0, "-1": 0,
                          "laugh": 0, "hooray": 0, "confused": 0, "heart": 0, "rocket": 0, "eyes": 0},
        }

    def _review_json(self, r: Repo, number: int, rv: dict[str, Any]) -> dict[str, Any]:
        if rv.get("_raw"):
            return {k: v for k, v in rv.items() if not k.startswith("_")}
        b, fn = self.base_url, r.full_name
        html = f"{b}/{fn}/pull/{number}#pullrequestreview-{rv['id']}"
        return {
            "id": rv["id"], "node_id": f"PRR_{rv['id']}", "user": self._user_json(rv["user"]), "body": rv["body"],
            "commit_id": rv["commit_id"], "submitted_at": rv["submitted_at"], "state": rv["state"],
            "html_url": html, "pull_request_url": f"{b}/repos/{fn}/pulls/{number}",
            "author_association": self._association(r, rv["user"]),
            "_links": {"html": {"href": html}, "pull_request": {"href": f"{b}/repos/{fn}/pulls/{number}"}},
        }

    def _file_json(self, r: Repo, f: dict[str, Any]) -> dict[str, Any]:
        b, fn, name = self.base_url, r.full_name, f["filename"]
        sha = format(abs(hash(name)), "040x")[:40]
        return {"sha": sha, "filename": name, "status": f["status"], "additions": 1, "deletions": 0, "changes": 1,
                "blob_url": f"{b}/{fn}/blob/{sha}/{name}", "raw_url": f"{b}/{fn}/raw/{sha}/{name}",
                "contents_url": f"{b}/repos/{fn}/contents/{name}?ref={sha}", "patch": "@@ -0,0 +1 @@\n+name: x"}

    def _event_json(self, r: Repo, number: int, ev: dict[str, Any]) -> dict[str, Any]:
        return {"id": ev["id"], "node_id": f"LE_{ev['id']}", "url": f"{self.base_url}/repos/{r.full_name}/issues/events/{ev['id']}",
                "actor": self._user_json(ev["actor"]), "event": ev["event"], "commit_id": None, "commit_url": None,
                "created_at": ev["created_at"],
                **({"label": {"name": ev["label"], "color": "ededed"}} if ev.get("label") else {}),
                "performed_via_github_app": None}

    def _commit_json(self, r: Repo, c: dict[str, Any]) -> dict[str, Any]:
        b = self.base_url
        person = {"name": c["author"], "email": f"{c['author']}@users.noreply.github.com", "date": c["date"]}
        return {"sha": c["sha"], "node_id": f"C_{c['sha'][:12]}", "url": f"{b}/repos/{r.full_name}/commits/{c['sha']}",
                "html_url": f"{b}/{r.full_name}/commit/{c['sha']}", "comments_url": f"{b}/repos/{r.full_name}/commits/{c['sha']}/comments",
                "commit": {"author": person, "committer": {**person, "name": c["committer"]}, "message": "a commit",
                           "url": f"{b}/repos/{r.full_name}/git/commits/{c['sha']}", "comment_count": 0},
                "author": self._user_json(c["author"]), "committer": self._user_json(c["committer"]), "parents": []}

    # ------------------------------------------------------------------ mutations

    def _create_comment(self, r: Repo, number: int, user: str, body: str) -> dict[str, Any]:
        now = _now_iso()
        with self._lock:
            c = {"id": self._next_id(), "_issue": number, "user": user, "body": body, "created_at": now,
                 "updated_at": now}
            r.comments[c["id"]] = c
            self.history.append((c["id"], body))
        return self._comment_json(r, c)

    # ------------------------------------------------------------------ request handling

    def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any, dict[str, str]]:
        """Route one request; returns (status, JSON, extra headers)."""
        for pattern, verb, fn in _ROUTES:
            m = re.fullmatch(pattern, path)
            if m and verb == method:
                with self._lock:
                    return fn(self, query, body, **m.groupdict())
        return 404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}, {}

    def _repo(self, owner: str, repo: str) -> Repo:
        r = self.repos.get(f"{owner}/{repo}")
        if r is None:
            raise _NotFound()
        return r

    def _paginate(self, path: str, query: dict[str, str], items: list[Any]) -> tuple[list[Any], dict[str, str]]:
        per_page = max(1, min(100, int(query.get("per_page", 30))))
        page = max(1, int(query.get("page", 1)))
        last = max(1, -(-len(items) // per_page))
        links = []
        for rel, p in (("prev", page - 1), ("next", page + 1), ("last", last), ("first", 1)):
            if (rel == "prev" and page > 1) or (rel == "next" and page < last) or rel in ("last", "first"):
                q = {**query, "per_page": per_page, "page": p}
                links.append(f'<{self.base_url}{path}?{urlencode(q)}>; rel="{rel}"')
        return items[(page - 1) * per_page: page * per_page], {"Link": ", ".join(links)}


class _NotFound(Exception):
    pass


def _r_rate_limit(em: GitHubEmulator, q: dict, body: Any) -> tuple[int, Any, dict]:
    reset = int(time.time()) + 3600
    core = {"limit": 5000, "used": 1, "remaining": 4999, "reset": reset}
    return 200, {"resources": {"core": core, "search": {**core, "limit": 30, "remaining": 30},
                               "graphql": core}, "rate": core}, {}


def _r_user(em: GitHubEmulator, q: dict, body: Any) -> tuple[int, Any, dict]:
    return 200, em._user_json(em.bot_login), {}


def _r_repo(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str) -> tuple[int, Any, dict]:
    return 200, em._repo_json(em._repo(owner, repo)), {}


def _pull(em: GitHubEmulator, owner: str, repo: str, n: str) -> tuple[Repo, dict]:
    r = em._repo(owner, repo)
    if int(n) not in r.pulls:
        raise _NotFound()
    return r, r.pulls[int(n)]


def _r_pull(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, n: str) -> tuple[int, Any, dict]:
    r, pr = _pull(em, owner, repo, n)
    return 200, em._pull_json(r, pr), {}


def _r_pull_files(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, n: str) -> tuple[int, Any, dict]:
    r, _ = _pull(em, owner, repo, n)
    items, headers = em._paginate(f"/repos/{owner}/{repo}/pulls/{n}/files", q,
                                  [em._file_json(r, f) for f in r.files[int(n)]])
    return 200, items, headers


def _r_pull_reviews(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, n: str) -> tuple[int, Any, dict]:
    r, _ = _pull(em, owner, repo, n)
    items, headers = em._paginate(f"/repos/{owner}/{repo}/pulls/{n}/reviews", q,
                                  [em._review_json(r, int(n), rv) for rv in r.reviews[int(n)]])
    return 200, items, headers


def _r_pull_commits(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, n: str) -> tuple[int, Any, dict]:
    r, _ = _pull(em, owner, repo, n)
    # As GitHub: at most 250 commits, the oldest first (a longer PR's head is not in the list).
    items, headers = em._paginate(f"/repos/{owner}/{repo}/pulls/{n}/commits", q,
                                  [em._commit_json(r, c) for c in r.commits.get(int(n), [])[:250]])
    return 200, items, headers


def _r_commit(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, sha: str) -> tuple[int, Any, dict]:
    r = em._repo(owner, repo)
    for commits in r.commits.values():
        for c in commits:
            if c["sha"] == sha:
                return 200, {**em._commit_json(r, c), "files": [], "stats": {}}, {}
    raise _NotFound()


def _issue(em: GitHubEmulator, owner: str, repo: str, n: str) -> Repo:
    r = em._repo(owner, repo)
    if int(n) not in r.issues:
        raise _NotFound()
    return r


def _r_issue(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, n: str) -> tuple[int, Any, dict]:
    r = _issue(em, owner, repo, n)
    return 200, em._issue_json(r, int(n)), {}


def _r_list_comments(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, n: str) -> tuple[int, Any, dict]:
    _issue(em, owner, repo, n)
    items, headers = em._paginate(f"/repos/{owner}/{repo}/issues/{n}/comments", q, em.comments(f"{owner}/{repo}", int(n)))
    return 200, items, headers


def _r_create_comment(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, n: str) -> tuple[int, Any, dict]:
    r = _issue(em, owner, repo, n)
    if not isinstance(body, dict) or not isinstance(body.get("body"), str):
        return 422, {"message": "Invalid request.\n\n\"body\" wasn't supplied."}, {}
    if len(body["body"]) > 65536:
        return 422, {"message": "Validation Failed", "errors": [{"resource": "IssueComment", "code": "custom",
                                                               "field": "body", "message": "body is too long (maximum is 65536 characters)"}]}, {}
    return 201, em._create_comment(r, int(n), em.bot_login, body["body"]), {}


def _comment(em: GitHubEmulator, owner: str, repo: str, cid: str) -> tuple[Repo, dict]:
    r = em._repo(owner, repo)
    if int(cid) not in r.comments:
        raise _NotFound()
    return r, r.comments[int(cid)]


def _r_get_comment(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, cid: str) -> tuple[int, Any, dict]:
    r, c = _comment(em, owner, repo, cid)
    return 200, em._comment_json(r, c), {}


def _r_edit_comment(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, cid: str) -> tuple[int, Any, dict]:
    r, c = _comment(em, owner, repo, cid)
    if c["user"] != em.bot_login:
        return 403, {"message": "Must have admin rights to Repository."}, {}
    if len(body.get("body", "")) > 65536:
        return 422, {"message": "Validation Failed"}, {}
    c["body"] = body["body"]
    c["updated_at"] = _now_iso()
    em.history.append((c["id"], c["body"]))
    return 200, em._comment_json(r, c), {}


def _r_delete_comment(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, cid: str) -> tuple[int, Any, dict]:
    r, c = _comment(em, owner, repo, cid)
    del r.comments[int(cid)]
    return 204, None, {}


def _r_labels(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, n: str) -> tuple[int, Any, dict]:
    r, pr = _pull(em, owner, repo, n)
    return 200, [em._label_json(lab) for lab in pr["labels"]], {}


def _r_add_labels(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, n: str) -> tuple[int, Any, dict]:
    r, pr = _pull(em, owner, repo, n)
    names = body.get("labels", []) if isinstance(body, dict) else body
    for name in names:
        em.add_label(r.full_name, int(n), name, actor=em.bot_login)
    return 200, [em._label_json(lab) for lab in pr["labels"]], {}


def _r_events(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, n: str) -> tuple[int, Any, dict]:
    r = _issue(em, owner, repo, n)
    items, headers = em._paginate(f"/repos/{owner}/{repo}/issues/{n}/events", q,
                                  [em._event_json(r, int(n), ev) for ev in r.events.get(int(n), [])])
    return 200, items, headers


def _r_permission(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, user: str) -> tuple[int, Any, dict]:
    em._repo(owner, repo)
    if user not in em.users:
        return 404, {"message": f"{user} is not a user", "documentation_url": "https://docs.github.com/rest"}, {}
    role = em.permissions.get((f"{owner}/{repo}", user), "read")
    legacy = {"admin": "admin", "maintain": "write", "write": "write", "triage": "read", "read": "read"}.get(role, "none")
    return 200, {"permission": legacy, "role_name": role, "user": em._user_json(user)}, {}


def _r_status(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, sha: str) -> tuple[int, Any, dict]:
    r = em._repo(owner, repo)
    status = {"id": em._next_id(), "url": f"{em.base_url}/repos/{owner}/{repo}/statuses/{sha}", "sha": sha,
              "state": body.get("state"), "context": body.get("context", "default"),
              "description": body.get("description"), "target_url": body.get("target_url"),
              "creator": em._user_json(em.bot_login), "created_at": _now_iso(), "updated_at": _now_iso()}
    r.statuses.append(status)
    return 201, status, {}


def _r_runners(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str) -> tuple[int, Any, dict]:
    r = em._repo(owner, repo)
    runners = sorted(r.runners.values(), key=lambda x: x["id"])
    items, headers = em._paginate(f"/repos/{owner}/{repo}/actions/runners", q, runners)
    return 200, {"total_count": len(runners), "runners": items}, headers


def _r_runner(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, rid: str) -> tuple[int, Any, dict]:
    r = em._repo(owner, repo)
    if int(rid) not in r.runners:
        raise _NotFound()
    return 200, r.runners[int(rid)], {}


def _r_delete_runner(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, rid: str) -> tuple[int, Any, dict]:
    r = em._repo(owner, repo)
    if r.runners.pop(int(rid), None) is None:
        raise _NotFound()
    return 204, None, {}


def _r_registration_token(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str) -> tuple[int, Any, dict]:
    em._repo(owner, repo)
    token = "R" + secrets.token_hex(14).upper()
    em.registration_tokens.append(token)
    expires = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0).isoformat()
    return 201, {"token": token, "expires_at": expires}, {}


def _r_runner_groups(em: GitHubEmulator, q: dict, body: Any, org: str) -> tuple[int, Any, dict]:
    o = em.orgs.get(org)
    if o is None:
        return 404, {"message": "Not Found"}, {}
    groups = list(o.runner_groups.values())
    return 200, {"total_count": len(groups), "runner_groups": groups}, {}


def _r_generate_jitconfig(em: GitHubEmulator, q: dict, body: Any, org: str) -> tuple[int, Any, dict]:
    """As GitHub: name, runner_group_id, labels (1-100) required; 409 for a taken name."""
    o = em.orgs.get(org)
    if o is None:
        return 404, {"message": "Not Found"}, {}
    if not isinstance(body, dict) or not body.get("name") or not body.get("labels") or \
            int(body.get("runner_group_id", 0)) not in o.runner_groups:
        return 422, {"message": "Validation Failed"}, {}
    if any(r["name"] == body["name"] for r in o.runners.values()):
        return 409, {"message": "Already exists - A runner with the same name already exists."}, {}
    em.jit_requests.append(dict(body))
    rid = em._next_id()
    runner = {"id": rid, "name": body["name"], "os": "unknown", "status": "offline", "busy": False,
              "runner_group_id": int(body["runner_group_id"]),
              "labels": [{"id": i + 1, "name": n, "type": "custom" if n != "self-hosted" else "read-only"}
                         for i, n in enumerate(body["labels"])]}
    o.runners[rid] = runner
    config = "eyJ" + secrets.token_hex(24)  # base64-looking, opaque
    return 201, {"runner": runner, "encoded_jit_config": config}, {}


def _r_commit_pulls(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, sha: str) -> tuple[int, Any, dict]:
    r = em._repo(owner, repo)
    found = [pr for pr in r.pulls.values() if sha in (pr.get("merge_commit_sha"), (pr.get("head") or {}).get("sha"))]
    items, headers = em._paginate(f"/repos/{owner}/{repo}/commits/{sha}/pulls", q,
                                  [em._pull_json(r, pr) for pr in sorted(found, key=lambda p: p["number"])])
    return 200, items, headers


def _git_tree(r: Repo, ref: str) -> dict[str, bytes] | None:
    if ref in r.trees:
        return r.trees[ref]
    if r.git_dir is None:
        return None
    listed = subprocess.run(["git", "-C", r.git_dir, "ls-tree", "-r", "--name-only", ref],
                            capture_output=True, text=True)
    if listed.returncode != 0:
        return None
    out = {}
    for name in listed.stdout.splitlines():
        shown = subprocess.run(["git", "-C", r.git_dir, "show", f"{ref}:{name}"], capture_output=True)
        out[name] = shown.stdout
    r.trees[ref] = out
    return out


def _r_contents(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, path: str) -> tuple[int, Any, dict]:
    r = em._repo(owner, repo)
    ref = q.get("ref") or "main"
    tree = _git_tree(r, ref)
    if tree is None:
        raise _NotFound()
    api = f"{em.base_url}/repos/{owner}/{repo}/contents"

    def entry(name: str, kind: str, data: bytes | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"type": kind, "name": name.rsplit("/", 1)[-1], "path": name,
                               "sha": format(abs(hash((ref, name))), "040x")[:40], "size": len(data or b""),
                               "url": f"{api}/{name}?ref={ref}", "html_url": f"{em.base_url}/{owner}/{repo}/blob/{ref}/{name}",
                               "git_url": None, "download_url": None, "_links": {"self": f"{api}/{name}?ref={ref}"}}
        if data is not None:
            out.update(encoding="base64", content=base64.b64encode(data).decode())
        return out

    path = path.strip("/")
    if path in tree:
        return 200, entry(path, "file", tree[path]), {}
    prefix = path + "/"
    children: dict[str, str] = {}
    for name in tree:
        if name.startswith(prefix):
            rest = name[len(prefix):]
            child = rest.split("/", 1)[0]
            children[prefix + child] = "dir" if "/" in rest else "file"
    if not children:
        raise _NotFound()
    return 200, [entry(name, kind) | ({"size": len(tree[name])} if kind == "file" else {})
                 for name, kind in sorted(children.items())], {}


def _r_workflow_run(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, rid: str) -> tuple[int, Any, dict]:
    r = em._repo(owner, repo)
    run = r.workflow_runs.get(int(rid))
    if run is None:
        raise _NotFound()
    return 200, _run_json(em, r, run), {}


def _run_json(em: GitHubEmulator, r: Repo, run: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run.items() if not k.startswith("_")} | {
        "url": f"{em.base_url}/repos/{r.full_name}/actions/runs/{run['id']}", "repository": em._repo_json(r)}


def _r_workflow_runs(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, wf: str) -> tuple[int, Any, dict]:
    """`GET /actions/workflows/{file}/runs`, filtered by `status` as GitHub does (newest first)."""
    r = em._repo(owner, repo)
    runs = [run for run in r.workflow_runs.values() if run["path"].rsplit("/", 1)[-1] == wf
            and (not q.get("status") or q["status"] in (run["status"], run.get("conclusion")))]
    runs.sort(key=lambda run: run["id"], reverse=True)
    items, headers = em._paginate(f"/repos/{owner}/{repo}/actions/workflows/{wf}/runs", q,
                                  [_run_json(em, r, run) for run in runs])
    return 200, {"total_count": len(runs), "workflow_runs": items}, headers


def _r_run_jobs(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, rid: str) -> tuple[int, Any, dict]:
    run = em._repo(owner, repo).workflow_runs.get(int(rid))
    if run is None:
        raise _NotFound()
    jobs = run.get("_jobs", [])
    items, headers = em._paginate(f"/repos/{owner}/{repo}/actions/runs/{rid}/jobs", q, jobs)
    return 200, {"total_count": len(jobs), "jobs": items}, headers


def _r_run_cancel(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, rid: str) -> tuple[int, Any, dict]:
    run = em._repo(owner, repo).workflow_runs.get(int(rid))
    if run is None:
        raise _NotFound()
    if run["status"] == "completed":
        return 409, {"message": "Cannot cancel a workflow run that is completed."}, {}
    run.update(status="completed", conclusion="cancelled")
    for job in run.get("_jobs", []):
        if job["status"] != "completed":
            job.update(status="completed", conclusion="cancelled")
    return 202, {}, {}


def _r_run_approvals(em: GitHubEmulator, q: dict, body: Any, owner: str, repo: str, rid: str) -> tuple[int, Any, dict]:
    # A run the emulator was not told about (the act scenes' runs) has no approvals yet.
    run = em._repo(owner, repo).workflow_runs.get(int(rid)) or {}
    return 200, [{**a, "user": em._user_json(a["user"])} for a in run.get("_approvals", [])], {}


_O = r"/repos/(?P<owner>[^/]+)/(?P<repo>[^/]+)"
_ROUTES = [
    (r"/rate_limit", "GET", _r_rate_limit),
    (r"/user", "GET", _r_user),
    (_O, "GET", _r_repo),
    (_O + r"/pulls/(?P<n>\d+)", "GET", _r_pull),
    (_O + r"/pulls/(?P<n>\d+)/files", "GET", _r_pull_files),
    (_O + r"/pulls/(?P<n>\d+)/reviews", "GET", _r_pull_reviews),
    (_O + r"/pulls/(?P<n>\d+)/commits", "GET", _r_pull_commits),
    (_O + r"/issues/(?P<n>\d+)", "GET", _r_issue),
    (_O + r"/issues/(?P<n>\d+)/comments", "GET", _r_list_comments),
    (_O + r"/issues/(?P<n>\d+)/comments", "POST", _r_create_comment),
    (_O + r"/issues/comments/(?P<cid>\d+)", "GET", _r_get_comment),
    (_O + r"/issues/comments/(?P<cid>\d+)", "PATCH", _r_edit_comment),
    (_O + r"/issues/comments/(?P<cid>\d+)", "DELETE", _r_delete_comment),
    (_O + r"/issues/(?P<n>\d+)/labels", "GET", _r_labels),
    (_O + r"/issues/(?P<n>\d+)/labels", "POST", _r_add_labels),
    (_O + r"/issues/(?P<n>\d+)/events", "GET", _r_events),
    (_O + r"/collaborators/(?P<user>[^/]+)/permission", "GET", _r_permission),
    (_O + r"/statuses/(?P<sha>[0-9a-f]{40})", "POST", _r_status),
    (_O + r"/actions/runners", "GET", _r_runners),
    (_O + r"/actions/runners/(?P<rid>\d+)", "GET", _r_runner),
    (_O + r"/actions/runners/(?P<rid>\d+)", "DELETE", _r_delete_runner),
    (_O + r"/actions/runners/registration-token", "POST", _r_registration_token),
    (r"/orgs/(?P<org>[^/]+)/actions/runner-groups", "GET", _r_runner_groups),
    (r"/orgs/(?P<org>[^/]+)/actions/runners/generate-jitconfig", "POST", _r_generate_jitconfig),
    (_O + r"/commits/(?P<sha>[0-9a-f]{40})/pulls", "GET", _r_commit_pulls),
    (_O + r"/contents/(?P<path>.+)", "GET", _r_contents),
    (_O + r"/actions/runs/(?P<rid>\d+)", "GET", _r_workflow_run),
    (_O + r"/actions/workflows/(?P<wf>[^/]+)/runs", "GET", _r_workflow_runs),
    (_O + r"/actions/runs/(?P<rid>\d+)/jobs", "GET", _r_run_jobs),
    (_O + r"/actions/runs/(?P<rid>\d+)/cancel", "POST", _r_run_cancel),
    (_O + r"/actions/runs/(?P<rid>\d+)/approvals", "GET", _r_run_approvals),
    (_O + r"/commits/(?P<sha>[0-9a-f]{40})", "GET", _r_commit),
]


def _make_handler(em: GitHubEmulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "GitHubEmulator/1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test output
            pass

        def _serve(self, method: str) -> None:
            url = urlparse(self.path)
            path = url.path.rstrip("/") or "/"
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            auth = self.headers.get("Authorization", "")
            entry: list[Any] = [method, path, 0, auth.split(" ")[-1]]
            em.log.append(entry)
            fault = em._take_fault(method, path)
            if em.latency:
                time.sleep(em.latency)
            presented = auth.split(" ")[-1]
            expiry = em.tokens.get(presented, 0.0) if em.token else None
            if em.token and (presented not in em.tokens or (expiry is not None and expiry < time.time())):
                entry[2] = 401
                self._send(401, {"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest"})
                return
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                self._send(400, {"message": "Problems parsing JSON"})
                return
            result = None
            if fault is None or fault.apply or (fault.status is None and not fault.drop):
                try:
                    result = em.handle(method, path, query, body)
                except _NotFound:
                    result = (404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}, {})
            if fault is not None and fault.delay:
                time.sleep(fault.delay)
            if fault is not None and fault.drop:
                self.close_connection = True
                return
            if fault is not None and fault.status is not None:
                headers: dict[str, str] = {}
                if fault.rate_limit_reset is not None:
                    headers = {"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "0",
                               "X-RateLimit-Used": "5000", "X-RateLimit-Reset": str(fault.rate_limit_reset),
                               "X-RateLimit-Resource": "core"}
                    message = fault.message or "API rate limit exceeded for installation ID 1."
                else:
                    message = fault.message or ("Server Error" if fault.status >= 500 else "Forbidden")
                result = (fault.status, {"message": message, "documentation_url": "https://docs.github.com/rest"},
                          headers)
            assert result is not None
            status, payload, headers = result
            entry[2] = status
            if status < 400:
                em._run_hooks(method, path, body)
            self._send(status, payload, headers)

        def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = b"" if payload is None else json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                merged = {"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "4999",
                          "X-RateLimit-Reset": str(int(time.time()) + 3600), **(headers or {})}
                for k, v in merged.items():
                    self.send_header(k, v)
                self.end_headers()
                if data:
                    self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test): nothing to answer

        def do_GET(self) -> None:  # noqa: N802
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def do_PATCH(self) -> None:  # noqa: N802
            self._serve("PATCH")

        def do_DELETE(self) -> None:  # noqa: N802
            self._serve("DELETE")

        def do_PUT(self) -> None:  # noqa: N802
            self._serve("PUT")

    return Handler


# --------------------------------------------------------------------------- test helpers

REPO = "acme/lab"
SHA_A = "a" * 40
SHA_B = "b" * 40


def experiments_tree(files: tuple[str, ...] | list[str]) -> dict[str, bytes]:
    """A commit's `experiments/` for the contents API: the project's examples, and a valid
    experiment (the `higher-lr` example renamed) for each `experiments/<name>.yaml` in `files`."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "experiments"
    tree = {f"experiments/{p.relative_to(root).as_posix()}": p.read_bytes() for p in root.rglob("*") if p.is_file()}
    example = (root / "higher-lr.yaml").read_text(encoding="utf-8")
    for f in files:
        m = re.fullmatch(r"experiments/([a-z0-9][a-z0-9_-]{2,63})\.ya?ml", f)
        if m:
            tree[f] = example.replace("name: higher-lr", f"name: {m.group(1)}", 1).encode()
    return tree


def emulated_repo(gh: GitHubEmulator, *, author: str = "dana", head_sha: str = SHA_A,
                  files: tuple[str, ...] = ("experiments/rope-theta.yaml",), head_repo: str | None = None) -> int:
    """The common scene: repo acme/lab, PR by `author`, a writer `erin`, a reader `frank`, a maintainer `mia`.
    The head commit's experiment files are valid (served by the contents API)."""
    if REPO not in gh.repos:
        gh.add_repo(REPO)
    gh.set_permission(REPO, author, "write")
    gh.set_permission(REPO, "erin", "write")
    gh.set_permission(REPO, "mia", "maintain")
    gh.set_permission(REPO, "frank", "read")
    pr = gh.add_pull(REPO, author=author, head_sha=head_sha, files=list(files), head_repo=head_repo)
    if head_sha not in gh.repos[REPO].trees:
        gh.add_tree(REPO, head_sha, experiments_tree(files))
    return pr["number"]


def emulator_config(gh: GitHubEmulator, **overrides: Any) -> Any:
    """A client config for tests: no throttling, tiny backoff, short timeout."""
    from pipelines.github.client import GitHubConfig

    values: dict[str, Any] = dict(token=gh.token, repo=REPO, api_url=gh.base_url, timeout=2, retries=3,
                                  backoff_factor=0.01, max_rate_limit_wait=30, seconds_between_requests=0,
                                  seconds_between_writes=0)
    values.update(overrides)
    return GitHubConfig(**values)
