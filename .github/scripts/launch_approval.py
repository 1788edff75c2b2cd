"""The train job's approval check, standard library only, from the default branch.

    python3 .github/scripts/launch_approval.py

Runs in the `train` job after the head check and before any PR code is checked out, once the
`gpu-training` environment's reviewers approved the job. GitHub's "Prevent self-review"
stops only the person who triggered the run (the `/train` commenter); a PR author who is an
environment reviewer could approve their own code once another writer comments `/train`.
This asks the API who approved (`GET /actions/runs/{id}/approvals`) and who wrote the pull
request (`GET /pulls/{n}`), and stops when the author approved `gpu-training` for this run.
Env: GITHUB_API_URL, GITHUB_REPOSITORY, GITHUB_TOKEN (actions: read, pull-requests: read),
GITHUB_RUN_ID, PR_NUMBER.
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.request
from collections.abc import Callable
from typing import Any

ENVIRONMENT = "gpu-training"


def api_get(url: str, token: str) -> Any:
    req = urllib.request.Request(url, headers={
        "Accept": "application/vnd.github+json", "Authorization": f"Bearer {token}",
        "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "gitops-train-launch-approval"})
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - the configured API
        return json.loads(resp.read().decode("utf-8"))


def approvers(approvals: Any, environment: str = ENVIRONMENT) -> list[str]:
    """Logins that approved `environment` for the run (pure)."""
    out = []
    for a in approvals if isinstance(approvals, list) else []:
        names = {e.get("name") for e in a.get("environments") or [] if isinstance(e, dict)}
        login = (a.get("user") or {}).get("login")
        if a.get("state") == "approved" and environment in names and isinstance(login, str):
            out.append(login)
    return out


def decide(approved_by: list[str], author: str) -> str | None:
    """Why this launch must not run (None = it may): the PR author approved their own code."""
    if author and author.lower() in {a.lower() for a in approved_by}:
        return (f"the pull request's author ({author}) approved the `{ENVIRONMENT}` deployment of their own code; "
                "another reviewer must approve it (comment /train again)")
    return None


def main(get: Callable[[str, str], Any] = api_get) -> int:
    api = os.environ.get("GITHUB_API_URL", "https://api.github.com").rstrip("/")
    repo, run, pr = (os.environ.get(k, "") for k in ("GITHUB_REPOSITORY", "GITHUB_RUN_ID", "PR_NUMBER"))
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo) or not run.isdigit() or not pr.isdigit():
        print("::error::launch approval: GITHUB_REPOSITORY, GITHUB_RUN_ID or PR_NUMBER missing or malformed")
        return 1
    token = os.environ.get("GITHUB_TOKEN", "")
    author = str((get(f"{api}/repos/{repo}/pulls/{pr}", token).get("user") or {}).get("login") or "")
    approved_by = approvers(get(f"{api}/repos/{repo}/actions/runs/{run}/approvals", token))
    why = decide(approved_by, author)
    if why:
        print(f"::error::not training: {why}")
        return 1
    if not approved_by:
        print(f"::warning::no reviewer approval of `{ENVIRONMENT}` is recorded for this run: give the environment "
              "required reviewers (docs/operations.md)")
    else:
        print(f"approved by {', '.join(approved_by)} (not the author, {author})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main() if sys.argv[1:] == [] else 2)
