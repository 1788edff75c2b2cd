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
import re
import secrets
import time
from pathlib import Path

# The one atomic write and JSON reader (re-exported: run directories are their main users).
from basics.files import atomic_write_json, atomic_write_text, read_json

__all__ = ["DATA_CACHE_ENV", "RUNS_DIR_ENV", "atomic_write_json", "atomic_write_text", "data_cache_root",
           "find_run_dir", "finished_training_runs", "new_run_dir", "read_json", "resolve_run", "runs_root"]


RUNS_DIR_ENV = "PIPELINE_RUNS_DIR"
DATA_CACHE_ENV = "PIPELINE_DATA_CACHE"
LAUNCH_ENV = "PIPELINE_LAUNCH_ID"
"""Set by experiment-train.yml (`<workflow run>-<attempt>-<experiment>`): this launch's runs
live in a directory of their own on the shared storage."""
LAUNCH_NONCE_ENV = "PIPELINE_LAUNCH_NONCE"
LAUNCH_OWNER_FILE = ".launch-owner"
_LAUNCH = re.compile(r"^[0-9]{1,20}-[0-9]{1,6}(-[a-z0-9][a-z0-9._-]{0,99})?$")


def runs_root(repo: Path) -> Path:
    """Where run directories live: `PIPELINE_RUNS_DIR` (shared storage on the GPU runners,
    docs/operations.md "Where state lives"), else `<repo>/runs`; in a launch of the GitHub flow
    (`PIPELINE_LAUNCH_ID`), that launch's own directory in it (`launch_root`)."""
    base = Path(os.environ.get(RUNS_DIR_ENV) or repo / "runs").resolve()
    launch = os.environ.get(LAUNCH_ENV)
    return launch_root(base, launch) if launch else base


def launch_root(base: Path, launch: str) -> Path:
    """`base/launch-<launch>`, made by this launch: a training job of another launch shares the
    storage and could plant stage markers, runs or checkpoints where this one will look, so a
    directory this launch did not make is set aside unread (`<name>.planted-<time>`) and a fresh
    one made. The first call makes it and writes a random owner token, which this process and
    its children carry (`PIPELINE_LAUNCH_NONCE`); later calls find their own token there."""
    if not _LAUNCH.match(launch):
        from basics.errors import UsageError

        raise UsageError(f"{LAUNCH_ENV}={launch[:100]!r}: not <workflow run>-<attempt>[-<experiment>]")
    root = base / f"launch-{launch}"
    owner = root / LAUNCH_OWNER_FILE
    nonce = os.environ.get(LAUNCH_NONCE_ENV)
    try:
        mine = nonce is not None and owner.read_text(encoding="utf-8").strip() == nonce
    except OSError:
        mine = False
    if mine:
        return root
    if root.exists() or root.is_symlink():
        root.rename(root.with_name(f"{root.name}.planted-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"))
    base.mkdir(parents=True, exist_ok=True)
    root.mkdir()  # exclusive: a directory someone made in between fails here instead of being used
    nonce = secrets.token_hex(16)
    atomic_write_text(owner, nonce + "\n")
    os.environ[LAUNCH_NONCE_ENV] = nonce
    return root


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
