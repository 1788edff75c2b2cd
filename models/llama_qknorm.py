"""Llama with QK-norm and an optional gate on the attention output: a transformers Llama
subclass, written only through the public contract of `models` (docs/architectures.md).

- QK-norm (Dehghani et al. 2023; OLMo 2, Qwen3): RMSNorm over each head's queries and keys
  before the rotary embedding, which keeps attention logits bounded at high learning rates.
- Gated attention (Qiu et al. 2025, position G1): the attention output is multiplied
  element-wise by sigmoid(x W_g), one gate per head channel, before the output projection.

The exported directory says `model_type: llama_qknorm`: plain transformers refuses it
("unrecognized model type") instead of silently loading a Llama without the norms and the
gate; `models.load_exported(dir)` (or `transformers_classes()` then
`AutoModelForCausalLM.from_pretrained(dir)`) loads it with the same logits.
"""

from __future__ import annotations

from functools import cache
from typing import Any, ClassVar, Literal

from models import ExportNote, TPStyle
from models._llama_family import LlamaBiases, LlamaFamily


class Config(LlamaBiases):
    """A Llama decoder with RMSNorm on queries and keys, and optionally a gated attention output."""

    model_type: Literal["llama_qknorm"] = "llama_qknorm"
    """The architecture (this file: models/llama_qknorm.py)."""
    qk_norm: bool = True
    """RMSNorm (learned scale of head_dim) on each head's queries and keys."""
    attn_gate: bool = False
    """Multiply the attention output by sigmoid(x W_g) before the output projection (W_g: hidden x hidden)."""

    tp_plan: ClassVar[dict[str, TPStyle]] = LlamaFamily.tp_plan | {
        "self_attn.gate_proj": "colwise",  # its output meets the attention output, split by head
        "self_attn.q_norm": "replicate", "self_attn.k_norm": "replicate",  # whole weight, heads split
    }

    def tensor_parallel_plan(self) -> dict[str, TPStyle]:
        plan = dict(self.tp_plan)
        if not self.attn_gate:
            plan.pop("self_attn.gate_proj")
        if not self.qk_norm:
            plan.pop("self_attn.q_norm"), plan.pop("self_attn.k_norm")
        return plan

    def attention_matmul_parameters(self) -> int:
        gate = self.hidden_size * self.num_heads * self.head_dim if self.attn_gate else 0
        return super().attention_matmul_parameters() + gate

    def block_extra_parameters(self) -> int:
        return super().block_extra_parameters() + (2 * self.head_dim if self.qk_norm else 0)

    def activation_bytes_per_layer(self, seq_len: int, micro_batch: int, element_bytes: float) -> float:
        """The Llama block's, plus each QK-norm's input and output (2 x q width, 2 x kv width) and
        its per-head statistic, plus the gate's sigmoid and the gated product's other input
        (2 x q width); measured in bench/bench_architectures.py."""
        q, kv = self.num_heads * self.head_dim, self.kv_heads * self.head_dim
        per_token = (2 * q + 2 * kv + self.num_heads + self.kv_heads if self.qk_norm else 0)
        per_token += 2 * q if self.attn_gate else 0
        extra = per_token * seq_len * micro_batch * element_bytes
        return super().activation_bytes_per_layer(seq_len, micro_batch, element_bytes) + extra

    def hf_fields(self) -> dict[str, tuple[str, Any]]:
        return super().hf_fields() | {"qk_norm": ("qk_norm", self.qk_norm), "attn_gate": ("attn_gate", self.attn_gate)}

    def hf_config(self) -> Any:
        config_class, _ = transformers_classes()
        return config_class(**self.llama_kwargs())

    def register(self) -> None:
        transformers_classes()

    def export_note(self) -> ExportNote:
        return ExportNote(loadable=True, how="models.load_exported(dir) (or models.llama_qknorm.transformers_classes(), "
                                             "then AutoModelForCausalLM.from_pretrained(dir)); plain transformers "
                                             "refuses model_type llama_qknorm")


@cache
def transformers_classes() -> tuple[Any, Any]:
    """The transformers config and model classes, registered with the Auto classes once."""
    import torch
    from torch import nn
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import (
        LlamaAttention,
        LlamaRMSNorm,
        apply_rotary_pos_emb,
        eager_attention_forward,
    )

    class LlamaQKNormConfig(LlamaConfig):  # type: ignore[misc]
        model_type = "llama_qknorm"

        def __init__(self, qk_norm: bool = True, attn_gate: bool = False, **kwargs: Any):
            self.qk_norm = qk_norm
            self.attn_gate = attn_gate
            super().__init__(**kwargs)

    class QKNormAttention(LlamaAttention):  # type: ignore[misc]
        def __init__(self, config: Any, layer_idx: int):
            super().__init__(config, layer_idx)
            if config.qk_norm:
                self.q_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
                self.k_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
            if config.attn_gate:
                self.gate_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=False)

        def forward(self, hidden_states: torch.Tensor, position_embeddings: Any = None, attention_mask: Any = None,
                    cache: Any = None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
            input_shape = hidden_states.shape[:-1]
            hidden_shape = (*input_shape, -1, self.head_dim)
            q = self.q_proj(hidden_states).view(hidden_shape)
            k = self.k_proj(hidden_states).view(hidden_shape)
            if self.config.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            cos, sin = position_embeddings
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
            out, weights = attention(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)
            out = out.reshape(*input_shape, -1).contiguous()
            if self.config.attn_gate:
                out = out * torch.sigmoid(self.gate_proj(hidden_states))
            return self.o_proj(out), weights

    class LlamaQKNormForCausalLM(LlamaForCausalLM):  # type: ignore[misc]
        config_class = LlamaQKNormConfig

        def __init__(self, config: Any):
            super().__init__(config)
            for index, layer in enumerate(self.model.layers):
                layer.self_attn = QKNormAttention(config, index)
            self.post_init()

    AutoConfig.register("llama_qknorm", LlamaQKNormConfig, exist_ok=True)
    AutoModelForCausalLM.register(LlamaQKNormConfig, LlamaQKNormForCausalLM, exist_ok=True)
    return LlamaQKNormConfig, LlamaQKNormForCausalLM
