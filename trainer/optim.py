"""The optimizer (a plug-in under models/optimizers/) and the learning-rate schedule (warmup,
then cosine / linear / constant decay)."""

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


def build_optimizer(model: Any, train: Any, arch: Any) -> Any:
    """The spec's optimizer (`train.optimizer`, a file under models/optimizers/) over the
    model's trainable parameters, each with the role the architecture gives it (hidden
    matrix, embedding, head, scalar): Muon orthogonalises the hidden matrices only."""
    named = [(name, p, arch.param_role(name, p)) for name, p in model.named_parameters() if p.requires_grad]
    return train.optimizer.build(named, train)


def implementation(optimizer: Any, train: Any) -> str:
    """Which optimizer kernel `optimizer` runs (for the run record)."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
    label: str = train.optimizer.implementation(inner)
    return label


def build_scheduler(optimizer: Any, train: Any, total_steps: int) -> Any:
    import torch

    def factor(step: int) -> float:
        return lr_factor(step, train.warmup_steps, total_steps, train.schedule, train.min_lr_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
