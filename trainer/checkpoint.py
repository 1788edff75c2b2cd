"""Atomic, self-verifying checkpoints: a directory without a valid MANIFEST.json does not exist.

Layout of `RUN/checkpoints/step_000200/` (one process or data parallelism):
  model.safetensors   weights (tied output weight omitted)
  optimizer.pt        AdamW state
  scheduler.pt        lr scheduler (+ fp16 grad scaler) state
  rng_rank<N>.pt      python / numpy / torch RNG of rank N (every rank writes its own)
  train_state.json    step, tokens, data position, MLflow run id, spec hash, best metric,
                      micro batch / accumulation after an OOM fallback, ...
  MANIFEST.json       sha256 + size of every file above; written LAST, after validation

Sharded layouts (FSDP, TP) write torch.distributed.checkpoint files instead of the first
two: `__<rank>_0.distcp` (every rank its own shard of model + optimizer) and `.metadata`;
the manifest lists every shard with its sha256 (each rank hashes the files it wrote).

A save goes to `.tmp_step_000200/`, is validated (weights loaded into a fresh model give
the same forward pass as the live one), gets its manifest, then is renamed into place.
The own format (rather than `accelerator.save_state`) lets the asynchronous mode snapshot
everything to CPU memory first and write it from a background thread.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# The one atomic write (fsync, rename, fsync of the directory) and file hash of the project;
# the old names stay for the trainer's callers.
from validation.files import atomic_write_json as write_json_atomic
from validation.files import fsync_dir as _fsync_dir
from validation.files import sha256_file

MANIFEST = "MANIFEST.json"
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index of a sharded checkpoint
TRAIN_STATE = "train_state.json"
PREFIX = "step_"
TMP_PREFIX = ".tmp_"


class EventSink(Protocol):
    """(level, kind, message[, step]) -> None; the trainer turns these into alerts, stamped with
    `step` when the event is about another step than the one the run is at (a skipped checkpoint)."""

    def __call__(self, level: str, kind: str, message: str, step: int | None = None, /) -> None: ...


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:06d}"


def file_entry(path: Path) -> dict[str, Any]:
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def write_manifest(directory: Path, step: int, files: dict[str, dict[str, Any]] | None = None,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Hash every file in `directory` (or take `files`, hashed by the ranks that wrote them)
    and write MANIFEST.json last (fsynced)."""
    if files is None:
        files = {p.name: file_entry(p) for p in sorted(directory.iterdir()) if p.is_file() and p.name != MANIFEST}
    manifest = {"step": step, "files": dict(sorted(files.items())), "created_unix": time.time()} | (extra or {})
    write_json_atomic(directory / MANIFEST, manifest)
    _fsync_dir(directory)
    return manifest


def verify_checkpoint(directory: Path) -> str | None:
    """None when the manifest verifies, else the reason it does not (names the file)."""
    manifest_path = Path(directory) / MANIFEST
    if not manifest_path.is_file():
        return "MANIFEST.json missing (partial or interrupted save)"
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"MANIFEST.json unreadable: {exc}"
    if TRAIN_STATE not in files or not ({"model.safetensors", DCP_METADATA} & set(files)):
        return "MANIFEST.json does not list the model (model.safetensors or sharded .metadata) and train_state.json"
    for name, meta in files.items():
        path = Path(directory) / name
        if not path.is_file():
            return f"{name} missing"
        if path.stat().st_size != meta["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, manifest says {meta['bytes']} (truncated?)"
        if sha256_file(path) != meta["sha256"]:
            return f"{name} sha256 mismatch (corrupted)"
    return None


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Finished-looking checkpoint directories, newest first (not yet verified)."""
    out = []
    if not Path(root).is_dir():
        return out
    for path in Path(root).iterdir():
        if path.is_dir() and path.name.startswith(PREFIX):
            try:
                out.append((int(path.name[len(PREFIX) :]), path))
            except ValueError:
                continue
    return sorted(out, reverse=True)


def find_resume_checkpoint(root: Path, on_event: EventSink | None = None) -> Path | None:
    """The newest checkpoint whose manifest verifies; every one skipped is reported by name."""
    for step, path in list_checkpoints(root):
        reason = verify_checkpoint(path)
        if reason is None:
            return path
        if on_event:  # stamped with the checkpoint's step: the resuming process is not at any step yet
            on_event("P1", "checkpoint_corrupt", f"skipping checkpoint {path}: {reason}", step)
    return None


def valid_checkpoints(root: Path) -> list[tuple[int, Path]]:
    return [(s, p) for s, p in list_checkpoints(root) if (p / MANIFEST).is_file()]


def best_checkpoint_step(valid: list[tuple[int, Path]]) -> int | None:
    """Step of the valid checkpoint with the lowest eval metric recorded in its train_state.json."""
    best: tuple[float, int] | None = None
    for step, path in valid:
        try:
            metric = json.loads((path / TRAIN_STATE).read_text()).get("eval_metric")
        except (OSError, ValueError):
            continue
        if isinstance(metric, (int, float)) and metric == metric and (best is None or metric < best[0]):
            best = (float(metric), step)
    return best[1] if best else None


def apply_retention(root: Path, keep_last: int, protect: set[int] | None = None) -> list[Path]:
    """Delete all but the newest `keep_last` valid checkpoints, the best by eval metric and `protect`.

    Never touches temporary directories (a save in progress) and never deletes the last
    valid checkpoint: the newest is always among the kept.
    """
    valid = valid_checkpoints(root)
    keep = {s for s, _ in valid[: max(1, keep_last)]} | set(protect or ())
    best = best_checkpoint_step(valid)
    if best is not None:
        keep.add(best)
    deleted = []
    for step, path in valid:
        if step not in keep:
            shutil.rmtree(path, ignore_errors=True)
            deleted.append(path)
    return deleted


def clean_stale_temporaries(root: Path) -> list[Path]:
    """Remove `.tmp_*` directories left by an interrupted save (call at start, before saving)."""
    removed = []
    if Path(root).is_dir():
        for path in Path(root).iterdir():
            if path.name.startswith(TMP_PREFIX):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def to_cpu(obj: Any, copy: bool) -> Any:
    """Recursively move tensors to CPU (copying when `copy`, so training can go on mutating)."""
    import torch

    if isinstance(obj, torch.Tensor):
        out = obj.detach().to("cpu")
        return out.clone() if copy and out.data_ptr() == obj.data_ptr() else out
    if isinstance(obj, dict):
        return {k: to_cpu(v, copy) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_cpu(v, copy) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_cpu(v, copy) for v in obj)
    return obj


def rng_state() -> dict[str, Any]:
    import random

    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class Snapshot:
    """Everything rank 0 writes for one checkpoint, already on CPU."""

    step: int
    model_state: dict[str, Any]
    optimizer_state: dict[str, Any]
    scheduler_state: dict[str, Any]
    train_state: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class SaveOutcome:
    step: int
    path: Path | None
    ok: bool
    reason: str = ""
    write_s: float = 0.0
    deleted: list[Path] = field(default_factory=list)


def tmp_dir_for(root: Path, step: int) -> Path:
    return Path(root) / f"{TMP_PREFIX}{checkpoint_name(step)}"


def write_rank_rng(root: Path, step: int, rank: int) -> None:
    """Every rank writes its own RNG state into the temporary directory (synchronous, tiny)."""
    import torch

    tmp = tmp_dir_for(root, step)
    tmp.mkdir(parents=True, exist_ok=True)
    torch.save(rng_state(), tmp / f"rng_rank{rank}.pt")


def load_checkpoint(path: Path, rank: int, tensors: bool = True) -> dict[str, Any]:
    """Read a verified checkpoint; the RNG of `rank` when it was saved by that many ranks.
    `tensors=False`: everything but the model and optimizer (loaded elsewhere, e.g. sharded)."""
    import torch
    from safetensors.torch import load_file

    path = Path(path)
    out: dict[str, Any] = {
        "model": load_file(str(path / "model.safetensors")) if tensors else None,
        "optimizer": torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False) if tensors else None,
        "scheduler": torch.load(path / "scheduler.pt", map_location="cpu", weights_only=False),
        "train_state": json.loads((path / TRAIN_STATE).read_text()),
        "rng": None,
    }
    rng_path = path / f"rng_rank{rank}.pt"
    if rng_path.is_file():
        out["rng"] = torch.load(rng_path, map_location="cpu", weights_only=False)
    return out


class Checkpointer:
    """Writes snapshots atomically (optionally in a background thread) and keeps retention.

    `validator(tmp_dir) -> reason | None` loads the written weights into a fresh model and
    compares one forward pass; a checkpoint that fails it is deleted, never counted.
    """

    def __init__(
        self,
        root: Path,
        keep_last: int,
        async_save: bool,
        validator: Callable[[Path, Snapshot], str | None],
        on_event: EventSink,
    ):
        self.root = Path(root)
        self.keep_last = keep_last
        self.async_save = async_save
        self.validator = validator
        self.on_event = on_event
        self.protect: set[int] = set()
        self._thread: threading.Thread | None = None
        self.outcomes: list[SaveOutcome] = []
        self.root.mkdir(parents=True, exist_ok=True)

    def save(self, snapshot: Snapshot) -> None:
        """Write `snapshot` (rank 0 only). In async mode this returns once the thread started."""
        self.wait()
        if self.async_save:
            self._thread = threading.Thread(target=self._write, args=(snapshot,), name="checkpoint-writer", daemon=True)
            self._thread.start()
        else:
            self._write(snapshot)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def last_valid(self) -> Path | None:
        valid = valid_checkpoints(self.root)
        return valid[0][1] if valid else None

    def _write(self, snap: Snapshot) -> None:
        import torch
        from safetensors.torch import save_file

        start = time.perf_counter()
        tmp = tmp_dir_for(self.root, snap.step)
        final = self.root / checkpoint_name(snap.step)
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            save_file(snap.model_state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            torch.save(snap.optimizer_state, tmp / "optimizer.pt")
            torch.save(snap.scheduler_state, tmp / "scheduler.pt")
            (tmp / TRAIN_STATE).write_text(json.dumps(snap.train_state, indent=2, sort_keys=True))
            reason = self.validator(tmp, snap)
            if reason is not None:
                shutil.rmtree(tmp, ignore_errors=True)
                self.on_event("P1", "checkpoint_invalid", f"checkpoint at step {snap.step} failed validation: {reason}")
                self.outcomes.append(SaveOutcome(snap.step, None, False, reason, time.perf_counter() - start))
                return
            write_manifest(tmp, snap.step)
            if final.exists():  # an older, unusable save of the same step (e.g. after a rollback)
                trash = self.root / f"{TMP_PREFIX}trash_{checkpoint_name(snap.step)}"
                shutil.rmtree(trash, ignore_errors=True)
                os.rename(final, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.rename(tmp, final)
            _fsync_dir(self.root)
            deleted = apply_retention(self.root, self.keep_last, self.protect)
            self.outcomes.append(SaveOutcome(snap.step, final, True, "", time.perf_counter() - start, deleted))
        except Exception as exc:  # noqa: BLE001 - disk full, quota, permissions (safetensors wraps
            # OSError in its own SafetensorError): reported, the previous state stays intact
            shutil.rmtree(tmp, ignore_errors=True)
            self.on_event("P1", "checkpoint_failed", f"checkpoint at step {snap.step} not written: {exc}")
            self.outcomes.append(SaveOutcome(snap.step, None, False, str(exc), time.perf_counter() - start))
