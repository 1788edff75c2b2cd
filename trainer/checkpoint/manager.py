"""`CheckpointManager`: the one checkpoint object the training loop holds.

It knows the live training objects (the model parts, optimizer, scheduler, grad scaler) and the
parallel dims (trainer/parallel.py `ParallelDims`: the layout, the ranks, the checkpointer's group);
the layout's `Storage` (unsharded or sharded) writes and reads model and optimizer, the one
`CheckpointWriter` publishes. The manager saves (and times the stall), restores (any layout
into any other, rescaling the micro batch so the global batch stays), and picks the
checkpoint to resume or roll back to so that every rank agrees (one broadcast). The loop
only decides *when*.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trainer.checkpoint.format import (
    SCHEDULER,
    EventSink,
    clean_stale_temporaries,
    find_resume_checkpoint,
    is_sharded,
    layout_record,
    read_train_state,
    reshard_message,
    saved_layout,
)
from trainer.checkpoint.rng import read_rank_rng, set_rng_state
from trainer.checkpoint.sharded import ShardedStorage, load_shards
from trainer.checkpoint.unsharded import UnshardedStorage
from trainer.checkpoint.writer import CheckpointWriter
from trainer.collectives import Collectives
from trainer.state import TrainState

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

    from trainer.model_parts import ModelParts
    from trainer.parallel import ParallelDims
    from validation.spec import ExperimentSpec

log = logging.getLogger("trainer.checkpoint")


@dataclass(frozen=True)
class Live:
    """What a layout saves and restores, and where it writes."""

    spec: ExperimentSpec
    accelerator: Accelerator
    parts: ModelParts
    """The model parts (trainer/model_parts.py): their `owner`'s state_dict keys are the checkpoint's."""
    dims: ParallelDims
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    comm: Collectives
    rank: int
    layout: dict[str, Any]
    """The layout saves are written under (train_state.json `layout`)."""
    writer: CheckpointWriter

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def model(self) -> torch.nn.Module:
        """This rank's parameters under the model's own names (the unwrapped model, the stages' holder)."""
        owner: torch.nn.Module = self.parts.owner
        return owner


class Storage(Protocol):
    """How one layout writes model + optimizer and reads an unsharded checkpoint into itself.
    A sharded (DCP) checkpoint loads into every layout through `sharded.load_shards`."""

    def describe(self) -> str: ...

    def save(self, state: TrainState) -> None:
        """Collective: write checkpoint `state.step` (through the writer; in its thread when async)."""

    def complete(self) -> None:
        """Collective: publish a save still in flight that needs every rank."""

    def load_unsharded(self, path: Path) -> None:
        """model.safetensors + optimizer.pt into the live model and optimizer."""


class CheckpointManager:
    def __init__(self, spec: ExperimentSpec, root: Path, accelerator: Accelerator, parts: ModelParts,
                 optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
                 comm: Collectives, dims: ParallelDims, on_event: EventSink):
        """One checkpoint path for every layout: `dims` says whether the parts are sharded (DCP,
        every rank its shard) or whole (rank 0 writes), and under which layout saves are recorded."""
        self.spec = spec
        self.root = Path(root)
        self.dp = dims.dp  # data-parallel size: the global batch is micro x accum x dp
        self.layout = layout_record(dims.world, dims.dp, dims.tp, dims.shard, dims.replicate, dims.pp)
        rank = dims.rank
        self.resharded: str | None = None
        """Set by `load` when the checkpoint was written under another layout (the P2 event's text)."""
        self.comm = comm
        self.rank = rank
        self.is_main = rank == 0
        self.on_event = on_event
        self.stalls: list[float] = []  # seconds training waited per save
        self.writer = CheckpointWriter(self.root, spec.train.keep_last, spec.train.async_checkpoint, on_event)
        self.live = Live(spec, accelerator, parts, dims, optimizer, scheduler, comm, rank, self.layout, self.writer)
        self.storage: Storage = ShardedStorage(self.live) if dims.sharded else UnshardedStorage(self.live)

    # ------------------------------------------------------------------ save

    def save(self, state: TrainState) -> float:
        """Collective: write checkpoint `state.step` (in the background when async).
        Returns the seconds training stalled."""
        t0 = time.perf_counter()
        self.storage.save(state)
        stall = time.perf_counter() - t0
        self.stalls.append(stall)
        log.info("checkpoint step %d (%s): training stalled %.3fs", state.step, self.storage.describe(), stall)
        return stall

    def wait_local(self) -> None:
        """Finish this process's background write without any collective (before a test's SIGKILL)."""
        self.writer.wait()

    def wait(self) -> list[float]:
        """Collective: finish and publish every save in flight; seconds each successful write took."""
        self.storage.complete()
        self.writer.wait()
        return [o.write_s for o in self.writer.outcomes if o.ok]

    # ------------------------------------------------------------------ load, resume, rollback

    def load(self, path: Path, current: TrainState) -> TrainState:
        """Restore model, optimizer, scheduler, scaler and this rank's RNG; return the saved state,
        with the per-rank micro batch rescaled when the world size changed (same global batch)."""
        import torch

        path, live, world = Path(path), self.live, self.dp
        if is_sharded(path):  # written by a sharded layout: DCP reshards into any layout
            load_shards(path, live.parts, live.optimizer)
        else:
            self.storage.load_unsharded(path)
        scheduler = torch.load(path / SCHEDULER, map_location="cpu", weights_only=False)
        live.scheduler.load_state_dict(scheduler["scheduler"])
        if "scaler" in scheduler and live.accelerator.scaler is not None:
            live.accelerator.scaler.load_state_dict(scheduler["scaler"])
        saved = read_train_state(path)
        state = TrainState.from_json(saved)
        self.resharded = reshard_message(state.step, saved_layout(path, saved), self.layout)
        state.world_size = world
        state.spec_hash = current.spec_hash or state.spec_hash  # what runs now (a continuation: another layout)
        state.mlflow_run_id = state.mlflow_run_id or current.mlflow_run_id
        if saved.get("world_size", world) != world:
            global_rows = saved["micro_batch_size"] * saved["grad_accum_steps"] * saved["world_size"]
            micro = self.spec.train.micro_batch_size
            state.micro_batch_size, state.grad_accum_steps = micro, max(1, global_rows // (micro * world))
        rng = read_rank_rng(path, self.rank)
        if rng is not None:
            set_rng_state(rng)
        return state

    def find_resume(self) -> str | None:
        """The newest verified checkpoint (skipped ones raise a P1 alert naming them), same on every rank."""
        found: Path | None = None
        if self.is_main:
            for path in clean_stale_temporaries(self.root):
                log.warning("removed unfinished checkpoint %s", path)
            found = find_resume_checkpoint(self.root, self.on_event)
        return self.comm.broadcast(str(found) if found else None)

    def rollback(self, state: TrainState, failed_step: int) -> tuple[TrainState, str] | None:
        """Restore the last good checkpoint and skip the batches around the spike (PaLM).

        `failed_step` is the 0-based step that triggered it. Returns the restored state and the
        message for the P1 `rollback` alert (the caller raises it once the state is adopted, so
        the alert carries the restored step); None, after a P0 alert, when the limit is reached
        or nothing valid exists: the caller then stops.
        """
        self.wait()
        self.comm.barrier()
        if state.rollbacks >= self.spec.alerts.max_rollbacks:
            self.on_event("P0", "rollback_limit", f"{state.rollbacks} rollbacks already; stopping")
            return None
        last = self.writer.last_valid() if self.is_main else None
        path = self.comm.broadcast(str(last) if last else None)
        if path is None:
            self.on_event("P0", "rollback_impossible", "no valid checkpoint to roll back to; stopping")
            return None
        restored = self.load(Path(path), state)
        skip = self.spec.alerts.rollback_skip_batches
        restored.rollbacks = state.rollbacks + 1
        restored.data_offset = state.data_offset + (failed_step + 1 - restored.step) + skip
        note = (f"rolled back to {Path(path).name} after step {failed_step + 1}; skipping {skip} batches "
                f"(data offset {restored.data_offset}); metrics of repeated steps are not re-logged")
        return restored, note
