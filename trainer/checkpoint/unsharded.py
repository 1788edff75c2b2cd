"""The unsharded layout (one process, data parallelism): rank 0 writes the whole state.

  model.safetensors  weights (tied output weight omitted)
  optimizer.pt       the optimizer's state_dict
  scheduler.pt       {"scheduler": ..., "scaler": ...} (the scaler under fp16 only)

beside every rank's `rng_rank<N>.pt` and `train_state.json`. A save is validated before it
is published: the written weights, loaded into a freshly built model, must give the live
model's forward pass on a fixed input. The own format (rather than `accelerator.save_state`)
lets an asynchronous save snapshot everything to CPU memory first (training waits for the
copy only) and write it from the writer's thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.checkpoint.format import (
    MODEL,
    OPTIMIZER,
    SCHEDULER,
    tmp_dir_for,
    train_state_record,
    write_train_state,
)
from trainer.checkpoint.rng import write_rank_rng
from trainer.checkpoint.writer import CheckpointWriter

if TYPE_CHECKING:
    import torch

    from trainer.checkpoint.manager import Live
    from trainer.state import TrainState


@dataclass
class Snapshot:
    """Everything rank 0 writes for one checkpoint, already on CPU."""

    step: int
    model_state: dict[str, Any]
    optimizer_state: dict[str, Any]
    scheduler_state: dict[str, Any]
    train_state: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


Validator = Callable[[Path, Snapshot], "str | None"]
"""(temporary directory, snapshot) -> why the written checkpoint is invalid, or None."""


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


def save_snapshot(writer: CheckpointWriter, snap: Snapshot, validator: Validator) -> None:
    """Write `snap` through `writer` (in its thread when async): files, validation, publish.
    A failed write is reported and removed; the previous checkpoints stay intact."""
    writer.submit(lambda: _write(writer, snap, validator))


def _write(writer: CheckpointWriter, snap: Snapshot, validator: Validator) -> None:
    import torch
    from safetensors.torch import save_file

    start = time.perf_counter()
    tmp = tmp_dir_for(writer.root, snap.step)
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        save_file(snap.model_state, str(tmp / MODEL), metadata={"format": "pt"})
        torch.save(snap.optimizer_state, tmp / OPTIMIZER)
        torch.save(snap.scheduler_state, tmp / SCHEDULER)
        write_train_state(tmp, snap.train_state)
        reason = validator(tmp, snap)
        if reason is not None:
            writer.reject(snap.step, tmp, reason, start)
            return
        writer.publish(snap.step, tmp, start)
    except Exception as exc:  # noqa: BLE001 - disk full, quota, permissions (safetensors wraps
        # OSError in its own SafetensorError): reported, the previous state stays intact
        writer.fail(snap.step, tmp, exc, start)


class UnshardedStorage:
    """Every rank writes its RNG; rank 0 snapshots model, optimizer and scheduler and writes them."""

    def __init__(self, live: Live):
        self.live = live

    def describe(self) -> str:
        return "async" if self.live.writer.async_save else "sync"

    # ------------------------------------------------------------------ probe and validation

    def _probe(self) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        spec = self.live.spec
        device = self.live.accelerator.device
        n = min(spec.data.seq_len, 64)
        ids = (torch.arange(n, device=device) * 7 % spec.model.vocab_size).unsqueeze(0)
        pos = torch.arange(n, device=device).unsqueeze(0)
        return ids, pos

    def probe_logits(self, model: torch.nn.Module) -> torch.Tensor:
        """Logits of a fixed input: a checkpoint is valid when a reload gives the same."""
        import torch

        ids, pos = self._probe()
        was_training = model.training
        model.eval()
        with torch.no_grad(), self.live.accelerator.autocast():
            out: torch.Tensor = model(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
        model.train(was_training)
        return out

    def validate(self, directory: Path, snap: Snapshot) -> str | None:
        """Load the written weights into a fresh model; its forward pass must equal the live one's."""
        import torch

        from trainer.model import load_weights

        spec = self.live.spec
        with torch.random.fork_rng(devices=[]):  # random init must not move the training RNG
            fresh = spec.model.build()
        try:
            load_weights(fresh, directory, spec.model)
        except Exception as exc:  # noqa: BLE001 - any load failure makes the checkpoint invalid
            return f"weights do not load: {exc}"
        fresh.to(self.live.accelerator.device)
        got = self.probe_logits(fresh)
        want = snap.extra["probe_logits"]
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
            return f"forward pass differs after reload (max abs diff {float((got - want).abs().max()):.3g})"
        return None

    # ------------------------------------------------------------------ save

    def _model_state(self, copy: bool) -> dict[str, Any]:
        arch = self.live.spec.model
        state = self.live.model.state_dict()
        if arch.tie_word_embeddings:
            tied = set(arch.tied_weight_names)
            state = {k: v for k, v in state.items() if k not in tied}
        return to_cpu(state, copy)  # type: ignore[no-any-return]

    def save(self, state: TrainState) -> None:
        """Collective. In async mode rank 0 returns once the CPU snapshot is taken."""
        live = self.live
        write_rank_rng(live.writer.root, state.step, live.rank)
        live.comm.barrier()
        if live.is_main:
            copy = live.writer.async_save
            scheduler_state: dict[str, Any] = {"scheduler": live.scheduler.state_dict()}
            if live.accelerator.scaler is not None:
                scheduler_state["scaler"] = live.accelerator.scaler.state_dict()
            snap = Snapshot(
                step=state.step,
                model_state=self._model_state(copy),
                optimizer_state=to_cpu(live.optimizer.state_dict(), copy),
                scheduler_state=scheduler_state,
                train_state=train_state_record(state.to_json(), live.layout),
                extra={"probe_logits": self.probe_logits(live.model)},
            )
            save_snapshot(live.writer, snap, self.validate)

    def complete(self) -> None:
        """Nothing to publish collectively: rank 0's writer publishes each save itself."""

    # ------------------------------------------------------------------ load

    def load_unsharded(self, path: Path) -> None:
        """model.safetensors + optimizer.pt into the live model and optimizer."""
        import torch
        from safetensors.torch import load_file

        live = self.live
        device = live.accelerator.device
        weights = load_file(str(Path(path) / MODEL))
        missing, unexpected = live.model.load_state_dict({k: v.to(device) for k, v in weights.items()}, strict=False)
        missing = [k for k in missing if k not in live.spec.model.tied_weight_names]
        assert not missing and not unexpected, (missing, unexpected)
        live.optimizer.load_state_dict(torch.load(Path(path) / OPTIMIZER, map_location="cpu", weights_only=False))
