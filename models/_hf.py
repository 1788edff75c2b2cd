"""Shared half of the architectures built with transformers (llama, qwen2, mistral, gpt2 and
their variants): build from a transformers config, blocks, HF's initialisation rules, export.

A helper, not a plug-in (its name starts with `_`). Torch-free at import: transformers is
imported inside the methods.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from models import Architecture, ExportNote

if TYPE_CHECKING:
    import torch

# Bytes each saved element takes at `element_bytes` = 4 (fp32) are that; bf16/fp16 activations
# take 2, and the softmax statistics and norms' fp32 upcasts stay 4 (counted in the formulas).


class HFCausalLM(Architecture):
    """A causal LM built by `AutoModelForCausalLM.from_config(self.hf_config())`."""

    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    """Attention kernel; both honour document boundaries in packed rows."""

    # ------------------------------------------------------------------ what a subclass gives

    def hf_config(self) -> Any:
        """The transformers config (dropout zero everywhere, no KV cache)."""
        raise NotImplementedError

    def register(self) -> None:
        """Register custom transformers classes (variants of a stock architecture); stock
        architectures need nothing."""

    # ------------------------------------------------------------------ torch half

    def build(self) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        self.register()
        cfg = self.hf_config()
        cfg._attn_implementation = self.attn_implementation
        model: Any = AutoModelForCausalLM.from_config(cfg, attn_implementation=self.attn_implementation)
        model.config.use_cache = False
        built: torch.nn.Module = model
        return built

    def base(self, model: torch.nn.Module) -> Any:
        return getattr(model, "model", None) or model.transformer  # type: ignore[union-attr]

    def blocks(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        base = self.base(model)
        return list(getattr(base, "layers", None) or base.h)

    def input_embeddings(self, model: torch.nn.Module) -> torch.nn.Module:
        emb: torch.nn.Module = model.get_input_embeddings()  # type: ignore[operator]
        return emb

    def output_modules(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        base = self.base(model)
        norm = getattr(base, "norm", None) or getattr(base, "ln_f", None)
        return [m for m in (norm, model.get_output_embeddings()) if m is not None]  # type: ignore[operator]

    def enable_activation_checkpointing(self, model: torch.nn.Module) -> None:
        model.activation_checkpointing_enable({"use_reentrant": False})  # type: ignore[operator]

    def residual_projection(self, name: str) -> bool:
        """Parameters initialised with std / sqrt(2 x layers) (GPT-2's scaled residuals)."""
        return False

    def init_parameter(self, model: torch.nn.Module, name: str, shape: Any, gen: torch.Generator) -> torch.Tensor:
        """HF's `_init_weights` rules, one tensor: ones for norm weights, zeros for biases,
        normal(0, initializer_range) for matrices (a padding row zeroed)."""
        import torch

        module = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        leaf = name.rsplit(".", 1)[-1]
        kind = type(module).__name__
        config: Any = getattr(model, "config", None)
        std = float(getattr(config, "initializer_range", 0.02) or 0.02)
        if "Norm" in kind or kind.startswith("LayerNorm"):
            return torch.ones(shape) if leaf == "weight" else torch.zeros(shape)
        if leaf == "bias":
            return torch.zeros(shape)
        if self.residual_projection(name):
            std /= math.sqrt(2 * self.num_layers)
        out = torch.empty(shape).normal_(0.0, std, generator=gen)
        pad = getattr(module, "padding_idx", None)
        if kind == "Embedding" and pad is not None:
            out[pad] = 0.0
        return out

    def export_note(self) -> ExportNote:
        return ExportNote(loadable=True, how=f"transformers AutoModelForCausalLM.from_pretrained(dir) "
                                             f"(model_type {self.hf_model_type()})")

    def hf_model_type(self) -> str:
        return self.model_type

    def export(self, model: torch.nn.Module, out_dir: Path) -> ExportNote:
        config: Any = model.config
        config.save_pretrained(out_dir)
        return self.export_note()
