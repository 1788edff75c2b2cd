"""Shared half of the architectures built with transformers (llama, qwen2, mistral, gpt2 and
their variants): build from a transformers config, blocks, HF's initialisation rules, export,
and a Hugging Face checkpoint's config.json compared with the spec (`init_from_problems`).

A helper, not a plug-in (its name starts with `_`). Torch-free at import: transformers is
imported inside the methods.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from models import Architecture, ExportNote

if TYPE_CHECKING:
    import torch

# Bytes each saved element takes at `element_bytes` = 4 (fp32) are that; bf16/fp16 activations
# take 2, and the softmax statistics and norms' fp32 upcasts stay 4 (counted in the formulas).

EAGER_SCORE_BYTES = {"16-bit": 6.0, "fp32": 4.0}
"""Bytes `attn_implementation: eager` keeps per attention score for the backward pass: the softmax,
which transformers computes in fp32 (4 B), and, under bf16/fp16, its copy in the compute dtype that
the value matmul saves (2 B). Counted at these bytes, not at the fitted `element_bytes`: a dry run of
Llama-3.2-1B at seq 2048 was 0.549 of the tracked peak when the scores were counted at 2.25 B."""


def eager_score_bytes(element_bytes: float) -> float:
    """`EAGER_SCORE_BYTES` for a plan's bytes per saved element (4 only in fp32)."""
    return EAGER_SCORE_BYTES["fp32" if element_bytes >= 4 else "16-bit"]


class HFCausalLM(Architecture):
    """A causal LM built by `AutoModelForCausalLM.from_config(self.hf_config())`."""

    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    """Attention kernel; both honour document boundaries in packed rows. `sdpa`: fused attention
    inside each document (flash over variable-length documents on a GPU, models/_attention.py),
    O(seq_len) kept per block; `eager`: transformers' matmul-softmax-matmul, which keeps the
    softmax of every score (fp32) and its compute-dtype copy, seq_len^2 per head."""

    # ------------------------------------------------------------------ what a subclass gives

    def hf_config(self) -> Any:
        """The transformers config (dropout zero everywhere, no KV cache)."""
        raise NotImplementedError

    def register(self) -> None:
        """Register custom transformers classes (variants of a stock architecture); stock
        architectures need nothing."""

    # ------------------------------------------------------------------ a checkpoint's config.json (torch-free)

    hf_defaults: ClassVar[dict[str, Any]] = {}
    """What a config.json means when it omits a key (the transformers class default)."""

    def hf_fields(self) -> dict[str, tuple[str, Any]]:
        """transformers config key -> (this spec's field, value) for every key the spec decides:
        what `hf_config()` passes, and what `checkpoint_problems` compares with a config.json."""
        return {}

    def normalize_hf_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """A config.json in the form `hf_fields` uses (older and newer spellings, derived defaults)."""
        return dict(config)

    def init_from_problems(self, directory: Path) -> list[tuple[str, str]]:
        """`checkpoint_problems` of the directory's config.json (plain JSON, no torch); nothing to
        say when it has none (a checkpoint written later, or by another tool)."""
        path = Path(directory) / "config.json"
        if not path.is_file():
            return []
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return [("init_from", f"{path.name} is not readable JSON: {str(exc).splitlines()[0]}")]
        if not isinstance(config, dict):
            return [("init_from", f"{path.name} is not a JSON object")]
        return self.checkpoint_problems(config)

    def checkpoint_problems(self, config: dict[str, Any]) -> list[tuple[str, str]]:
        """(field, why) for each way a Hugging Face checkpoint's config.json (parsed JSON)
        describes another model than this spec builds; empty when they agree."""
        if config.get("model_type") != self.hf_model_type():
            return [("model_type", f"config.json has model_type {json.dumps(config.get('model_type'))}, this spec "
                                   f"builds {json.dumps(self.hf_model_type())}")]
        config = self.normalize_hf_config(config)
        problems = []
        for key, (field, value) in self.hf_fields().items():
            theirs = config.get(key, self.hf_defaults.get(key, value))
            if theirs != value:
                problems.append((field, f"config.json has {key} {json.dumps(theirs)}, this spec builds "
                                        f"{json.dumps(value)}: set model.{field} to match"))
        return problems

    # ------------------------------------------------------------------ torch half

    def build(self) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        self.register()
        cfg = self.hf_config()
        implementation: str = self.attn_implementation
        if implementation == "sdpa":  # packed documents reach the blocks in O(s), not as an s x s mask each
            from models._attention import transformers_implementation

            implementation = transformers_implementation()
        cfg._attn_implementation = implementation
        model: Any = AutoModelForCausalLM.from_config(cfg, attn_implementation=implementation)
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
        # transformers renamed it; the GPU runners' 5.17 has only the old name (bench/gpu_check.py found it).
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable({"use_reentrant": False})  # type: ignore[operator]

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
                                             f"(model_type {self.hf_model_type()}) and AutoTokenizer; "
                                             "lm-eval HFLM(pretrained=dir)")

    def hf_model_type(self) -> str:
        return self.model_type

    def export(self, model: torch.nn.Module, out_dir: Path) -> ExportNote:
        """config.json and generation_config.json, with the special-token ids of the tokenizer
        files already in `out_dir` (models/_export.py), not the transformers class defaults.
        config.json says `use_cache: false`: with a cache, transformers ignores the documents that
        `position_ids` separate in a packed row (logits 0.3-0.7 off on the contract's tiny models); the
        generation config keeps its own default (`use_cache: true`), so `generate()` still caches."""
        import copy

        from transformers import GenerationConfig

        from models._export import special_token_ids

        config: Any = copy.deepcopy(model.config)
        ids = special_token_ids(out_dir)
        for key, value in ids.items():
            setattr(config, key, value)
        config.use_cache = False
        config.save_pretrained(out_dir)
        GenerationConfig(**ids).save_pretrained(out_dir)
        return self.export_note()
