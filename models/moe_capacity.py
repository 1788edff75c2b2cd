"""A capacity-limited mixture of experts (Switch Transformer / GShard style) in plain PyTorch.

Written only through the public contract of `models` (docs/architectures.md, "Mixture of
experts"). The blocks are `models/moe.py`'s (RMSNorm, causal self-attention with rotary
positions limited to the document, RMSNorm, a router to `top_k` of `num_experts` SwiGLU
experts), but each expert has a **capacity**: it takes at most

    capacity = min(ceil(capacity_factor x seq_len x top_k / num_experts), seq_len)

(token, choice) pairs of each row, first come first served in the row's order, and the pairs
over it are **dropped** (their share of the output is zero; the residual carries the token on).
Every expert then runs on a fixed-size slot buffer (zeros where no token came), so the shapes
do not depend on the data: torch's FLOP counter counts it on fake tensors, and the declared
FLOPs are exact (`flops_per_token`: num_experts x capacity slots per row, whatever the routing).

Capacity makes a token's output depend on the other tokens of its row: whether its expert is
full depends on how many earlier tokens chose it, those of earlier documents packed into the
same row included. That is the architecture, not a leak, so the file declares it
(`batch_dependence`, read by `pipeline contract`), with the configuration under which routing
no longer depends on the other tokens (`batch_independent_fields`: a capacity factor that fits
every token, so nothing is dropped). The contract then checks packed rows against documents
alone under that configuration, and causality (a token's logits never depend on later tokens:
the queue is filled in the row's order) under this one. Capacity counts per row: the routing of
one row never depends on another row of the micro-batch.

What the framework reads beyond a dense model's answers: like `models/moe.py` (total vs active
parameters, the load-balancing loss in training mode only, `step_metrics` with the router load
per expert, the busiest expert over an even split, the auxiliary loss, plus `moe/dropped`: the
share of (token, choice) pairs dropped since the last log line), TP by expert width with the
router replicated.

Export: `model.safetensors` plus a `config.json` naming `model_type: moe_capacity`; transformers
cannot load it; `models.load_exported(dir)` rebuilds it with the same logits.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from models import Architecture, ExportNote, ParamRole, TPStyle

if TYPE_CHECKING:
    import torch


class Config(Architecture):
    """A decoder whose MLP is a top-k mixture of SwiGLU experts with a fixed capacity per expert."""

    model_type: Literal["moe_capacity"] = "moe_capacity"
    """The architecture (this file: models/moe_capacity.py)."""
    num_experts: Annotated[int, Field(ge=2, le=256)] = 4
    """Experts per block."""
    top_k: Annotated[int, Field(ge=1, le=16)] = 2
    """Experts each token is routed to (outputs summed, weighted by the renormalised router probabilities)."""
    intermediate_size: Annotated[int, Field(ge=8, le=1048576)] = 256
    """Hidden width of one expert's SwiGLU."""
    capacity_factor: Annotated[float, Field(gt=0.0, le=256.0)] = 1.0
    """Slots per expert and row, over an even split of the row's (token, choice) pairs (Switch: 1.0-1.25)."""
    router_aux_loss_coef: Annotated[float, Field(ge=0.0, le=10.0)] = 0.01
    """Weight of the load-balancing loss added to the training loss (0 turns it off)."""
    rope_theta: Annotated[float, Field(gt=0.0)] = 10000.0
    """Base of the rotary position encoding."""

    batch_dependence: ClassVar[str] = (
        "capacity-limited routing: an expert takes at most `capacity` (token, choice) pairs of a row, first come "
        "first served, so whether a token is dropped depends on the earlier tokens of its row (earlier packed "
        "documents included)")
    """Why a token's output depends on other tokens than its document's earlier ones (`pipeline contract`)."""

    @model_validator(mode="after")
    def _top_k_fits(self) -> Config:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be at most num_experts ({self.num_experts})")
        return self

    def batch_independent_fields(self) -> dict[str, Any]:
        """A capacity factor whose capacity is a whole row: no token is ever dropped, so a token's
        routing depends on itself only (what the contract's packed-row check runs with)."""
        return {"capacity_factor": float(self.num_experts) / self.top_k}

    def capacity(self, seq_len: int) -> int:
        """Slots of one expert for one row of `seq_len` tokens (a token picks an expert at most once)."""
        return min(math.ceil(self.capacity_factor * seq_len * self.top_k / self.num_experts), seq_len)

    # ------------------------------------------------------------------ counts

    def _attention(self) -> int:
        return 4 * self.hidden_size * self.hidden_size

    def _expert(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    def _router(self) -> int:
        return self.hidden_size * self.num_experts

    def block_parameters(self) -> int:
        per_block = self._attention() + self._router() + self.num_experts * self._expert() + 2 * self.hidden_size
        return self.num_layers * per_block

    def parameter_count(self) -> int:
        v, h = self.vocab_size, self.hidden_size
        total = v * h + self.block_parameters() + h
        return total if self.tie_word_embeddings else total + v * h

    def active_parameter_count(self) -> int:
        """Every parameter but the (num_experts - top_k) experts a token skips in each block."""
        return self.parameter_count() - self.num_layers * (self.num_experts - self.top_k) * self._expert()

    def matmul_parameters(self) -> int:
        """Per token, nominally: attention, router and capacity_factor x top_k experts' worth of slots
        in each block, plus the output head (`flops_per_token` is exact for a sequence length)."""
        per_block = self._attention() + self._router() + round(self.capacity_factor * self.top_k * self._expert())
        return self.num_layers * per_block + self.vocab_size * self.hidden_size

    def flops_per_token(self, seq_len: int) -> float:
        """6 x (attention, router, head, and every expert on its `capacity(seq_len)` slots of a row,
        per token of the row) + the attention term: what runs, dropped pairs and empty slots included."""
        expert_slots = self.num_experts * self.capacity(seq_len) / seq_len
        per_block = self._attention() + self._router() + expert_slots * self._expert()
        matmul = self.num_layers * per_block + self.vocab_size * self.hidden_size
        return 6.0 * matmul + self.attention_flops_per_token(seq_len)

    def parameters_by_role(self) -> dict[ParamRole, int]:
        """All experts are hidden matrices (what the optimizer keeps state for), active or not."""
        v, h = self.vocab_size, self.hidden_size
        hidden = self.num_layers * (self._attention() + self._router() + self.num_experts * self._expert())
        return {"hidden": hidden, "embedding": v * h, "head": 0 if self.tie_word_embeddings else v * h,
                "scalar": (2 * self.num_layers + 1) * h}

    def activation_bytes_per_layer(self, seq_len: int, micro_batch: int, element_bytes: float) -> float:
        """Saved tensors of one block: two RMSNorms, q/k/v before and after rotary, the attention
        output and o_proj input (~11 x s*b*h); the router (logits, probabilities: 2 x s*b*E,
        fp32); the copies of the tokens the slot buffer is filled from and the slots gathered back
        per (token, choice) (2 x k x s*b x h); the slot buffer each expert reads (E x capacity x b
        rows of h) and, per slot, w1 and w3 outputs, the SiLU and the product (4 x ffn); the slot
        indices (int64); plus the boolean document mask (s^2 x b)."""
        s, b, h, f, e, k = seq_len, micro_batch, self.hidden_size, self.intermediate_size, self.num_experts, self.top_k
        tokens, slots = s * b, e * self.capacity(s) * b
        elems = 11 * tokens * h + slots * (h + 4 * f) + 2 * k * tokens * h
        return elems * element_bytes + 2 * tokens * e * 4 + 2 * k * tokens * 8 + s * s * b

    def activation_bytes_whole_under_tp(self, seq_len: int, micro_batch: int, element_bytes: float) -> float:
        """Under TP each expert's width is split, not the slot buffers of whole tokens (its input,
        w2's all-reduced output) nor the token copies and gathered pairs, nor the router's fp32
        logits and probabilities."""
        tokens, slots = seq_len * micro_batch, self.num_experts * self.capacity(seq_len) * micro_batch
        return (2 * slots + 2 * self.top_k * tokens) * self.hidden_size * element_bytes + 2 * tokens * self.num_experts * 4

    def tensor_parallel_plan(self) -> dict[str, TPStyle]:
        """Attention by head; each expert's SwiGLU by its hidden width (the router replicated)."""
        plan: dict[str, TPStyle] = {"attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise",
                                    "attn.o": "rowwise"}
        for i in range(self.num_experts):
            plan |= {f"moe.experts.{i}.w1": "colwise", f"moe.experts.{i}.w3": "colwise",
                     f"moe.experts.{i}.w2": "rowwise"}
        return plan

    def tp_problem(self, tp: int) -> str | None:
        problem = super().tp_problem(tp)
        if problem is None and tp > 1 and self.intermediate_size % tp:
            return f"tp={tp} must divide model.intermediate_size ({self.intermediate_size}), each expert's width"
        return problem

    def smoke_overrides(self, vocab_size: int, seq_len: int) -> dict[str, Any]:
        return super().smoke_overrides(vocab_size, seq_len) | {"intermediate_size": 64,
                                                               "num_experts": min(self.num_experts, 4),
                                                               "top_k": min(self.top_k, 2)}

    # ------------------------------------------------------------------ torch half

    def build(self) -> torch.nn.Module:
        model: torch.nn.Module = modules()["CapacityMoEModel"](self)
        return model

    def blocks(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        return list(model.blocks)  # type: ignore[arg-type]

    def input_embeddings(self, model: torch.nn.Module) -> torch.nn.Module:
        emb: torch.nn.Module = model.wte  # type: ignore[assignment]
        return emb

    def output_modules(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        return [model.norm, model.lm_head]  # type: ignore[list-item]

    def enable_activation_checkpointing(self, model: torch.nn.Module) -> None:
        for block in self.blocks(model):
            block.checkpointed = True  # type: ignore[assignment]

    def init_parameter(self, model: torch.nn.Module, name: str, shape: Any, gen: torch.Generator) -> torch.Tensor:
        """normal(0, 0.02); the residual projections (attention output, expert w2) 0.02 / sqrt(2 x
        layers); RMSNorm weights 1."""
        import torch

        if len(shape) == 1:
            return torch.ones(shape)
        std = 0.02 / math.sqrt(2 * self.num_layers) if name.endswith(("attn.o.weight", "w2.weight")) else 0.02
        return torch.empty(shape).normal_(0.0, std, generator=gen)

    def step_metrics(self, model: torch.nn.Module) -> dict[str, float]:
        """Router load since the last call (training forwards only): each expert's share of the
        routed pairs (`moe/load/eN`), the busiest expert of any block over an even split
        (`moe/load_max`), the mean auxiliary loss (`moe/aux_loss`) and the share of (token,
        choice) pairs dropped over capacity (`moe/dropped`). Reading resets the window."""
        import torch

        counts: list[torch.Tensor] = []
        aux, forwards, dropped, routed = 0.0, 0, 0.0, 0.0
        for block in self.blocks(model):
            router: Any = block.moe
            if router.load is not None:
                counts.append(router.load)
                aux += float(router.aux_sum)
                forwards += router.forwards
                dropped += float(router.dropped)
                routed += float(router.load.sum())
            router.load, router.aux_sum, router.forwards, router.dropped = None, 0.0, 0, 0.0
        if not counts:
            return {}
        per_block = torch.stack(counts).double()
        per_block = per_block / per_block.sum(dim=1, keepdim=True).clamp(min=1)
        out = {f"moe/load/e{i}": v for i, v in enumerate(per_block.mean(dim=0).tolist())}
        out["moe/load_max"] = float(per_block.max()) * self.num_experts
        out["moe/aux_loss"] = aux / max(1, forwards)
        out["moe/dropped"] = dropped / max(1.0, routed)
        return out

    def export_note(self) -> ExportNote:
        return ExportNote(loadable=False, how="plain PyTorch: transformers cannot load it (config.json names "
                                              "model_type moe_capacity, which it refuses); models.load_exported(dir) "
                                              "rebuilds it with the same logits")

    def export(self, model: torch.nn.Module, out_dir: Path) -> ExportNote:
        fields = self.model_dump(mode="json", exclude={"init_from"})
        (Path(out_dir) / "config.json").write_text(json.dumps(fields, indent=2, sort_keys=True) + "\n")
        return self.export_note()


@cache
def modules() -> dict[str, type]:
    """The nn.Module classes (defined on first use: the config half stays torch-free)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, width: int):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.rms_norm(x, self.weight.shape, self.weight, 1e-6)

    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Attention(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            h = cfg.hidden_size
            self.head_dim = cfg.head_dim
            self.q, self.k, self.v, self.o = (nn.Linear(h, h, bias=False) for _ in range(4))

        def forward(self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            # -1 heads: under tensor parallelism each rank holds its own heads only.
            q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return self.o(y.transpose(1, 2).reshape(b, s, -1))

    class Expert(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            self.w1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
            self.w3 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
            self.w2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class CapacityMoE(nn.Module):
        """Top-k routing into fixed slots: expert e of row r owns slots [(r x E + e) x C, ... + C)."""

        def __init__(self, cfg: Config):
            super().__init__()
            self.cfg = cfg
            self.num_experts, self.top_k = cfg.num_experts, cfg.top_k
            self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
            self.experts = nn.ModuleList(Expert(cfg) for _ in range(cfg.num_experts))
            # Router load since `Config.step_metrics` last read it (device tensors: no host sync per step).
            self.load: torch.Tensor | None = None
            self.aux_sum: torch.Tensor | float = 0.0
            self.dropped: torch.Tensor | float = 0.0
            self.forwards = 0

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            b, s, h = x.shape
            e, k, cap = self.num_experts, self.top_k, self.cfg.capacity(s)
            probs = F.softmax(self.gate(x).float(), dim=-1)  # [b, s, E]
            weights, chosen = torch.topk(probs, k, dim=-1)
            weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
            # The row's (token, choice) pairs in order: token 0's choices, then token 1's, ... Each
            # pair's place in its expert's queue counts the earlier pairs of the row only, so a
            # token's routing never depends on later tokens (causal), nor on other rows.
            pairs = chosen.reshape(b, s * k)
            onehot = pairs[..., None] == torch.arange(e, device=x.device)  # [b, s*k, E], fixed shape
            place = (onehot.long().cumsum(dim=1) - 1).gather(2, pairs[..., None]).squeeze(2)  # [b, s*k]
            kept = place < cap
            row = torch.arange(b, device=x.device)[:, None]
            # A dropped pair writes to a slot of its own past the experts' (all indices distinct).
            spill = b * e * cap + torch.arange(b * s * k, device=x.device).view(b, s * k)
            slot = torch.where(kept, (row * e + pairs) * cap + place, spill).reshape(-1)
            tokens = x.reshape(b, s, 1, h).expand(b, s, k, h).reshape(b * s * k, h)
            buffer = x.new_zeros(b * e * cap + b * s * k, h).index_copy(0, slot, tokens)
            per_expert = buffer[:b * e * cap].view(b, e, cap, h)
            outs = [expert(per_expert[:, i].reshape(b * cap, h)).view(b, 1, cap, h)
                    for i, expert in enumerate(self.experts)]
            done = torch.cat([torch.cat(outs, dim=1).reshape(b * e * cap, h), x.new_zeros(b * s * k, h)])
            ys = done[slot] * weights.reshape(-1, 1)
            out = ys.view(b, s, k, h).sum(dim=2)
            assigned = onehot.view(b * s, k, e).sum(dim=1).float()  # [tokens, experts]
            flat_probs = probs.reshape(b * s, e)
            # Switch Transformer's balance loss: E x sum_e (share of assignments) x (mean probability).
            aux = e * (assigned.mean(dim=0) / k * flat_probs.mean(dim=0)).sum()
            if self.training:
                counts = assigned.detach().sum(dim=0)
                self.load = counts if self.load is None else self.load + counts
                self.aux_sum = self.aux_sum + aux.detach()
                self.dropped = self.dropped + (~kept).sum().detach()
                self.forwards += 1
            return out, aux

    class Block(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            self.norm_1, self.norm_2 = RMSNorm(cfg.hidden_size), RMSNorm(cfg.hidden_size)
            self.attn, self.moe = Attention(cfg), CapacityMoE(cfg)
            self.checkpointed = False

        def _forward(self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = x + self.attn(self.norm_1(x), mask, cos, sin)
            y, aux = self.moe(self.norm_2(x))
            return x + y, aux

        def forward(self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if self.checkpointed and self.training:
                from torch.utils.checkpoint import checkpoint

                out: tuple[torch.Tensor, torch.Tensor] = checkpoint(self._forward, x, mask, cos, sin,
                                                                    use_reentrant=False)
                return out
            return self._forward(x, mask, cos, sin)

    class Output:
        def __init__(self, loss: torch.Tensor | None, logits: torch.Tensor, aux_loss: torch.Tensor):
            self.loss, self.logits, self.aux_loss = loss, logits, aux_loss

    class CapacityMoEModel(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            self.cfg = cfg
            self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
            self.norm = RMSNorm(cfg.hidden_size)
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            if cfg.tie_word_embeddings:
                self.lm_head.weight = self.wte.weight

        def tie_weights(self) -> None:
            if self.cfg.tie_word_embeddings:
                self.lm_head.weight = self.wte.weight

        def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                    labels: torch.Tensor | None = None, **_: Any) -> Output:
            b, s = input_ids.shape
            device = input_ids.device
            if position_ids is None:
                position_ids = torch.arange(s, device=device).expand(b, s)
            # Document of each token: a new one starts wherever the position restarts at 0.
            doc = torch.cumsum((position_ids == 0).int(), dim=1)
            causal = torch.ones(s, s, dtype=torch.bool, device=device).tril()
            mask = ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]
            half = self.cfg.head_dim // 2
            inv = 1.0 / (self.cfg.rope_theta ** (torch.arange(half, device=device, dtype=torch.float32) / half))
            angles = position_ids[:, None, :, None].float() * inv  # [b, 1, s, half]
            x = self.wte(input_ids)
            cos = torch.cat((angles.cos(), angles.cos()), dim=-1).to(x.dtype)
            sin = torch.cat((angles.sin(), angles.sin()), dim=-1).to(x.dtype)
            aux_total = x.new_zeros((), dtype=torch.float32)
            for block in self.blocks:
                x, aux = block(x, mask, cos, sin)
                aux_total = aux_total + aux
            logits = self.lm_head(self.norm(x))
            aux_loss = aux_total / len(self.blocks)
            loss = None
            if labels is not None:
                loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(),
                                       labels[:, 1:].reshape(-1), ignore_index=-100)
                if self.training and self.cfg.router_aux_loss_coef:
                    # The auxiliary loss joins the training objective here; eval/loss stays cross-entropy.
                    loss = loss + self.cfg.router_aux_loss_coef * aux_loss
            return Output(loss, logits, aux_loss)

    return {"CapacityMoEModel": CapacityMoEModel, "Block": Block}
