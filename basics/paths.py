"""Where things live in a repository: the experiments folder, an experiment's file, the data roots.

One rule each, read by the loader (file rules), the resolve step, orchestration and the
commands; nothing else looks for an experiment file or a data root on its own. Standard
library only: `pipeline validate` imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

EXPERIMENTS_DIR = "experiments"
"""Folder of experiment files at the repository root."""
EXPERIMENT_SUFFIXES = (".yaml", ".yml")
"""An experiment file ends in one of these; `.yaml` wins when both exist."""
DATA_ROOTS_ENV = "PIPELINE_DATA_ROOTS"
"""Extra data roots, separated by `os.pathsep`, beside `<repo>/data`."""


def find_repo_root(path: Path) -> Path:
    """The repository holding `path` (a file or a directory): the nearest directory at or
    above it that holds `experiments/`.

    Fallback, when no directory up to `/` holds one: `path` itself when it is a directory,
    else the file's directory. A spec outside any repository is thus read as its own
    repository (its baseline and data are looked up beside it), and `validate`, `plan`,
    `smoke` and `run` agree on where that is. The one rule: every command finds its
    repository here (from its spec file) or with `repo_root_from_cwd`."""
    resolved = Path(path).resolve()
    start = resolved if resolved.is_dir() else resolved.parent
    for candidate in (start, *start.parents):
        if (candidate / EXPERIMENTS_DIR).is_dir():
            return candidate
    return start


def repo_root_from_cwd() -> Path:
    """The repository of the working directory, for commands given no spec file (`runs`,
    `show`, `demo`, `schema`): `find_repo_root` of the cwd, so the same fallback (the cwd)."""
    return find_repo_root(Path.cwd())


def experiments_dir(repo_root: Path) -> Path:
    return Path(repo_root) / EXPERIMENTS_DIR


def experiment_file(repo_root: Path, name: str) -> Path | None:
    """The file of experiment `name` (`experiments/<name>.yaml`, else `.yml`), or None.

    The one lookup rule for a baseline named in `hypothesis.baseline`."""
    for suffix in EXPERIMENT_SUFFIXES:
        candidate = experiments_dir(repo_root) / f"{name}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def experiment_files(directory: Path) -> list[Path]:
    """Every experiment file in `directory` (both suffixes), sorted by name."""
    found = {p for suffix in EXPERIMENT_SUFFIXES for p in Path(directory).glob(f"*{suffix}") if p.is_file()}
    return sorted(found)


def experiment_names(repo_root: Path) -> list[str]:
    return sorted({p.stem for p in experiment_files(experiments_dir(repo_root))})


def data_roots(repo_root: Path) -> list[Path]:
    """Where data paths may point: `<repo>/data` plus every entry of `$PIPELINE_DATA_ROOTS` (real paths)."""
    roots = [Path(repo_root) / "data"]
    for entry in os.environ.get(DATA_ROOTS_ENV, "").split(os.pathsep):
        if entry.strip():
            roots.append(Path(entry.strip()).expanduser())
    return [Path(os.path.realpath(r)) for r in roots]
