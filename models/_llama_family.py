"""Llama-shaped decoders (RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP):
the shared half of models/llama.py, qwen2.py, mistral.py and llama_qknorm.py. A helper, not
a plug-in. Torch-free at import.

The fields a published Hugging Face configuration sets (rope theta and scaling, norm eps,
biases, ...) are typed fields here, passed to the transformers config the file builds; their
defaults are transformers' own class defaults, which every model built before they existed used."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from models import PluginSection, TPStyle
from models._hf import HFCausalLM, eager_score_bytes


class RopeScaling(PluginSection):
    """Rotary-position scaling as a published config.json writes it (`rope_scaling`): Llama-3.1's
    `{rope_type: llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0,
    original_max_position_embeddings: 8192}`, or linear / dynamic / yarn with a `factor`."""

    rope_type: Literal["linear", "dynamic", "yarn", "llama3"]
    """The scaling rule (transformers' `ROPE_INIT_FUNCTIONS`)."""
    factor: Annotated[float, Field(gt=0.0, le=1024.0)]
    """Context extension factor."""
    low_freq_factor: Annotated[float, Field(gt=0.0, le=1024.0)] | None = None
    """`llama3`: wavelengths above original_max_position_embeddings / low_freq_factor are scaled by `factor`."""
    high_freq_factor: Annotated[float, Field(gt=0.0, le=1024.0)] | None = None
    """`llama3`: wavelengths below original_max_position_embeddings / high_freq_factor are kept."""
    original_max_position_embeddings: Annotated[int, Field(ge=16, le=1048576)] | None = None
    """The context length the model was pre-trained with (`llama3` needs it; `yarn`, `dynamic` use it)."""

    @model_validator(mode="after")
    def _llama3_is_complete(self) -> RopeScaling:
        if self.rope_type == "llama3":
            missing = [k for k in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
                       if getattr(self, k) is None]
            if missing:
                raise ValueError(f"rope_type llama3 needs {', '.join(missing)}")
            if self.low_freq_factor >= self.high_freq_factor:  # type: ignore[operator]
                raise ValueError("low_freq_factor must be below high_freq_factor")
        return self

    def parameters(self) -> dict[str, Any]:
        """The keys transformers reads (unset ones left out)."""
        return self.model_dump(exclude_none=True)


class LlamaFamily(HFCausalLM):
    num_kv_heads: Annotated[int, Field(ge=1, le=1024)] | None = None
    """Key/value heads for grouped-query attention (defaults to `num_heads`)."""
    intermediate_size: Annotated[int, Field(ge=8, le=1048576)] | None = None
    """MLP width (defaults to about 8/3 x hidden, a multiple of 64)."""
    rope_theta: Annotated[float, Field(gt=0.0, le=1e12)] = 10000.0
    """Rotary base (Llama-2, Mistral 10,000; Llama-3 500,000; Qwen2 1,000,000)."""
    rope_scaling: RopeScaling | None = None
    """Rotary-position scaling (Llama-3.1: rope_type llama3); none by default."""
    rms_norm_eps: Annotated[float, Field(gt=0.0, le=0.1)] = 1e-6
    """Epsilon of every RMSNorm (transformers' default 1e-6; Llama-2, Llama-3 and Mistral publish 1e-5)."""

    tp_plan: ClassVar[dict[str, TPStyle]] = {
        "self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
        "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
        "self_attn.o_proj": "rowwise", "mlp.down_proj": "rowwise",
    }
    qkv_bias: ClassVar[bool] = False
    hf_defaults: ClassVar[dict[str, Any]] = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
                                             "tie_word_embeddings": False}

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
        """Saved tensors of one block, per token (the HF Llama forward's, listed by
        bench/bench_architectures.py): each RMSNorm's input, normalised and weighted output
        (2 x 3 x hidden, = 4 x hidden + 2 x q width since q width is hidden here), q after rotary
        and the attention output (2 x q width, the output projection reads the kernel's output),
        k and v (2 x kv width: grouped-query heads stay unrepeated, models/_attention.py), the
        SwiGLU MLP (gate, up, silu(gate), product: 4 x ffn), rotary cos and sin (2 x head_dim) and
        the kernel's log-sum-exp (one per head). No document mask: packed documents reach the
        kernel in O(seq_len). `eager` keeps instead every score (heads x seq_len per token) at
        `eager_score_bytes` (the fp32 softmax and its compute-dtype copy) and k, v repeated to
        every head (2 x (q - kv) width more), without the log-sum-exp."""
        s, b, h, f = seq_len, micro_batch, self.hidden_size, self.ffn_size
        q, kv = self.num_heads * self.head_dim, self.kv_heads * self.head_dim
        per_token = 4 * h + 4 * q + 2 * kv + 4 * f + 2 * self.head_dim + self.num_heads
        scores = 0.0
        if self.attn_implementation == "eager":
            per_token += 2 * (q - kv) - self.num_heads
            scores = self.num_heads * s * eager_score_bytes(element_bytes)
        return (per_token * element_bytes + scores) * s * b

    def smoke_overrides(self, vocab_size: int, seq_len: int) -> dict[str, Any]:
        kv = 2 if (self.num_kv_heads and self.num_kv_heads < self.num_heads) else 4
        return super().smoke_overrides(vocab_size, seq_len) | {"num_kv_heads": kv, "intermediate_size": 128}

    # ------------------------------------------------------------------ transformers

    def hf_fields(self) -> dict[str, tuple[str, Any]]:
        return {
            "vocab_size": ("vocab_size", self.vocab_size), "hidden_size": ("hidden_size", self.hidden_size),
            "num_hidden_layers": ("num_layers", self.num_layers), "num_attention_heads": ("num_heads", self.num_heads),
            "num_key_value_heads": ("num_kv_heads", self.kv_heads), "intermediate_size": ("intermediate_size", self.ffn_size),
            "max_position_embeddings": ("max_position_embeddings", self.max_position_embeddings),
            "tie_word_embeddings": ("tie_word_embeddings", self.tie_word_embeddings),
            "rms_norm_eps": ("rms_norm_eps", self.rms_norm_eps), "rope_theta": ("rope_theta", self.rope_theta),
            "rope_scaling": ("rope_scaling", self.rope_scaling.parameters() if self.rope_scaling else None),
        }

    def normalize_hf_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """transformers 5 writes `rope_parameters`; earlier configs `rope_theta` + `rope_scaling`
        (with `type` for `rope_type`). A missing `num_key_value_heads` means `num_attention_heads`,
        a missing `head_dim` hidden_size / num_attention_heads."""
        out = dict(config)
        rope = out.pop("rope_parameters", None)
        if isinstance(rope, dict):
            rope = dict(rope)
            out["rope_theta"] = rope.pop("rope_theta", out.get("rope_theta", self.hf_defaults["rope_theta"]))
            out["rope_scaling"] = rope
        scaling = out.get("rope_scaling")
        if isinstance(scaling, dict):
            scaling = dict(scaling)
            kind = scaling.pop("rope_type", scaling.pop("type", "default"))
            out["rope_scaling"] = None if kind == "default" else {"rope_type": kind, **scaling}
        if out.get("num_key_value_heads") is None and "num_attention_heads" in out:
            out["num_key_value_heads"] = out["num_attention_heads"]
        return out

    def checkpoint_problems(self, config: dict[str, Any]) -> list[tuple[str, str]]:
        problems = super().checkpoint_problems(config)
        head_dim, heads, hidden = config.get("head_dim"), config.get("num_attention_heads"), config.get("hidden_size")
        if head_dim is not None and heads and hidden and head_dim * heads != hidden:
            problems.append(("num_heads", f"config.json has head_dim {head_dim} x {heads} heads != hidden_size "
                                          f"{hidden}; this architecture's head_dim is hidden_size / num_heads"))
        return problems

    def llama_kwargs(self) -> dict[str, Any]:
        """The transformers config's keyword arguments (transformers 5 names the rotary settings
        `rope_parameters`)."""
        kwargs = {key: value for key, (_, value) in self.hf_fields().items()}
        rope = {"rope_type": "default", "rope_theta": kwargs.pop("rope_theta")} | (kwargs.pop("rope_scaling") or {})
        return kwargs | {"rope_parameters": rope, "use_cache": False, "attention_dropout": 0.0}


class LlamaBiases(LlamaFamily):
    """A Llama-shaped decoder whose transformers class takes `attention_bias` and `mlp_bias`
    (llama, llama_qknorm)."""

    attention_bias: bool = False
    """Biases on the q, k, v and o projections."""
    mlp_bias: bool = False
    """Biases on the gate, up and down projections."""

    hf_defaults: ClassVar[dict[str, Any]] = LlamaFamily.hf_defaults | {"attention_bias": False, "mlp_bias": False}

    def block_extra_parameters(self) -> int:
        extra = super().block_extra_parameters()
        if self.attention_bias:
            extra += (self.num_heads + 2 * self.kv_heads) * self.head_dim + self.hidden_size
        if self.mlp_bias:
            extra += 2 * self.ffn_size + self.hidden_size
        return extra

    def hf_fields(self) -> dict[str, tuple[str, Any]]:
        return super().hf_fields() | {"attention_bias": ("attention_bias", self.attention_bias),
                                      "mlp_bias": ("mlp_bias", self.mlp_bias)}
