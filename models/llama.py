"""Llama (Touvron et al. 2023): the stock transformers `LlamaForCausalLM`, built from config."""

from __future__ import annotations

from typing import Any, Literal

from models._llama_family import LlamaBiases


class Config(LlamaBiases):
    """A Llama decoder: RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP."""

    model_type: Literal["llama"] = "llama"
    """The architecture (this file: models/llama.py)."""

    def hf_config(self) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(**self.llama_kwargs())
