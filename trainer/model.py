"""The network: whatever the spec's architecture file builds (models/<model_type>.py).

FLOPs per token and the device peak (for MFU) are resolved facts: the architecture declares
the FLOPs, `validation.flops` holds the device table, and `spec.resolved.json` carries both.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from models import load_exported, load_weights  # noqa: F401 - one loader, in models/
from validation.flops import flops_per_token  # re-exported: one formula, declared by the architecture

__all__ = ["bits_per_byte", "build_model", "flops_per_token", "load_exported", "load_weights", "parameter_count"]


def build_model(model_spec: Any, init_from: Path | None = None) -> Any:
    """A freshly initialised model of `model_spec` (an architecture's Config), on the CPU, with
    the architecture's own default initialisation (seeded by the caller); the trainer's sharded
    build (trainer.parallel.build_model) is the one every layout shares."""
    model = model_spec.build()
    if init_from is not None:
        load_weights(model, init_from, model_spec)
    return model


def parameter_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def bits_per_byte(loss_nats: float, bytes_per_token: float) -> float:
    """Loss per token in nats -> bits per byte of text (tokenizer-independent)."""
    if not bytes_per_token or not math.isfinite(loss_nats):
        return float("nan")
    return loss_nats / bytes_per_token / math.log(2)
