"""Qwen2: the stock transformers `Qwen2ForCausalLM` (biases on q/k/v), built from config."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from models._llama_family import LlamaFamily


class Config(LlamaFamily):
    """A Qwen2 decoder: a Llama with biases on the query, key and value projections (full
    attention in every layer: the published Qwen2 models do not use their sliding window)."""

    model_type: Literal["qwen2"] = "qwen2"
    """The architecture (this file: models/qwen2.py)."""

    qkv_bias: ClassVar[bool] = True

    def checkpoint_problems(self, config: dict[str, Any]) -> list[tuple[str, str]]:
        problems = super().checkpoint_problems(config)
        if config.get("use_sliding_window"):
            problems.append(("model_type", "config.json has use_sliding_window true; models/qwen2.py builds full "
                                           "attention in every layer"))
        return problems

    def hf_config(self) -> Any:
        from transformers import Qwen2Config

        return Qwen2Config(**self.llama_kwargs())
