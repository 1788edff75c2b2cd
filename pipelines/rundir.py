"""Run directories and atomic writes.

runs/<YYYYMMDD>/<experiment>/<run-id>/
  spec.resolved.json  identity.json  stages/<stage>.json  logs/
  train/seed-<n>/     one trainer run directory per seed (checkpoints, metrics, result.json)
  report/             report.md, result.json, *.png, comment.md

A directory without its marker (a stage's result JSON, a trainer's result.json) does not
exist as far as any reader is concerned. Paths are absolute everywhere.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so a reader sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> Any | None:
    """The parsed JSON at `path`, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def runs_root(repo: Path) -> Path:
    return Path(os.environ.get("PIPELINE_RUNS_DIR", repo / "runs")).resolve()


def find_run_dir(repo: Path, experiment: str, run_id: str) -> Path | None:
    """An existing run directory for (experiment, run_id) on any date, newest first."""
    hits = sorted(runs_root(repo).glob(f"*/{experiment}/{run_id}"), reverse=True)
    return hits[0] if hits else None


def new_run_dir(repo: Path, experiment: str, run_id: str) -> Path:
    """The run directory for (experiment, run_id): an existing one is reused (resume)."""
    existing = find_run_dir(repo, experiment, run_id)
    if existing is not None:
        return existing
    path = runs_root(repo) / time.strftime("%Y%m%d") / experiment / run_id
    path.mkdir(parents=True, exist_ok=True)
    return path


def finished_training_runs(repo: Path) -> dict[str, Path]:
    """identity -> trainer run dir, for every finished training run under runs/."""
    found: dict[str, Path] = {}
    for ident_file in runs_root(repo).glob("*/*/*/train/seed-*/identity.json"):
        run = ident_file.parent
        result = read_json(run / "result.json")
        ident = read_json(ident_file)
        if result and ident and result.get("status") == "finished":
            found.setdefault(str(ident.get("identity")), run)
    return found


def resolve_run(repo: Path, ref: str) -> Path | None:
    """A run given as a path, or as `<experiment>/<run-id>`, or as a bare run id."""
    p = Path(ref)
    if p.is_dir():
        return p.resolve()
    root = runs_root(repo)
    patterns = [f"*/{ref}"] if "/" in ref else [f"*/*/{ref}", f"*/{ref}/*"]
    for pattern in patterns:
        hits = sorted((h for h in root.glob(pattern) if h.is_dir()), reverse=True)
        if hits:
            return hits[0]
    return None
