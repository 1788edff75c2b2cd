"""The network, built from the spec's `model` section with transformers (never downloaded).

FLOPs per token and the device peak (for MFU) are resolved facts: `validation.flops` holds
the one table and the one formula, and `spec.resolved.json` carries their values.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from validation.flops import flops_per_token  # re-exported: one formula, in validation.flops

__all__ = ["bits_per_byte", "build_model", "flops_per_token", "hf_config", "load_weights", "parameter_count"]


def hf_config(model_spec: Any, seq_len: int | None = None) -> Any:
    """A transformers config for `model_spec` (a `validation.spec.ModelSpec`).

    Dropout is zero everywhere: packing + deterministic resume need a model whose forward
    pass depends on the weights and the batch only.
    """
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    m = model_spec
    common: dict[str, Any] = {
        "vocab_size": m.vocab_size,
        "tie_word_embeddings": m.tie_word_embeddings,
        "use_cache": False,
    }
    if m.model_type == "gpt2":
        cfg = GPT2Config(
            n_embd=m.hidden_size,
            n_layer=m.num_layers,
            n_head=m.num_heads,
            n_inner=m.ffn_size,
            n_positions=m.max_position_embeddings,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
    else:
        cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}[m.model_type]
        extra: dict[str, Any] = {}
        if m.model_type == "mistral":
            extra["sliding_window"] = None
        cfg = cls(
            hidden_size=m.hidden_size,
            num_hidden_layers=m.num_layers,
            num_attention_heads=m.num_heads,
            num_key_value_heads=m.num_kv_heads or m.num_heads,
            intermediate_size=m.ffn_size,
            max_position_embeddings=m.max_position_embeddings,
            attention_dropout=0.0,
            **extra,
            **common,
        )
    cfg._attn_implementation = m.attn_implementation
    return cfg


def build_model(model_spec: Any, init_from: Path | None = None) -> Any:
    """A randomly initialised causal LM (seeded by the caller), or weights from `init_from`."""
    from transformers import AutoModelForCausalLM

    cfg = hf_config(model_spec)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=model_spec.attn_implementation)
    if init_from is not None:
        load_weights(model, init_from)
    model.config.use_cache = False
    return model


def load_weights(model: Any, directory: Path) -> None:
    """Load `model.safetensors` from a checkpoint or export directory (strict)."""
    from safetensors.torch import load_file

    path = Path(directory) / "model.safetensors"
    state = load_file(str(path))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied output weights are legitimately absent from the file.
    missing = [k for k in missing if not (model.config.tie_word_embeddings and k.endswith("lm_head.weight"))]
    if missing or unexpected:
        raise ValueError(f"{path}: missing {missing[:5]}, unexpected {unexpected[:5]}")


def parameter_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def bits_per_byte(loss_nats: float, bytes_per_token: float) -> float:
    """Loss per token in nats -> bits per byte of text (tokenizer-independent)."""
    if not bytes_per_token or not math.isfinite(loss_nats):
        return float("nan")
    return loss_nats / bytes_per_token / math.log(2)
