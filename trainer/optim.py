"""AdamW and the learning-rate schedule (warmup, then cosine / linear / constant decay)."""

from __future__ import annotations

import math
from typing import Any


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based). Pure.

    Warmup ramps linearly to 1 over `warmup_steps`; the decay then goes from 1 to
    `min_lr_ratio` at `total_steps` (cosine or linear), or stays at 1 (constant).
    """
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, max(0.0, (step - warmup_steps) / span))
    if schedule == "linear":
        decay = 1.0 - progress
    else:
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * decay


def build_optimizer(model: Any, train: Any) -> Any:
    """AdamW with weight decay on matrices only (norms, biases and embeddings' 1-D params excluded).

    The fused kernel wherever torch has one for the parameters' device and dtype (CUDA, CPU,
    ...): one pass over each parameter instead of a chain of foreach ops that materialise
    temporaries. Measured on the bench model (bench/profile_trainer.py, 3.7M params, 2 cores):
    see "AdamW `step()`" in bench/RESULTS.md. It is deterministic, and it can skip a step on
    the device (`found_inf`) without reading the loss on the host.
    """
    import torch

    decay, no_decay = [], []
    for _, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": train.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    kwargs: dict[str, Any] = {"lr": train.lr, "betas": (train.beta1, train.beta2), "eps": 1e-8}
    try:
        return torch.optim.AdamW(groups, **kwargs, fused=True)
    except RuntimeError:  # a device or dtype without a fused kernel: torch's own default choice
        return torch.optim.AdamW(groups, **kwargs)


def implementation(optimizer: Any) -> str:
    """`fused`, `foreach` or `for-loop`: which AdamW kernel `optimizer` runs (for the run record)."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
    defaults = inner.defaults
    if defaults.get("fused"):
        return "fused"
    return "foreach" if defaults.get("foreach") else "for-loop"


def build_scheduler(optimizer: Any, train: Any, total_steps: int) -> Any:
    import torch

    def factor(step: int) -> float:
        return lr_factor(step, train.warmup_steps, total_steps, train.schedule, train.min_lr_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
