"""Llama-shaped decoders (RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP):
the shared half of models/llama.py, qwen2.py, mistral.py and llama_qknorm.py. A helper, not
a plug-in. Torch-free at import."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field, model_validator

from models import TPStyle
from models._hf import HFCausalLM


class LlamaFamily(HFCausalLM):
    num_kv_heads: Annotated[int, Field(ge=1, le=1024)] | None = None
    """Key/value heads for grouped-query attention (defaults to `num_heads`)."""
    intermediate_size: Annotated[int, Field(ge=8, le=1048576)] | None = None
    """MLP width (defaults to about 8/3 x hidden, a multiple of 64)."""

    tp_plan: ClassVar[dict[str, TPStyle]] = {
        "self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
        "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
        "self_attn.o_proj": "rowwise", "mlp.down_proj": "rowwise",
    }
    qkv_bias: ClassVar[bool] = False

    @model_validator(mode="after")
    def _kv_heads_divide_heads(self) -> LlamaFamily:
        kv = self.num_kv_heads or self.num_heads
        if self.num_heads % kv:
            raise ValueError(f"num_kv_heads ({kv}) must divide num_heads ({self.num_heads})")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def ffn_size(self) -> int:
        if self.intermediate_size:
            return self.intermediate_size
        return int(8 * self.hidden_size / 3 + 63) // 64 * 64

    # ------------------------------------------------------------------ counts

    def attention_matmul_parameters(self) -> int:
        h, hd = self.hidden_size, self.head_dim
        return h * self.num_heads * hd + 2 * h * self.kv_heads * hd + self.num_heads * hd * h

    def block_extra_parameters(self) -> int:
        """Non-matmul parameters of one block beyond its two norms (biases, extra norms)."""
        return self.kv_heads * self.head_dim * 2 + self.num_heads * self.head_dim if self.qkv_bias else 0

    def block_parameters(self) -> int:
        per_layer = self.attention_matmul_parameters() + 3 * self.hidden_size * self.ffn_size
        per_layer += 2 * self.hidden_size + self.block_extra_parameters()
        return self.num_layers * per_layer

    def parameter_count(self) -> int:
        v, h = self.vocab_size, self.hidden_size
        total = v * h + self.block_parameters() + h
        return total if self.tie_word_embeddings else total + v * h

    def matmul_parameters(self) -> int:
        per_layer = self.attention_matmul_parameters() + 3 * self.hidden_size * self.ffn_size
        return self.num_layers * per_layer + self.vocab_size * self.hidden_size  # the head (tied or not)

    def activation_bytes_per_layer(self, seq_len: int, micro_batch: int, element_bytes: float) -> float:
        """Saved tensors of one block, per token (fitted term by term to the tensors the HF Llama
        forward saves, bench/bench_architectures.py): the two RMSNorms and the residual stream
        (4 x hidden), q before and after rotary and as the attention kernel and o_proj see it
        (4 x q width), k and v (2 x kv width), the SwiGLU MLP (gate, silu(gate), up, product:
        4 x ffn), rotary cos and sin (2 x head_dim), one softmax statistic per head; plus the
        softmax output when `eager` keeps it (heads x seq_len)."""
        s, b, h, f = seq_len, micro_batch, self.hidden_size, self.ffn_size
        q, kv = self.num_heads * self.head_dim, self.kv_heads * self.head_dim
        per_token = 4 * h + 4 * q + 2 * kv + 4 * f + 2 * self.head_dim + self.num_heads
        if self.attn_implementation == "eager":
            per_token += self.num_heads * s
        return per_token * s * b * element_bytes

    def smoke_overrides(self, vocab_size: int, seq_len: int) -> dict[str, Any]:
        kv = 2 if (self.num_kv_heads and self.num_kv_heads < self.num_heads) else 4
        return super().smoke_overrides(vocab_size, seq_len) | {"num_kv_heads": kv, "intermediate_size": 128}

    # ------------------------------------------------------------------ transformers

    def llama_kwargs(self) -> dict[str, Any]:
        return {
            "vocab_size": self.vocab_size, "tie_word_embeddings": self.tie_word_embeddings, "use_cache": False,
            "hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.kv_heads,
            "intermediate_size": self.ffn_size, "max_position_embeddings": self.max_position_embeddings,
            "attention_dropout": 0.0,
        }
