"""One optimizer step: forward/backward over the accumulation micro-batches, clip, AdamW.

The loss is the mean over every supervised token of the global batch (all micro-batches
of all ranks), so 1 rank x accum 2, 2 ranks x accum 1, and a micro batch halved after an
out-of-memory error all optimise the same objective. Each micro-batch's mean loss is
weighted by its token count over the global count (one small all-reduce at step start).

Two tiny collectives per optimizer step (none on one process): the global count of
supervised tokens, and [loss, out-of-memory flag, SIGTERM flag] before the last
micro-batch's backward (the one that synchronises gradients), so every rank takes the same
decision (retry with a smaller micro batch, save and exit) without leaving a peer stuck in
a gradient all-reduce.
"""

from __future__ import annotations

import contextlib
import gc
import math
from typing import TYPE_CHECKING, Any

from trainer.collectives import Collectives
from trainer.faults import FaultPlan
from trainer.state import StepResult
from trainer.step_metrics import skip_if_nonfinite

if TYPE_CHECKING:
    import numpy as np
    import torch
    from accelerate import Accelerator


def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def to_device(batch: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    import torch

    return {k: torch.from_numpy(batch[k]).to(device, non_blocking=True)
            for k in ("input_ids", "labels", "position_ids")}


class StepRunner:
    def __init__(self, accelerator: Accelerator, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler, comm: Collectives, faults: FaultPlan,
                 grad_clip: float | None, dp: int | None = None):
        self.accelerator = accelerator
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.comm = comm
        self.faults = faults
        self.max_norm = grad_clip or float("inf")
        # Data-parallel replicas; the ranks of a tensor-parallel group hold the same batch, so
        # world-wide sums count each row tp times.
        self.dp = dp or comm.world
        self.replicas = comm.world // self.dp
        # FSDP2 reduce-scatters every micro-batch's gradients (torchtitan does the same): under
        # accelerate's no_sync it would keep every parameter's gradient unsharded in fp32 until the
        # last micro-batch (40 GiB a device for Llama-3-70B, FSDP 8 x TP 8, 8 micro-batches), memory
        # the plan does not count (validation/plan/memory.py). DDP still accumulates locally.
        from torch.distributed.fsdp import FSDPModule

        self.sync_every_micro_batch = isinstance(model, FSDPModule)
        # Leave loss and grad norm on the device (read once per log interval by the loop,
        # trainer/step_metrics.py); set for CUDA, where every read waits for the device.
        self.defer = False

    def __call__(self, s: int, batches: list[dict[str, Any]], sigterm: bool) -> StepResult:
        """Step `s` (0-based) over `batches` (one per micro-batch); `sigterm`: this rank saw one."""
        import torch

        acc, model, world = self.accelerator, self.model, self.dp
        accum = len(batches)
        counts = [int((b["labels"][:, 1:] != -100).sum()) for b in batches]
        (global_tokens,) = self.comm.all_reduce([float(sum(counts))])
        global_tokens = max(global_tokens / self.replicas, 1.0)
        rows: dict[str, int] = {}
        for b in batches:
            for src in b["sources"]:
                rows[src] = rows.get(src, 0) + 1
        contributions: list[torch.Tensor] = []
        oom = False
        last: torch.Tensor | None = None
        try:
            for m, batch in enumerate(batches):
                inputs = to_device(batch, acc.device)
                if m == 0 and self.faults.oom_now(s + 1):
                    raise torch.OutOfMemoryError("injected out of memory (TRAINER_INJECT_OOM_AT_STEP)")
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
                        acc.backward(part * world)
                    else:
                        last = part
                contributions.append(part.detach().float())
                del out
        except Exception as exc:
            if not is_oom(exc):
                raise
            oom, contributions, last = True, [], None
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        if self.defer:
            return self._finish_deferred(contributions, last, oom, sigterm, rows)
        local_loss = float(torch.stack(contributions).sum()) if contributions else 0.0
        loss_value, any_oom, any_term = self.comm.all_reduce([local_loss, float(oom), float(sigterm)])
        loss_value /= self.replicas
        if any_oom or last is None:
            self.optimizer.zero_grad(set_to_none=True)
            return StepResult(float("nan"), float("nan"), oom=True, sigterm=any_term > 0)
        acc.backward(last * world)  # DDP/FSDP average over replicas; the factor makes it a sum
        grad_norm = float(acc.clip_grad_norm_(model.parameters(), self.max_norm))
        if math.isfinite(loss_value) and math.isfinite(grad_norm):
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(loss_value, grad_norm, sigterm=any_term > 0, rows=rows)

    def _finish_deferred(self, contributions: list[torch.Tensor], last: torch.Tensor | None, oom: bool,
                         sigterm: bool, rows: dict[str, int]) -> StepResult:
        """The same step without reading the loss or the grad norm on the host: only the host
        flags cross ranks here; the loss (this rank's share) and the norm stay on the device."""
        import torch

        any_oom, any_term = self.comm.all_reduce([float(oom), float(sigterm)])
        if any_oom or last is None:
            self.optimizer.zero_grad(set_to_none=True)
            return StepResult(float("nan"), float("nan"), oom=True, sigterm=any_term > 0)
        loss_share = torch.stack(contributions).sum()
        self.accelerator.backward(last * self.dp)
        norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.max_norm)
        norm = norm if isinstance(norm, torch.Tensor) else torch.tensor(float(norm))
        if skip_if_nonfinite(self.optimizer, loss_share, norm):
            self.optimizer.step()  # a non-finite step is skipped on the device
        elif math.isfinite(float(loss_share)) and math.isfinite(float(norm)):  # no fused kernel: read
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        nan = float("nan")
        return StepResult(nan, nan, sigterm=any_term > 0, rows=rows, device=(loss_share, norm))
