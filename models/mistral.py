"""Mistral: the stock transformers `MistralForCausalLM` (no sliding window), built from config."""

from __future__ import annotations

from typing import Any, Literal

from models._llama_family import LlamaFamily


class Config(LlamaFamily):
    """A Mistral decoder (a Llama with its own transformers class; full attention here)."""

    model_type: Literal["mistral"] = "mistral"
    """The architecture (this file: models/mistral.py)."""

    def hf_config(self) -> Any:
        from transformers import MistralConfig

        return MistralConfig(**self.llama_kwargs(), sliding_window=None)
