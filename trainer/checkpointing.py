"""Checkpoint glue between the loop and `trainer.checkpoint` (the on-disk format).

`CheckpointGlue` knows the live training objects (model, optimizer, scheduler, grad
scaler) and the ranks: it snapshots them (probe, save), proves a written checkpoint loads
to the same forward pass (validate), restores them (load), and picks the checkpoint to
resume or roll back to, so every rank agrees (one broadcast). The loop only decides *when*.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer import checkpoint as ckpt
from trainer.collectives import Collectives
from trainer.state import TrainState

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

    from validation.spec import ExperimentSpec

log = logging.getLogger("trainer.checkpointing")

# (level, kind, message[, step]) -> None; alerts at the current step unless `step` is given.
OnEvent = ckpt.EventSink


def layout_record(world: int, dp: int, tp: int, shard: int, replicate: int = 1) -> dict[str, Any]:
    """The layout a checkpoint was written under (train_state.json `layout`): processes and how
    they split the work. `fsdp` means parameters really are sharded (over more than one rank)."""
    return {"processes": world, "dp": dp, "tp": tp, "fsdp": shard > 1, "replicate": replicate}


def describe_layout(layout: dict[str, Any]) -> str:
    """`dp 2, fsdp`, `dp 1 x tp 2`, `dp 4, fsdp (hsdp 2 x 2)`: what the processes do, in words."""
    dp, tp = int(layout.get("dp", 1)), int(layout.get("tp", 1))
    text = f"dp {dp}" + (f" x tp {tp}" if tp > 1 else "")
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
            "fsdp": (Path(path) / ckpt.DCP_METADATA).is_file() and dp > 1, "replicate": 1}


def reshard_message(step: int, before: dict[str, Any], after: dict[str, Any]) -> str | None:
    """"resharded at step 30: 2 -> 1 processes (dp 2, fsdp -> dp 1)", or None when the layout
    did not change. Pure."""
    keys = ("processes", "dp", "tp", "fsdp")
    if all(before.get(k) == after.get(k) for k in keys):
        return None
    return (f"resharded at step {step}: {before.get('processes')} -> {after.get('processes')} processes "
            f"({describe_layout(before)} -> {describe_layout(after)})")


class CheckpointGlue:
    def __init__(self, spec: ExperimentSpec, root: Path, accelerator: Accelerator, raw_model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
                 comm: Collectives, rank: int, on_event: OnEvent, dp: int | None = None,
                 layout: dict[str, Any] | None = None):
        self.spec = spec
        self.dp = dp or comm.world  # data-parallel size: the global batch is micro x accum x dp
        self.layout = layout or layout_record(comm.world, self.dp, 1, 1)
        self.resharded: str | None = None
        """Set by `load` when the checkpoint was written under another layout (the P2 event's text)."""
        self.root = root
        self.accelerator = accelerator
        self.raw_model = raw_model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.comm = comm
        self.rank = rank
        self.is_main = rank == 0
        self.on_event = on_event
        self.stalls: list[float] = []  # seconds training waited per save
        self.writer = ckpt.Checkpointer(root, spec.train.keep_last, spec.train.async_checkpoint, self.validate, on_event)

    # ------------------------------------------------------------------ probe and validation

    def _probe(self) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        device = self.accelerator.device
        n = min(self.spec.data.seq_len, 64)
        ids = (torch.arange(n, device=device) * 7 % self.spec.model.vocab_size).unsqueeze(0)
        pos = torch.arange(n, device=device).unsqueeze(0)
        return ids, pos

    def probe_logits(self, model: torch.nn.Module) -> torch.Tensor:
        """Logits of a fixed input: a checkpoint is valid when a reload gives the same."""
        import torch

        ids, pos = self._probe()
        was_training = model.training
        model.eval()
        with torch.no_grad(), self.accelerator.autocast():
            out: torch.Tensor = model(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
        model.train(was_training)
        return out

    def validate(self, directory: Path, snap: ckpt.Snapshot) -> str | None:
        """Load the written weights into a fresh model; its forward pass must equal the live one's."""
        import torch

        from trainer.model import load_weights

        with torch.random.fork_rng(devices=[]):  # random init must not move the training RNG
            fresh = self.spec.model.build()
        try:
            load_weights(fresh, directory, self.spec.model)
        except Exception as exc:  # noqa: BLE001 - any load failure makes the checkpoint invalid
            return f"weights do not load: {exc}"
        fresh.to(self.accelerator.device)
        got = self.probe_logits(fresh)
        want = snap.extra["probe_logits"]
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
            return f"forward pass differs after reload (max abs diff {float((got - want).abs().max()):.3g})"
        return None

    # ------------------------------------------------------------------ save

    def _model_state(self, copy: bool) -> dict[str, Any]:
        state = self.raw_model.state_dict()
        if self.spec.model.tie_word_embeddings:
            tied = set(self.spec.model.tied_weight_names)
            state = {k: v for k, v in state.items() if k not in tied}
        return ckpt.to_cpu(state, copy)  # type: ignore[no-any-return]

    def save(self, state: TrainState) -> float:
        """Every rank: write its RNG; rank 0: snapshot and write (in the background when async).
        Returns the seconds training stalled."""
        t0 = time.perf_counter()
        step = state.step
        ckpt.write_rank_rng(self.root, step, self.rank)
        self.comm.barrier()
        if self.is_main:
            copy = self.spec.train.async_checkpoint
            scheduler_state: dict[str, Any] = {"scheduler": self.scheduler.state_dict()}
            if self.accelerator.scaler is not None:
                scheduler_state["scaler"] = self.accelerator.scaler.state_dict()
            snap = ckpt.Snapshot(
                step=step,
                model_state=self._model_state(copy),
                optimizer_state=ckpt.to_cpu(self.optimizer.state_dict(), copy),
                scheduler_state=scheduler_state,
                train_state=state.to_json() | {"saved_unix": time.time(), "layout": self.layout},
                extra={"probe_logits": self.probe_logits(self.raw_model)},
            )
            self.writer.save(snap)
        stall = time.perf_counter() - t0
        self.stalls.append(stall)
        log.info("checkpoint step %d: training stalled %.3fs (%s)", step, stall,
                 "async" if self.spec.train.async_checkpoint else "sync")
        return stall

    def wait_local(self) -> None:
        """Finish this process's background write without any collective (before a test's SIGKILL)."""
        if self.is_main:
            self.writer.wait()

    def wait(self) -> list[float]:
        """Finish a background write (rank 0); seconds each successful write took."""
        if self.is_main:
            self.writer.wait()
        return [o.write_s for o in self.writer.outcomes if o.ok]

    # ------------------------------------------------------------------ load, resume, rollback

    def load(self, path: Path, current: TrainState) -> TrainState:
        """Restore model, optimizer, scheduler, scaler and this rank's RNG; return the saved state,
        with the per-rank micro batch rescaled when the world size changed (same global batch)."""
        world = self.dp
        if (Path(path) / ckpt.DCP_METADATA).is_file():  # written by a sharded layout: DCP reshards
            from trainer import dcp

            dcp.load(path, self.raw_model, self.optimizer)
            data = ckpt.load_checkpoint(path, self.rank, tensors=False)
        else:
            data = ckpt.load_checkpoint(path, self.rank)
            self._load_weights_and_optimizer(path, data)
        self.scheduler.load_state_dict(data["scheduler"]["scheduler"])
        if "scaler" in data["scheduler"] and self.accelerator.scaler is not None:
            self.accelerator.scaler.load_state_dict(data["scheduler"]["scaler"])
        saved = data["train_state"]
        state = TrainState.from_json(saved)
        self.resharded = reshard_message(state.step, saved_layout(path, saved), self.layout)
        state.world_size = world
        state.spec_hash = current.spec_hash or state.spec_hash  # what runs now (a continuation: another layout)
        state.mlflow_run_id = state.mlflow_run_id or current.mlflow_run_id
        if saved.get("world_size", world) != world:
            global_rows = saved["micro_batch_size"] * saved["grad_accum_steps"] * saved["world_size"]
            micro = self.spec.train.micro_batch_size
            state.micro_batch_size, state.grad_accum_steps = micro, max(1, global_rows // (micro * world))
        if data["rng"] is not None:
            ckpt.set_rng_state(data["rng"])
        return state

    def _load_weights_and_optimizer(self, path: Path, data: dict[str, Any]) -> None:
        device = self.accelerator.device
        missing, unexpected = self.raw_model.load_state_dict(
            {k: v.to(device) for k, v in data["model"].items()}, strict=False)
        missing = [k for k in missing if k not in self.spec.model.tied_weight_names]
        assert not missing and not unexpected, (missing, unexpected)
        self.optimizer.load_state_dict(data["optimizer"])

    def find_resume(self) -> str | None:
        """The newest verified checkpoint (skipped ones raise a P1 alert naming them), same on every rank."""
        found: Path | None = None
        if self.is_main:
            for path in ckpt.clean_stale_temporaries(self.root):
                log.warning("removed unfinished checkpoint %s", path)
            found = ckpt.find_resume_checkpoint(self.root, self.on_event)
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


class ShardedCheckpointGlue(CheckpointGlue):
    """FSDP / TP: every rank writes its own shard with torch.distributed.checkpoint.

    Same rules as the one-process format: a temporary directory, validated (each rank reads
    its part back and compares it with what it saved: nothing is gathered), a MANIFEST.json
    with the sha256 of every file (each rank hashes what it wrote; rank 0 writes the
    manifest), then an atomic rename.

    `async_checkpoint`: training waits only while every rank copies its shards to CPU memory;
    a background thread writes them (DCP over a process group of its own, so its collectives
    never interleave with training's); the save is validated and renamed into place at the
    next save or `wait()` (end of run, rollback, preemption), which all ranks reach together.
    A process killed before that leaves a temporary directory: never a checkpoint.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._pending: tuple[int, Path, dict[str, Any], threading.Thread, float] | None = None
        self._bg_error: str | None = None
        self._group: Any = None
        if self.spec.train.async_checkpoint:
            import torch.distributed as dist

            self._group = dist.new_group(backend="gloo")  # collective: every rank builds its glue here

    def probe_logits(self, model: torch.nn.Module) -> torch.Tensor:  # pragma: no cover - invariant
        # The one-process validation (a fresh full model's forward pass) would gather the whole
        # model on one rank; sharded saves are validated by `dcp.verify_roundtrip` in `save` and
        # never reach the probe. Reaching it is a bug in this class, not a missing feature.
        raise AssertionError("sharded checkpoints never use the forward-pass probe")

    def save(self, state: TrainState) -> float:
        import shutil

        import torch

        from trainer import dcp

        t0 = time.perf_counter()
        self._complete_pending()  # publishing the previous background save is part of this stall
        step = state.step
        tmp = ckpt.tmp_dir_for(self.root, step)
        if self.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.comm.barrier()
        reason: str | None = None
        try:
            ckpt.write_rank_rng(self.root, step, self.rank)
            if self.is_main:
                torch.save({"scheduler": self.scheduler.state_dict()}, tmp / "scheduler.pt")
                (tmp / ckpt.TRAIN_STATE).write_text(json.dumps(state.to_json() | {"saved_unix": time.time(),
                                                                                   "layout": self.layout},
                                                               indent=2, sort_keys=True))
            if self._group is not None:
                staged = dcp.staged_copy(self.raw_model, self.optimizer)
                self._bg_error = None
                thread = threading.Thread(target=self._write_in_background, args=(tmp, staged),
                                          name="checkpoint-writer", daemon=True)
                thread.start()
                self._pending = (step, tmp, staged, thread, t0)
                return self._stalled(step, t0)
            dcp.save(tmp, self.raw_model, self.optimizer)
            reason = dcp.verify_roundtrip(tmp, dcp.live_model_state(self.raw_model))
        except Exception as exc:  # noqa: BLE001 - disk full, quota: reported, previous state intact
            reason = f"not written: {exc}"
        self._complete(step, tmp, reason, t0)
        return self._stalled(step, t0)

    def _stalled(self, step: int, t0: float) -> float:
        stall = time.perf_counter() - t0
        self.stalls.append(stall)
        log.info("checkpoint step %d (sharded, %d ranks, %s): training stalled %.3fs", step, self.comm.world,
                 "async" if self._group is not None else "sync", stall)
        return stall

    def _write_in_background(self, tmp: Path, staged: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        try:
            dcp_save(staged, checkpoint_id=str(tmp), process_group=self._group)
        except Exception as exc:  # noqa: BLE001 - reported when the save is completed
            self._bg_error = f"not written: {exc}"

    def wait_local(self) -> None:
        if self._pending is not None:
            self._pending[3].join()

    def wait(self) -> list[float]:
        self._complete_pending()
        return super().wait()

    def _complete_pending(self) -> None:
        """Collective: validate and publish the background save (every rank calls this together)."""
        if self._pending is None:
            return
        from trainer import dcp

        step, tmp, staged, thread, t0 = self._pending
        self._pending = None
        thread.join()
        reason = self._bg_error
        if reason is None:
            try:
                reason = dcp.verify_roundtrip(tmp, staged["model"])
            except Exception as exc:  # noqa: BLE001
                reason = f"not readable: {exc}"
        self._complete(step, tmp, reason, t0)

    def _complete(self, step: int, tmp: Path, reason: str | None, t0: float) -> None:
        """Collective: every rank hashes its files; rank 0 writes the manifest and renames."""
        self.comm.barrier()  # every rank's files are complete before anyone hashes
        files: dict[str, dict[str, Any]] = {}
        if reason is None:
            for path in sorted(tmp.iterdir()):
                mine = path.name.startswith((f"__{self.rank}_", f"rng_rank{self.rank}."))
                rank0 = self.is_main and not path.name.startswith(("__", "rng_rank"))
                if path.is_file() and (mine or rank0):
                    files[path.name] = ckpt.file_entry(path)
        reasons = self.comm.gather(reason)
        all_files = self.comm.gather(files)
        if self.is_main:
            self._finalise(step, tmp, [r for r in reasons if r], all_files, time.perf_counter() - t0)
        self.comm.barrier()

    def _finalise(self, step: int, tmp: Path, problems: list[str], all_files: list[dict[str, dict[str, Any]]],
                  seconds: float) -> None:
        import os
        import shutil

        final = self.root / ckpt.checkpoint_name(step)
        if problems:
            shutil.rmtree(tmp, ignore_errors=True)
            self.on_event("P1", "checkpoint_invalid", f"checkpoint at step {step} failed validation: {problems[0]}")
            self.writer.outcomes.append(ckpt.SaveOutcome(step, None, False, problems[0], seconds))
            return
        merged: dict[str, dict[str, Any]] = {}
        for files in all_files:
            merged |= files
        ckpt.write_manifest(tmp, step, merged, {"format": "dcp", "world_size": self.comm.world})
        if final.exists():
            trash = self.root / f"{ckpt.TMP_PREFIX}trash_{ckpt.checkpoint_name(step)}"
            shutil.rmtree(trash, ignore_errors=True)
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(tmp, final)
        deleted = ckpt.apply_retention(self.root, self.spec.train.keep_last, self.writer.protect)
        self.writer.outcomes.append(ckpt.SaveOutcome(step, final, True, "", seconds, deleted))

    def _load_weights_and_optimizer(self, path: Path, data: dict[str, Any]) -> None:
        from trainer import dcp

        dcp.load_legacy(path, self.raw_model, self.optimizer, self.spec.model)  # written by one process or DDP
