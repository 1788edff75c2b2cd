"""Self-hosted runner tooling: capacity before a launch, listing, pruning (pure + adapter).

GitHub's API reports a runner's status (online/offline) and whether it is busy, but not
since when it is offline. `prune` therefore remembers when it first saw each runner
offline in a small JSON state file and removes those offline longer than the threshold
(GitHub itself only forgets non-ephemeral runners after 14 days offline). Ephemeral
runners (`config.sh --ephemeral`) unregister after one job and need no pruning.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from basics.errors import UsageError
from pipelines.github.client import Runner, RunnerGroup, RunnerHost

_DURATION = re.compile(r"^(\d+)([smhd])$")


@dataclass(frozen=True)
class Capacity:
    ok: bool
    message: str
    matching: int
    online: int
    idle: int


def runner_labels(gpu_type: str, gpus_per_node: int) -> tuple[str, ...]:
    """Labels a runner must carry for a spec: `gpu` and the GPU type (e.g. `h100`), or `cpu`."""
    return ("gpu", gpu_type) if gpus_per_node > 0 else ("cpu",)


def capacity(runners: Sequence[Runner], labels: Sequence[str], nodes: int) -> Capacity:
    """Whether `nodes` idle online runners carry every label, and a sentence saying so (pure)."""
    want = {label.lower() for label in labels}
    matching = [r for r in runners if want <= {label.lower() for label in r.labels}]
    online = [r for r in matching if r.status == "online"]
    idle = [r for r in online if not r.busy]
    label_text = ",".join(labels)
    noun = "runner" if nodes == 1 else "runners"
    if len(idle) >= nodes:
        return Capacity(True, f"{len(idle)} idle {noun if len(idle) == 1 else 'runners'} labelled {label_text} "
                              f"ready for {nodes} node(s)", len(matching), len(online), len(idle))
    busy = len(online) - len(idle)
    parts = [f"{len(online)} online"]
    if online:
        parts[0] += ", busy" if busy == len(online) else f" ({busy} busy)"
    offline = len(matching) - len(online)
    if offline:
        parts.append(f"{offline} offline")
    return Capacity(False, f"waiting for {nodes} {noun} labelled {label_text}: {'; '.join(parts)}",
                    len(matching), len(online), len(idle))


def parse_duration(text: str) -> timedelta:
    m = _DURATION.match(text.strip())
    if not m:
        raise UsageError(f"duration {text!r}: use a number and s, m, h or d (e.g. 24h)")
    value, unit = int(m.group(1)), m.group(2)
    return timedelta(**{{"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[unit]: value})


def stale_runners(
    runners: Iterable[Runner], first_offline: dict[str, str], now: datetime, older_than: timedelta
) -> tuple[list[Runner], dict[str, str]]:
    """(runners to remove, updated first-seen-offline map keyed by runner id) (pure)."""
    seen: dict[str, str] = {}
    remove = []
    for r in runners:
        if r.status != "offline":
            continue
        since = first_offline.get(str(r.id)) or now.isoformat()
        seen[str(r.id)] = since
        if now - datetime.fromisoformat(since) >= older_than:
            remove.append(r)
    return remove, seen


def prune(host: RunnerHost, state_file: Path, older_than: timedelta, *, dry_run: bool = False,
          now: datetime | None = None) -> list[Runner]:
    """Remove runners offline for longer than `older_than` (as observed by earlier prunes)."""
    now = now or datetime.now(UTC)
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    remove, seen = stale_runners(host.runners(), state.get("first_offline", {}), now, older_than)
    for r in remove:
        if not dry_run:
            host.remove_runner(r.id)
            seen.pop(str(r.id), None)
    state_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"first_offline": seen}, indent=1))
    tmp.replace(state_file)
    return remove


def format_table(runners: Sequence[Runner]) -> str:
    rows = [("ID", "NAME", "STATUS", "BUSY", "LABELS")]
    rows += [(str(r.id), r.name, r.status, "busy" if r.busy else "idle", ",".join(r.labels)) for r in runners]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
                     for row in rows)


# --------------------------------------------------------------------------- just-in-time runners

TRAIN_WORKFLOW_FILE = ".github/workflows/experiment-train.yml"
_LABEL = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_RUNNER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def gate_workflow_ref(repo: str, default_branch: str = "main") -> str:
    """The one workflow a GPU runner group may serve: the train workflow on the default branch."""
    return f"{repo}/{TRAIN_WORKFLOW_FILE}@refs/heads/{default_branch}"


def group_problems(group: RunnerGroup, *, repo: str, default_branch: str = "main") -> list[str]:
    """Why a runner group is not the gate-only pool ([] = it is): restricted to the train workflow on
    the default branch, never to public repositories, and not the org's default group (pure)."""
    want = gate_workflow_ref(repo, default_branch)
    problems = []
    if group.default:
        problems.append(f"runner group `{group.name}` is the organisation's default group (every repository uses it)")
    if not group.restricted_to_workflows:
        problems.append(f"runner group `{group.name}` is not restricted to selected workflows")
    elif tuple(group.selected_workflows) != (want,):
        problems.append(f"runner group `{group.name}` serves {', '.join(group.selected_workflows) or 'no workflow'}; "
                        f"it must serve exactly {want}")
    if group.allows_public_repositories:
        problems.append(f"runner group `{group.name}` allows public repositories")
    return problems


def jit_request(*, name: str, labels: Sequence[str], group_id: int, work_folder: str = "_work") -> dict[str, object]:
    """The body of `POST /orgs/{org}/actions/runners/generate-jitconfig` (validated, pure)."""
    if not _RUNNER_NAME.match(name):
        raise UsageError(f"runner name {name!r}: letters, digits, '.', '_' or '-'")
    bad = [label for label in labels if not _LABEL.match(label)]
    if bad or not labels:
        raise UsageError(f"labels {','.join(labels)!r}: lower-case letters, digits, '.', '_' or '-'")
    if "self-hosted" not in labels:
        labels = ("self-hosted", *labels)
    return {"name": name, "runner_group_id": group_id, "labels": list(labels), "work_folder": work_folder}
