"""The train job's own checks, standard library only, from the default branch.

    python3 .github/scripts/train_gate.py head
        The first step of the `train` job, before any PR code is checked out or run (after the
        `gpu-training` environment's reviewers approved): asks the API for the PR's head now and
        stops when it is not the SHA `/train` approved. A writer who comments `/train` on C1 and
        pushes C2 gets nothing trained: the reviewer read C2, C1 would run. Env: GITHUB_API_URL,
        GITHUB_REPOSITORY, GITHUB_TOKEN, PR_NUMBER, HEAD_SHA; writes `fresh` and `head` to
        $GITHUB_OUTPUT and the SHA being trained to $GITHUB_STEP_SUMMARY.

    python3 .github/scripts/train_gate.py experiment-file ROOT NAME
        The one experiment-file rule (the same as pipelines.github.chatops.experiment_file):
        experiments/NAME.yaml or .yml, a regular file, not a symlink, not both. Writes `spec`.
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.request
from pathlib import Path

_SHA = re.compile(r"^[0-9a-f]{40}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{2,63}$")


def output(**values: str) -> None:
    path = os.environ.get("GITHUB_OUTPUT")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.writelines(f"{k}={v}\n" for k, v in values.items())


def summary(text: str) -> None:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")


def current_head(api: str, repo: str, number: int, token: str) -> str:
    req = urllib.request.Request(f"{api.rstrip('/')}/repos/{repo}/pulls/{number}", headers={
        "Accept": "application/vnd.github+json", "Authorization": f"Bearer {token}",
        "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "gitops-train-train-gate"})
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - the configured API
        data = json.loads(resp.read().decode("utf-8"))
    sha = str((data.get("head") or {}).get("sha") or "")
    if not _SHA.match(sha):
        raise RuntimeError("the API answered without a head SHA")
    return sha


def head() -> int:
    approved, pr = os.environ.get("HEAD_SHA", ""), os.environ.get("PR_NUMBER", "")
    repo = os.environ.get("GITHUB_REPOSITORY", "")
    if not _SHA.match(approved) or not pr.isdigit() or not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        print("::error::train gate: HEAD_SHA, PR_NUMBER or GITHUB_REPOSITORY missing or malformed")
        output(fresh="false", head="")
        return 1
    now = current_head(os.environ.get("GITHUB_API_URL", "https://api.github.com"), repo, int(pr),
                       os.environ.get("GITHUB_TOKEN", ""))
    if now != approved:
        print(f"::error::not training: /train approved {approved[:12]}, but the head of #{pr} is now {now[:12]}. "
              "The approval was for a different commit; comment /train again on the new head.")
        summary(f"Not trained: `/train` approved `{approved}`, the head of #{pr} is now `{now}`.")
        output(fresh="false", head=now)
        return 1
    summary(f"Training commit `{approved}` of #{pr} (still the head when this job started).")
    output(fresh="true", head=now)
    return 0


def experiment_file(root: Path, name: str) -> str | None:
    """`experiments/<name>.yaml` or `.yml` under root: a regular file, no symlink anywhere, one of them."""
    if not _NAME.match(name) or (root / "experiments").is_symlink():
        return None
    found = []
    for ext in (".yaml", ".yml"):
        p = root / "experiments" / f"{name}{ext}"
        if p.is_symlink():
            return None
        if p.is_file():
            found.append(f"experiments/{name}{ext}")
    return found[0] if len(found) == 1 else None


def main(argv: list[str]) -> int:
    if argv[:1] == ["head"]:
        return head()
    if len(argv) == 3 and argv[0] == "experiment-file":
        spec = experiment_file(Path(argv[1]), argv[2])
        if spec is None:
            print(f"::error::experiment {argv[2]!r}: no single regular file experiments/<name>.yaml or .yml "
                  "(symlinks are refused)")
            return 1
        output(spec=spec)
        print(spec)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
