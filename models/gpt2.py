"""GPT-2 (Radford et al. 2019): the stock transformers `GPT2LMHeadModel`, built from config."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from models._hf import HFCausalLM, eager_score_bytes

GPT2_16BIT_ELEMENT_SHARE = 0.93
"""GPT-2's blocks keep fewer fp32 tensors under autocast than the Llama family whose bytes per
element the planner uses (validation/plan/memory.py): fitted on the calibration table's fitting
rows (bench/RESULTS.md, "Plan calibration": GPT-2 XL under DDP in bf16 was 1.10 of the dry run
without it). Under FSDP's bf16 cast no share is needed: every saved tensor but the log-sum-exp is
16-bit, 2 B an element (measured per block)."""


def cast_16bit(element_bytes: float) -> bool:
    """Whether the plan's `element_bytes` is for FSDP's bf16/fp16 cast (validation/plan/memory.py,
    `ElementBytes`), under which a GPT-2 block keeps nothing in fp32 but its log-sum-exp."""
    return element_bytes < 4 and bool(getattr(element_bytes, "fsdp_cast", False))


class Config(HFCausalLM):
    """A GPT-2 decoder: LayerNorm, learned positions, fused qkv projection, GELU MLP, biases."""

    model_type: Literal["gpt2"] = "gpt2"
    """The architecture (this file: models/gpt2.py)."""
    intermediate_size: Annotated[int, Field(ge=8, le=1048576)] | None = None
    """MLP width (defaults to 4 x hidden)."""
    layer_norm_eps: Annotated[float, Field(gt=0.0, le=0.1)] = 1e-5
    """Epsilon of every LayerNorm (GPT-2's published 1e-5)."""

    hf_defaults: ClassVar[dict[str, Any]] = {"layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}

    # GPT-2's fused c_attn (q|k|v in one matrix) cannot be split column-wise per head without
    # reordering its rows: no tensor-parallel plan (FSDP shards it instead).


    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    def block_parameters(self) -> int:
        h, f = self.hidden_size, self.ffn_size
        per_layer = (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 4 * h
        return self.num_layers * per_layer

    def parameter_count(self) -> int:
        v, h = self.vocab_size, self.hidden_size
        total = v * h + self.max_position_embeddings * h + self.block_parameters() + 2 * h
        return total if self.tie_word_embeddings else total + v * h

    def matmul_parameters(self) -> int:
        h, f = self.hidden_size, self.ffn_size
        return self.num_layers * (4 * h * h + 2 * h * f) + self.vocab_size * h  # positions are a lookup

    def activation_bytes_per_layer(self, seq_len: int, micro_batch: int, element_bytes: float) -> float:
        """Saved tensors of one GPT-2 block, per token (fitted term by term to the tensors the HF
        forward saves, bench/bench_architectures.py): LayerNorms, the fused qkv output and its
        split, the attention output and c_proj input (8 x hidden), the MLP (c_fc output and the
        pieces of the tanh GELU: 5 x ffn), two statistics per head; `eager` keeps every score
        too (heads x seq_len per token, at `eager_score_bytes`: the fp32 softmax and its
        compute-dtype copy) and one statistic per head fewer. Under FSDP's bf16 cast
        (`element_bytes.fsdp_cast`, validation/plan/memory.py) GPT-2's eager softmax stays 16-bit:
        its scores and mask are bf16 and, unlike the Llama family's, it asks for no fp32 softmax, so
        each score keeps 2 B (measured per block, as bench/bench_architectures.py measures blocks;
        counted at 6 B, the held-out dry-run row gpt2-small-fsdp-eager-1024 was 1.43 of its peak)."""
        s, b, h, f = seq_len, micro_batch, self.hidden_size, self.ffn_size
        per_token = 8 * h + 5 * f + 2 * self.num_heads
        scores = 0.0
        if self.attn_implementation == "eager":
            per_token -= self.num_heads
            scores = self.num_heads * s * (2.0 if cast_16bit(element_bytes) else eager_score_bytes(element_bytes))
        if cast_16bit(element_bytes):
            element_bytes = 2.0  # FSDP's cast: all 16-bit (bench/bench_architectures.py: 2.001 B an element)
        elif element_bytes < 4:  # autocast: fewer fp32 upcasts than the Llama family the bytes are fitted on
            element_bytes *= GPT2_16BIT_ELEMENT_SHARE
        return (per_token * element_bytes + scores) * s * b

    def smoke_overrides(self, vocab_size: int, seq_len: int) -> dict[str, Any]:
        return super().smoke_overrides(vocab_size, seq_len) | {"intermediate_size": 128}

    def residual_projection(self, name: str) -> bool:
        return name.endswith("c_proj.weight")

    def param_role(self, name: str, param: Any) -> Any:
        if name.endswith("wpe.weight") or name.endswith("wte.weight"):
            return "embedding"
        return super().param_role(name, param)

    def hf_fields(self) -> dict[str, tuple[str, Any]]:
        return {
            "vocab_size": ("vocab_size", self.vocab_size), "n_embd": ("hidden_size", self.hidden_size),
            "n_layer": ("num_layers", self.num_layers), "n_head": ("num_heads", self.num_heads),
            "n_inner": ("intermediate_size", self.ffn_size), "n_positions": ("max_position_embeddings",
                                                                          self.max_position_embeddings),
            "layer_norm_epsilon": ("layer_norm_eps", self.layer_norm_eps),
            "tie_word_embeddings": ("tie_word_embeddings", self.tie_word_embeddings),
        }

    def normalize_hf_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """`n_inner: null` means 4 x n_embd."""
        out = dict(config)
        if out.get("n_inner") is None and isinstance(out.get("n_embd"), int):
            out["n_inner"] = 4 * out["n_embd"]
        return out

    def hf_config(self) -> Any:
        from transformers import GPT2Config

        kwargs = {key: value for key, (_, value) in self.hf_fields().items()}
        return GPT2Config(**kwargs, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
