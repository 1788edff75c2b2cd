"""The one checkpoint writer: a background thread for asynchronous saves, and the publish
protocol every save of either layout ends with.

A save is written into `.tmp_step_N/`; once it validated, `publish` writes MANIFEST.json
last (the sha256 and size of every file), renames the directory into place (replacing an
older, unusable save of the same step), makes the rename durable and applies retention. A
save that fails validation (`reject`) or a write (`fail`: disk full, quota, permissions) is
removed and reported as a P1 event; the previous checkpoints stay as they were.

Both layouts hand their slow part to `submit`: the unsharded layout the whole write on rank
0, the sharded layout each rank's shard write (published later, collectively). Torch-free.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from basics.files import fsync_dir
from trainer.checkpoint.format import (
    TMP_PREFIX,
    EventSink,
    apply_retention,
    checkpoint_name,
    valid_checkpoints,
    write_manifest,
)


@dataclass
class SaveOutcome:
    step: int
    path: Path | None
    ok: bool
    reason: str = ""
    write_s: float = 0.0
    deleted: list[Path] = field(default_factory=list)


class CheckpointWriter:
    """Runs save jobs (in one background thread when `async_save`), publishes, keeps retention.

    `outcomes` says which saves were published (rank 0 of a sharded layout; the writing rank
    of an unsharded one).
    """

    def __init__(self, root: Path, keep_last: int, async_save: bool, on_event: EventSink):
        self.root = Path(root)
        self.keep_last = keep_last
        self.async_save = async_save
        self.on_event = on_event
        self.protect: set[int] = set()
        self._thread: threading.Thread | None = None
        self.outcomes: list[SaveOutcome] = []
        self.root.mkdir(parents=True, exist_ok=True)

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` after the previous one finished: in the background thread when async
        (returns once it started), else here. A job reports its own failures."""
        self.wait()
        if self.async_save:
            self._thread = threading.Thread(target=job, name="checkpoint-writer", daemon=True)
            self._thread.start()
        else:
            job()

    def wait(self) -> None:
        """Finish the job in flight (this process only: no collective)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def last_valid(self) -> Path | None:
        valid = valid_checkpoints(self.root)
        return valid[0][1] if valid else None

    def publish(self, step: int, tmp: Path, started: float, files: dict[str, dict[str, Any]] | None = None,
                extra: dict[str, Any] | None = None) -> None:
        """The validated `tmp` becomes checkpoint `step`: manifest last, one rename, retention.
        `files`: the manifest's entries when the ranks hashed their own files (else all hashed here);
        `started`: `time.perf_counter()` when the save began (its outcome's `write_s`)."""
        write_manifest(tmp, step, files, extra)
        final = self.root / checkpoint_name(step)
        if final.exists():  # an older, unusable save of the same step (e.g. after a rollback)
            trash = self.root / f"{TMP_PREFIX}trash_{checkpoint_name(step)}"
            shutil.rmtree(trash, ignore_errors=True)
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(tmp, final)
        fsync_dir(self.root)
        deleted = apply_retention(self.root, self.keep_last, self.protect)
        self.outcomes.append(SaveOutcome(step, final, True, "", time.perf_counter() - started, deleted))

    def reject(self, step: int, tmp: Path, reason: str, started: float) -> None:
        """The save was written but does not reload to what was saved: never a checkpoint."""
        shutil.rmtree(tmp, ignore_errors=True)
        self.on_event("P1", "checkpoint_invalid", f"checkpoint at step {step} failed validation: {reason}")
        self.outcomes.append(SaveOutcome(step, None, False, reason, time.perf_counter() - started))

    def fail(self, step: int, tmp: Path, exc: BaseException, started: float) -> None:
        """A write failed (trainer/monitor.py's CheckpointFailures turns a full disk into a stop)."""
        shutil.rmtree(tmp, ignore_errors=True)
        self.on_event("P1", "checkpoint_failed", f"checkpoint at step {step} not written: {exc}")
        self.outcomes.append(SaveOutcome(step, None, False, str(exc), time.perf_counter() - started))
