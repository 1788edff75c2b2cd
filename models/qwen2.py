"""Qwen2: the stock transformers `Qwen2ForCausalLM` (biases on q/k/v), built from config."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from models._llama_family import LlamaFamily


class Config(LlamaFamily):
    """A Qwen2 decoder: a Llama with biases on the query, key and value projections."""

    model_type: Literal["qwen2"] = "qwen2"
    """The architecture (this file: models/qwen2.py)."""

    qkv_bias: ClassVar[bool] = True

    def hf_config(self) -> Any:
        from transformers import Qwen2Config

        return Qwen2Config(**self.llama_kwargs())
