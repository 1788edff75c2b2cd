"""Mistral: the stock transformers `MistralForCausalLM`, built from config."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from models._llama_family import LlamaFamily


class Config(LlamaFamily):
    """A Mistral decoder: a Llama with its own transformers class and an optional sliding window."""

    model_type: Literal["mistral"] = "mistral"
    """The architecture (this file: models/mistral.py)."""
    sliding_window: Annotated[int, Field(ge=1, le=1048576)] | None = None
    """Each token attends to at most this many preceding positions (Mistral-7B-v0.1: 4096);
    none: full causal attention (later Mistral releases)."""

    hf_defaults: ClassVar[dict[str, Any]] = LlamaFamily.hf_defaults | {"sliding_window": 4096}

    def hf_fields(self) -> dict[str, tuple[str, Any]]:
        return super().hf_fields() | {"sliding_window": ("sliding_window", self.sliding_window)}

    def hf_config(self) -> Any:
        from transformers import MistralConfig

        return MistralConfig(**self.llama_kwargs())
