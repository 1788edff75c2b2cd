"""Host resource checks done before heavy work (disk space before data or checkpoints)."""

from __future__ import annotations

import shutil
from pathlib import Path

from basics.errors import DiskSpaceError


def free_gb(path: Path) -> float:
    probe = path
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free / 1e9


def ensure_disk_space(path: Path, *, need_gb: float, what: str) -> float:
    """Raise DiskSpaceError naming the path and the numbers when less than `need_gb` is free."""
    free = free_gb(path)
    if free < need_gb:
        raise DiskSpaceError(
            f"{what} needs at least {need_gb:.1f} GB free under {path}, only {free:.2f} GB is free; "
            "free space (e.g. `make clean`, or remove old runs/ and data/cache/ entries)"
        )
    return free
