"""Disk full (ENOSPC) is its own failure: a clear message, exit code `disk-space`, never retried.

A relaunch cannot fix a full disk: it retrains from the last checkpoint and fails at the same
write (measured: three relaunches of 50 steps each, then `ended 'no result.json': exit 1`).
So wherever the trainer writes (checkpoint, export), ENOSPC becomes `DiskSpaceError` naming
the path, what it needed and what is free, and the run ends with a `result.json` that says
so (status "failed", stop_reason "disk_full"), which the launchers do not retry. The write
that failed leaves no partial files behind; the last valid checkpoint stays as it was.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import time
from pathlib import Path
from typing import Any

from basics.errors import DiskSpaceError
from trainer.record import write_result

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_TEXT_MARKERS = ("no space left on device", "disk quota exceeded", "os error 28")


def is_disk_full(exc: BaseException | str) -> bool:
    """ENOSPC/EDQUOT as an OSError anywhere in the cause chain, or in the text of a wrapper that
    lost the errno (safetensors raises its own `SafetensorError("... (os error 28)")`)."""
    if isinstance(exc, str):
        return any(m in exc.lower() for m in _TEXT_MARKERS)
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in DISK_FULL_ERRNOS:
            return True
        if any(m in str(cur).lower() for m in _TEXT_MARKERS):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def dir_bytes(path: Path) -> int:
    total = 0
    for p in Path(path).rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_file():
                total += p.stat().st_size
    return total


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def disk_full_error(run_dir: Path, what: str, exc: BaseException | str, path: Path | None = None) -> DiskSpaceError:
    """The one-line error for a full disk while writing `what` under `run_dir`."""
    from trainer.checkpoint.format import valid_checkpoints

    target = Path(getattr(exc, "filename", None) or path or run_dir)
    valid = valid_checkpoints(Path(run_dir) / "checkpoints")
    # What the failed write needed: about one more checkpoint (or the model inside one, for an export).
    need = dir_bytes(valid[0][1]) if valid else 0
    if valid and what == "export":
        need = (valid[0][1] / "model.safetensors").stat().st_size if (valid[0][1] / "model.safetensors").exists() else need
    try:
        free = shutil.disk_usage(run_dir).free
    except OSError:
        free = 0
    last = f"the last valid checkpoint {valid[0][1]} is intact" if valid else "no checkpoint was written yet"
    need_text = f"needs about {_mb(need)}, " if need else ""
    return DiskSpaceError(
        f"disk full while writing the {what} to {target}: {need_text}{_mb(free)} free on that file system; "
        f"{last}. Free space (or give the run directory more room) and run the same command again: it resumes. "
        f"Not retried automatically: a relaunch would fail at the same write.")


def record_disk_full(run_dir: Path, error: DiskSpaceError) -> None:
    """Best effort on a full disk: drop the unfinished export, then write result.json saying why
    (small; the launchers read it to not retry)."""
    run_dir = Path(run_dir)
    shutil.rmtree(run_dir / ".model.tmp", ignore_errors=True)
    result: dict[str, Any] = {"status": "failed", "stop_reason": "disk_full", "error": str(error),
                              "reason": str(error), "finished_unix": time.time()}
    with contextlib.suppress(OSError):
        write_result(run_dir, result)
