"""Parameter grouping shared by the optimizer plug-ins (a helper, not a plug-in)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def decay_groups(named_params: Sequence[tuple[str, Any, str]], weight_decay: float) -> list[dict[str, Any]]:
    """AdamW's groups as the trainer always made them: weight decay on tensors of 2+ dimensions
    (matrices and embeddings), none on 1-D ones (norm weights, biases)."""
    decay = [p for _, p, _ in named_params if p.dim() >= 2]
    no_decay = [p for _, p, _ in named_params if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
