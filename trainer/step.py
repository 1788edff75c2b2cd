"""One optimizer step for every layout: clip, non-finite skip, schedule, stop consensus, OOM fallback.

The loss is the mean over every supervised token of the global batch (all micro-batches
of all ranks), so 1 rank x accum 2, 2 ranks x accum 1, and a micro batch halved after an
out-of-memory error all optimise the same objective. Each micro-batch's mean loss is
weighted by its token count over the global count (one small all-reduce at step start).

`StepRunner` is the step; how its forward and backward run over the micro-batches is the
layout's `ForwardBackward` (the model parts give it, trainer/model_parts.py): `MicroBatches`
below for one model (one process, DDP, FSDP, TP), the pipeline schedule for stages
(trainer/pipeline_parallel.py `PipelineSchedule`). Everything else is the same for all:

Two tiny collectives per optimizer step (none on one process): the global count of
supervised tokens (with an out-of-memory flag known before the forward), and [loss,
out-of-memory flag, SIGTERM flag] before the backward that
synchronises gradients across ranks, so every rank takes the same decision (retry with a
smaller micro batch, save and exit) without leaving a peer stuck in a gradient all-reduce.
Then the gradients are synchronised, clipped to `train.grad_clip`, and a step whose loss or
norm is not finite is skipped; with deferred reads (`defer`, GPUs) loss and norm stay on the
device (trainer/step_metrics.py) and a fused optimizer skips a non-finite step by itself.

torch is imported inside the functions, for speed only: `pipeline` commands import trainer.loop
(and so this module) without running a step.
"""

from __future__ import annotations

import contextlib
import gc
import math
from typing import TYPE_CHECKING, Any, Protocol

from trainer.collectives import Collectives
from trainer.faults import FaultPlan
from trainer.state import StepResult
from trainer.step_metrics import skip_if_nonfinite

if TYPE_CHECKING:
    import numpy as np
    import torch
    from accelerate import Accelerator


class ForwardBackward(Protocol):
    """How one step's forward and backward run over its micro-batches (the layout's half of a step)."""

    loss_divisor: int
    """Ranks whose loss shares count the same rows (the all-reduced loss is divided by it)."""

    def global_tokens(self, total: float) -> float:
        """The loss weights' denominator from the world-wide sum of every rank's supervised tokens."""

    def run(self, s: int, batches: list[dict[str, Any]], counts: list[int], global_tokens: float) -> list[Any]:
        """Forward and backward of every micro-batch but the synchronising part; this rank's loss
        contributions. May raise out of memory (the step then retries with a smaller micro batch)."""

    def loss_share(self, contributions: list[Any], host: bool) -> Any:
        """This rank's share of the step's loss: a float (`host`) or a 0-dim device tensor."""

    def discard(self) -> None:
        """Forget the pending backward (after out of memory on some rank)."""

    def finish_backward(self) -> None:
        """The backward that synchronises the gradients across ranks (every rank calls it)."""

    def clip(self, max_norm: float, host: bool) -> Any:
        """Clip to `max_norm`; the global gradient norm before clipping (float, or device tensor)."""


def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def to_device(batch: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    import torch

    return {k: torch.from_numpy(batch[k]).to(device, non_blocking=True)
            for k in ("input_ids", "labels", "position_ids")}


class MicroBatches:
    """One model (one process, DDP, FSDP, TP) through accelerate: each micro-batch's forward and
    backward in turn, the last one's backward (the one DDP synchronises) kept for `finish_backward`."""

    def __init__(self, accelerator: Accelerator, model: torch.nn.Module, comm: Collectives, faults: FaultPlan,
                 dp: int | None = None):
        self.accelerator = accelerator
        self.model = model
        self.comm = comm
        self.faults = faults
        # Data-parallel replicas; the ranks of a tensor-parallel group hold the same batch, so
        # world-wide sums count each row tp times.
        self.dp = dp or comm.world
        self.loss_divisor = comm.world // self.dp
        # FSDP2 reduce-scatters every micro-batch's gradients (torchtitan does the same): under
        # accelerate's no_sync it would keep every parameter's gradient unsharded in fp32 until the
        # last micro-batch (40 GiB a device for Llama-3-70B, FSDP 8 x TP 8, 8 micro-batches), memory
        # the plan does not count (validation/plan/memory.py). DDP still accumulates locally.
        from torch.distributed.fsdp import FSDPModule  # inside, for speed (the module doc says why)

        self.sync_every_micro_batch = isinstance(model, FSDPModule)
        self._last: torch.Tensor | None = None

    def global_tokens(self, total: float) -> float:
        return max(total / self.loss_divisor, 1.0)

    def run(self, s: int, batches: list[dict[str, Any]], counts: list[int], global_tokens: float) -> list[Any]:
        acc, model, accum = self.accelerator, self.model, len(batches)
        contributions: list[torch.Tensor] = []
        self._last = None
        for m, batch in enumerate(batches):
            inputs = to_device(batch, acc.device)
            skip_sync = m < accum - 1 and self.comm.world > 1 and not self.sync_every_micro_batch
            sync_ctx = acc.no_sync(model) if skip_sync else contextlib.nullcontext()
            with sync_ctx:
                out = model(**inputs, use_cache=False)
                loss = out.loss
                if m == accum - 1 and self.faults.nan_now(s + 1):
                    loss = loss * float("nan")
                if counts[m]:
                    part = loss * (counts[m] / global_tokens)
                else:  # no supervised token: contributes nothing, still joins the gradient sync
                    part = out.logits.sum() * 0.0
                if m < accum - 1:
                    acc.backward(part * self.dp)
                else:
                    self._last = part
            contributions.append(part.detach().float())
            del out
        return contributions

    def loss_share(self, contributions: list[Any], host: bool) -> Any:
        import torch

        if not host:
            return torch.stack(contributions).sum()
        return float(torch.stack(contributions).sum()) if contributions else 0.0

    def discard(self) -> None:
        self._last = None

    def finish_backward(self) -> None:
        assert self._last is not None, "run() keeps the last micro-batch's backward"
        self.accelerator.backward(self._last * self.dp)  # DDP/FSDP average over replicas; the factor makes it a sum
        self._last = None

    def clip(self, max_norm: float, host: bool) -> Any:
        import torch

        norm = self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm)  # DTensor-aware across meshes
        if host:
            return float(norm)
        return norm if isinstance(norm, torch.Tensor) else torch.tensor(float(norm))


class StepRunner:
    """One optimizer step of any layout: `forward_backward` is how its micro-batches run."""

    def __init__(self, forward_backward: ForwardBackward, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler, comm: Collectives, faults: FaultPlan,
                 grad_clip: float | None):
        self.fb = forward_backward
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.comm = comm
        self.faults = faults
        self.max_norm = grad_clip or float("inf")
        # Leave loss and grad norm on the device (read once per log interval by the loop,
        # trainer/step_metrics.py); set for CUDA, where every read waits for the device.
        self.defer = False

    @property
    def replicas(self) -> int:
        """Ranks whose loss shares count the same rows (the loop divides summed shares by it)."""
        return self.fb.loss_divisor

    def __call__(self, s: int, batches: list[dict[str, Any]], sigterm: bool) -> StepResult:
        """Step `s` (0-based) over `batches` (one per micro-batch); `sigterm`: this rank saw one."""
        import torch

        counts = [int((b["labels"][:, 1:] != -100).sum()) for b in batches]
        # An out-of-memory error known before the forward (the injected one) rides on the token
        # count, so no rank starts a forward whose collectives or stage-to-stage transfers a peer
        # skips. One raised inside a forward is agreed on below (a peer waiting in a sharded
        # forward's collective or a stage's receive cannot be released: no layout can).
        total, oom_first = self.comm.all_reduce([float(sum(counts)), float(self.faults.oom_now(s + 1))])
        global_tokens = self.fb.global_tokens(total)
        rows: dict[str, int] = {}
        for b in batches:
            for src in b["sources"]:
                rows[src] = rows.get(src, 0) + 1
        contributions: list[Any] = []
        oom = False
        try:
            if oom_first:
                raise torch.OutOfMemoryError("injected out of memory (TRAINER_INJECT_OOM_AT_STEP)")
            contributions = self.fb.run(s, batches, counts, global_tokens)
        except Exception as exc:
            if not is_oom(exc):
                raise
            oom, contributions = True, []
            self.fb.discard()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        if self.defer:
            return self._finish_deferred(contributions, oom, sigterm, rows)
        local_loss = self.fb.loss_share(contributions, host=True)
        loss_value, any_oom, any_term = self.comm.all_reduce([local_loss, float(oom), float(sigterm)])
        loss_value /= self.fb.loss_divisor
        if any_oom:
            self.fb.discard()
            self.optimizer.zero_grad(set_to_none=True)
            return StepResult(float("nan"), float("nan"), oom=True, sigterm=any_term > 0)
        self.fb.finish_backward()
        grad_norm = self.fb.clip(self.max_norm, host=True)
        if math.isfinite(loss_value) and math.isfinite(grad_norm):
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(loss_value, grad_norm, sigterm=any_term > 0, rows=rows)

    def _finish_deferred(self, contributions: list[Any], oom: bool, sigterm: bool,
                         rows: dict[str, int]) -> StepResult:
        """The same step without reading the loss or the grad norm on the host: only the host
        flags cross ranks here; the loss (this rank's share) and the norm stay on the device."""
        any_oom, any_term = self.comm.all_reduce([float(oom), float(sigterm)])
        if any_oom:
            self.fb.discard()
            self.optimizer.zero_grad(set_to_none=True)
            return StepResult(float("nan"), float("nan"), oom=True, sigterm=any_term > 0)
        loss_share = self.fb.loss_share(contributions, host=False)
        self.fb.finish_backward()
        norm = self.fb.clip(self.max_norm, host=False)
        if skip_if_nonfinite(self.optimizer, loss_share, norm):
            self.optimizer.step()  # a non-finite step is skipped on the device
        elif math.isfinite(float(loss_share)) and math.isfinite(float(norm)):  # no fused kernel: read
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        nan = float("nan")
        return StepResult(nan, nan, sigterm=any_term > 0, rows=rows, device=(loss_share, norm))
