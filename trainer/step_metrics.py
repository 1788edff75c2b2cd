"""Per-step loss and grad norm kept on the device, read once per log interval (issue 12, part 5).

On a GPU every `float(tensor)` / `.item()` waits until the device has finished the work queued
so far: one such read per step serialises host and device (the host cannot queue step k+1
while step k runs). Two per step (loss, grad norm) plus a finite check before the optimizer
are what the trainer's step used to do. This module removes them:

- `DeviceScalars` keeps each step's 0-dim tensors and turns a whole window into Python floats
  with one stack and one `.tolist()` (on several ranks, after one all-reduce of the stacked
  losses): one synchronisation per log interval instead of two or three per step. Whatever needs
  the values per step (the anomaly detector, the per-step log lines) reads them from that batch.
- `skip_if_nonfinite` lets a fused AdamW skip the update on the device when the loss or the
  gradient norm is not finite (its `found_inf` input, the mechanism `GradScaler` uses), so the
  decision needs no host read either.

On a CPU a read costs nothing (the work is already done when the op returns), so the trainer
keeps reading every step there; the tests run the deferred path on the CPU and count the reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class DeviceScalars:
    """A window of (step, loss, grad norm) with the values still on the device."""

    def __init__(self, all_reduce_sum: Callable[[torch.Tensor], None] | None = None):
        self._steps: list[int] = []
        self._loss: list[torch.Tensor] = []
        self._norm: list[torch.Tensor] = []
        self._host: list[Any] = []
        self._all_reduce_sum = all_reduce_sum
        """In-place sum over ranks of the stacked per-rank loss shares (None on one process)."""

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor, host: Any = None) -> None:
        """Record step `step`'s (this rank's share of the) loss and the global grad norm; no read.

        `host`: anything already on the host that belongs to the step (handed back by `read`)."""
        self._steps.append(step)
        self._host.append(host)
        self._loss.append(loss.detach().reshape(()).float())
        self._norm.append(grad_norm.detach().reshape(()).float())

    def read(self) -> list[tuple[int, float, float, Any]]:
        """Every recorded step as (step, loss, grad_norm, host) in order; empties the window.

        The only host synchronisation: one `.tolist()` of a [2, k] tensor.
        """
        import torch

        if not self._steps:
            return []
        losses = torch.stack(self._loss)
        if self._all_reduce_sum is not None:
            self._all_reduce_sum(losses)
        both = torch.stack([losses, torch.stack(self._norm)]).tolist()
        out = list(zip(self._steps, both[0], both[1], self._host, strict=True))
        self._steps, self._loss, self._norm, self._host = [], [], [], []
        return out


def skip_if_nonfinite(optimizer: Any, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
    """Make the next `optimizer.step()` a no-op on the device if `loss` or `grad_norm` is not finite.

    Returns False (and arranges nothing) when the optimizer has no fused kernel: the caller then
    has to check on the host, as before.
    """
    import torch

    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
    if not inner.defaults.get("fused"):
        return False
    bad = ~(torch.isfinite(loss.detach()) & torch.isfinite(grad_norm.detach()))
    # Read by torch's fused AdamW: skip the update and undo its step count when 1.
    inner.found_inf = bad.reshape(()).to(torch.float32)
    return True
