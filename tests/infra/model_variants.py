"""Tiny configurations of every shipped architecture, and the variants whose switches change the
parameter count or the FLOPs (tests/*/test_models_contract.py)."""

from __future__ import annotations

from typing import Any

import models


def tiny(model_type: str, **extra: Any) -> Any:
    """A tiny config of `model_type`: its own smoke shrink (hidden 64, 2 layers, 4 heads)."""
    config = models.architectures()[model_type]
    probe = config.model_validate({"model_type": model_type, "hidden_size": 64, "num_layers": 2, "num_heads": 4,
                                   "vocab_size": 256})
    fields = {"model_type": model_type, **probe.smoke_overrides(256, 32), **extra}
    return config.model_validate(fields)


def variants(model_type: str) -> list[Any]:
    """Tiny configs covering the switches that change the parameter count or the FLOPs."""
    out = [tiny(model_type), tiny(model_type, tie_word_embeddings=False)]
    fields = models.architectures()[model_type].model_fields
    if "attn_implementation" in fields:
        out.append(tiny(model_type, attn_implementation="eager"))
    for switch in ("attn_gate", "bias", "attention_bias", "mlp_bias"):
        if switch in fields:
            out.append(tiny(model_type, **{switch: not fields[switch].default}))
    if "qk_norm" in fields:
        out.append(tiny(model_type, qk_norm=False, attn_gate=True))
    return out
