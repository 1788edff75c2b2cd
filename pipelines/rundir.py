"""Run directories and atomic writes.

runs/<YYYYMMDD>/<experiment>/<run-id>/
  spec.resolved.json  identity.json  stages/<stage>.json  logs/
  train/seed-<n>/     one trainer run directory per seed (checkpoints, metrics, result.json)
  report/             report.md, result.json, *.png, comment.md

A directory without its marker (a stage's result JSON, a trainer's result.json) does not
exist as far as any reader is concerned. Paths are absolute everywhere.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# The one atomic write and JSON reader (re-exported: run directories are their main users).
from validation.files import atomic_write_json, atomic_write_text, read_json

__all__ = ["DATA_CACHE_ENV", "RUNS_DIR_ENV", "atomic_write_json", "atomic_write_text", "data_cache_root",
           "find_run_dir", "finished_training_runs", "new_run_dir", "read_json", "resolve_run", "runs_root"]


RUNS_DIR_ENV = "PIPELINE_RUNS_DIR"
DATA_CACHE_ENV = "PIPELINE_DATA_CACHE"


def runs_root(repo: Path) -> Path:
    """Where run directories live: `PIPELINE_RUNS_DIR` (shared storage on the GPU runners,
    docs/operations.md "Where state lives"), else `<repo>/runs`."""
    return Path(os.environ.get(RUNS_DIR_ENV) or repo / "runs").resolve()


def data_cache_root(repo: Path) -> Path:
    """Where prepared data versions live: `PIPELINE_DATA_CACHE` (shared storage), else
    `<repo>/data/cache`."""
    return Path(os.environ.get(DATA_CACHE_ENV) or repo / "data" / "cache").resolve()


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
