"""The on-disk checkpoint format, torch-free: what pipelines and the trainer read.

`RUN/checkpoints/step_000200/` is a checkpoint only when its MANIFEST.json verifies (every
listed file present, of the listed size and sha256); anything else (a `.tmp_*` directory,
a step directory without a manifest) is a save that did not finish. The files of each
layout, the temporary-directory protocol and how resume picks one: docs/checkpoints.md.

Nothing here imports torch or safetensors (tests/unit/test_spec_layers.py checks it), so the
orchestration layer lists, verifies and copies checkpoints without loading a tensor.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Protocol

from basics.files import atomic_write_json, fsync_dir, sha256_file

MANIFEST = "MANIFEST.json"
TRAIN_STATE = "train_state.json"
MODEL = "model.safetensors"  # unsharded: the weights (tied output weight omitted)
OPTIMIZER = "optimizer.pt"  # unsharded: the optimizer's state_dict
SCHEDULER = "scheduler.pt"  # both layouts: lr scheduler (+ fp16 grad scaler) state
DCP_METADATA = ".metadata"  # sharded: torch.distributed.checkpoint's index of the shards
PREFIX = "step_"
TMP_PREFIX = ".tmp_"


class EventSink(Protocol):
    """(level, kind, message[, step]) -> None; the trainer turns these into alerts, stamped with
    `step` when the event is about another step than the one the run is at (a skipped checkpoint)."""

    def __call__(self, level: str, kind: str, message: str, step: int | None = None, /) -> None: ...


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:06d}"


def tmp_dir_for(root: Path, step: int) -> Path:
    return Path(root) / f"{TMP_PREFIX}{checkpoint_name(step)}"


def rng_file(rank: int) -> str:
    """Every rank's python / numpy / torch RNG state, in both layouts."""
    return f"rng_rank{rank}.pt"


def shard_prefix(rank: int) -> str:
    """DCP names the shard rank N writes `__N_0.distcp`."""
    return f"__{rank}_"


# ---------------------------------------------------------------------- manifest


def file_entry(path: Path) -> dict[str, Any]:
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def write_manifest(directory: Path, step: int, files: dict[str, dict[str, Any]] | None = None,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Hash every file in `directory` (or take `files`, hashed by the ranks that wrote them)
    and write MANIFEST.json last (fsynced)."""
    if files is None:
        files = {p.name: file_entry(p) for p in sorted(directory.iterdir()) if p.is_file() and p.name != MANIFEST}
    manifest = {"step": step, "files": dict(sorted(files.items())), "created_unix": time.time()} | (extra or {})
    atomic_write_json(directory / MANIFEST, manifest)
    fsync_dir(directory)
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
    if TRAIN_STATE not in files or not ({MODEL, DCP_METADATA} & set(files)):
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


def is_sharded(directory: Path) -> bool:
    """Written by a sharded layout (torch.distributed.checkpoint files)."""
    return (Path(directory) / DCP_METADATA).is_file()


# ---------------------------------------------------------------------- listing and choosing


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Finished-looking checkpoint directories, newest first (not yet verified)."""
    out: list[tuple[int, Path]] = []
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
    """Checkpoint directories with a manifest, newest first (the manifest is written last)."""
    return [(s, p) for s, p in list_checkpoints(root) if (p / MANIFEST).is_file()]


def best_checkpoint_step(valid: list[tuple[int, Path]]) -> int | None:
    """Step of the valid checkpoint with the lowest eval metric recorded in its train_state.json."""
    best: tuple[float, int] | None = None
    for step, path in valid:
        try:
            metric = read_train_state(path).get("eval_metric")
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


# ---------------------------------------------------------------------- train_state.json


def write_train_state(directory: Path, train_state: dict[str, Any]) -> None:
    (Path(directory) / TRAIN_STATE).write_text(json.dumps(train_state, indent=2, sort_keys=True))


def train_state_record(state: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    """train_state.json: the loop's `TrainState` fields, when it was saved, and under which layout."""
    return state | {"saved_unix": time.time(), "layout": layout}


def read_train_state(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(directory) / TRAIN_STATE).read_text())
    return data


def layout_record(world: int, dp: int, tp: int, shard: int, replicate: int = 1, pp: int = 1) -> dict[str, Any]:
    """The layout a checkpoint was written under (train_state.json `layout`): processes and how
    they split the work. `fsdp` means parameters really are sharded (over more than one rank)."""
    return {"processes": world, "dp": dp, "tp": tp, "fsdp": shard > 1, "replicate": replicate, "pp": pp}


def describe_layout(layout: dict[str, Any]) -> str:
    """`dp 2, fsdp`, `dp 1 x tp 2`, `dp 1 x pp 2`, `dp 4, fsdp (hsdp 2 x 2)`: what the processes
    do, in words."""
    dp, tp, pp = int(layout.get("dp", 1)), int(layout.get("tp", 1)), int(layout.get("pp", 1))
    text = f"dp {dp}" + (f" x tp {tp}" if tp > 1 else "") + (f" x pp {pp}" if pp > 1 else "")
    if layout.get("fsdp"):
        replicate = int(layout.get("replicate", 1))
        text += ", fsdp" + (f" (hsdp {replicate} x {dp // replicate})" if replicate > 1 else "")
    return text


def saved_layout(path: Path, saved_state: dict[str, Any]) -> dict[str, Any]:
    """The layout of the checkpoint at `path`: recorded in train_state.json, or (older
    checkpoints) inferred: processes from the ranks' RNG files, dp from the saved world size."""
    if isinstance(saved_state.get("layout"), dict):
        return dict(saved_state["layout"])
    processes = len(list(Path(path).glob("rng_rank*.pt"))) or 1
    dp = int(saved_state.get("world_size", processes))
    return {"processes": processes, "dp": dp, "tp": max(1, processes // max(1, dp)),
            "fsdp": is_sharded(path) and dp > 1, "replicate": 1}


def reshard_message(step: int, before: dict[str, Any], after: dict[str, Any]) -> str | None:
    """"resharded at step 30: 2 -> 1 processes (dp 2, fsdp -> dp 1)", or None when the layout
    did not change. Pure."""
    keys = ("processes", "dp", "tp", "fsdp", "pp")
    if all(before.get(k, 1 if k == "pp" else None) == after.get(k, 1 if k == "pp" else None) for k in keys):
        return None
    return (f"resharded at step {step}: {before.get('processes')} -> {after.get('processes')} processes "
            f"({describe_layout(before)} -> {describe_layout(after)})")
