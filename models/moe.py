"""A dropless mixture-of-experts decoder (Mixtral-style) in plain PyTorch.

Written only through the public contract of `models` (docs/architectures.md, "Mixture of
experts"). Each block: RMSNorm, causal self-attention with rotary positions (limited to the
document in O(seq_len) memory, like nanogpt: models/_attention.py; packed rows equal documents
alone), RMSNorm, then a router that sends every token to its `top_k` of `num_experts` SwiGLU
experts. Dropless: every token reaches its experts (no capacity, no token dropped), so how many
tokens an expert gets is data-dependent (like transformers' Mixtral): torch's FLOP counter cannot
run it on fake tensors, and smoke checks the declared count on real tiny tensors instead.

What the framework reads from this file beyond a dense model's answers:
  - `parameter_count()` is every expert; `active_parameter_count()` and `matmul_parameters()`
    (hence `flops_per_token`, MFU, the plan's compute) count the top-k experts a token passes
    through;
  - the auxiliary load-balancing loss (Switch Transformer / Mixtral: num_experts x sum over
    experts of token share x mean router probability, averaged over layers) is added to
    `.loss` in training mode only, scaled by `router_aux_loss_coef`; in eval mode `.loss` is
    the plain cross-entropy, so eval/loss compares with dense models;
  - `step_metrics(model)`: router load per expert, the load of the busiest expert relative to
    an even split, and the auxiliary loss, since the last log line (the trainer logs them);
  - `tensor_parallel_plan()`: every expert's SwiGLU split like a dense MLP (w1, w3 column-wise,
    w2 row-wise), attention by head; the router stays whole (replicated), so every TP rank
    routes alike.

Export: `model.safetensors` plus a `config.json` naming `model_type: moe`; transformers cannot
load it; `models.load_exported(dir)` rebuilds it with the same logits.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, model_validator

from models import Architecture, ExportNote, ParamRole, TPStyle

if TYPE_CHECKING:
    import torch


class Config(Architecture):
    """A decoder whose MLP is a dropless top-k mixture of SwiGLU experts."""

    model_type: Literal["moe"] = "moe"
    """The architecture (this file: models/moe.py)."""
    num_experts: Annotated[int, Field(ge=2, le=256)] = 4
    """Experts per block."""
    top_k: Annotated[int, Field(ge=1, le=16)] = 2
    """Experts each token is routed to (their outputs summed, weighted by the renormalised router probabilities)."""
    intermediate_size: Annotated[int, Field(ge=8, le=1048576)] = 256
    """Hidden width of one expert's SwiGLU."""
    router_aux_loss_coef: Annotated[float, Field(ge=0.0, le=10.0)] = 0.01
    """Weight of the load-balancing loss added to the training loss (0 turns it off)."""
    rope_theta: Annotated[float, Field(gt=0.0)] = 10000.0
    """Base of the rotary position encoding."""

    @model_validator(mode="after")
    def _top_k_fits(self) -> Config:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be at most num_experts ({self.num_experts})")
        return self

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
        """Per token: attention, router and top_k experts in each block, plus the output head."""
        per_block = self._attention() + self._router() + self.top_k * self._expert()
        return self.num_layers * per_block + self.vocab_size * self.hidden_size

    def parameters_by_role(self) -> dict[ParamRole, int]:
        """All experts are hidden matrices (what the optimizer keeps state for), active or not."""
        v, h = self.vocab_size, self.hidden_size
        hidden = self.num_layers * (self._attention() + self._router() + self.num_experts * self._expert())
        return {"hidden": hidden, "embedding": v * h, "head": 0 if self.tie_word_embeddings else v * h,
                "scalar": (2 * self.num_layers + 1) * h}

    def activation_bytes_per_layer(self, seq_len: int, micro_batch: int, element_bytes: float) -> float:
        """Saved tensors of one block, per token (listed by bench/bench_architectures.py): two
        RMSNorms (input, normalised, weighted: 6 x h), q and k after rotary, v and the attention
        output (4 x h), rotary cos and sin (2 x head_dim), the kernel's log-sum-exp (one per head);
        the router (logits, probabilities: 2 x E, fp32); per routed token (k of them) its gathered
        input and weighted output (2 x h) and w1, w3, SiLU and product (4 x ffn). No document mask:
        packed documents reach the kernel in O(seq_len) (models/_attention.py)."""
        s, b, h, f, e, k = seq_len, micro_batch, self.hidden_size, self.intermediate_size, self.num_experts, self.top_k
        tokens = s * b
        elems = (10 * h + 2 * self.head_dim + self.num_heads) * tokens + k * tokens * (2 * h + 4 * f)
        return elems * element_bytes + 2 * tokens * e * 4

    def activation_bytes_whole_under_tp(self, seq_len: int, micro_batch: int, element_bytes: float) -> float:
        """Under TP each expert's width is split (w1, w3, SiLU, product), but not what moves whole
        tokens: per routed token its gathered input, w2's all-reduced output and the weighted
        output (3 x k x h), and the router's fp32 logits and probabilities. Measured by the dry
        run: MoE 8x2B at tp 8 kept 0.48 of its tp 1 activations per block (bench/RESULTS.md)."""
        tokens = seq_len * micro_batch
        return 3 * self.top_k * tokens * self.hidden_size * element_bytes + 2 * tokens * self.num_experts * 4

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
        model: torch.nn.Module = modules()["MoEModel"](self)
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
        routed tokens over all blocks (`moe/load/eN`, 1/num_experts when balanced), the busiest
        expert of any block over an even split (`moe/load_max`, 1.0 = balanced), and the mean
        auxiliary loss (`moe/aux_loss`). Reading resets the window."""
        import torch

        counts: list[torch.Tensor] = []
        aux, forwards = 0.0, 0
        for block in self.blocks(model):
            router: Any = block.moe
            if router.load is not None:
                counts.append(router.load)
                aux += float(router.aux_sum)
                forwards += router.forwards
            router.load, router.aux_sum, router.forwards = None, 0.0, 0
        if not counts:
            return {}
        per_block = torch.stack(counts).double()
        per_block = per_block / per_block.sum(dim=1, keepdim=True).clamp(min=1)
        share = per_block.mean(dim=0).tolist()
        out = {f"moe/load/e{i}": v for i, v in enumerate(share)}
        out["moe/load_max"] = float(per_block.max()) * self.num_experts
        out["moe/aux_loss"] = aux / max(1, forwards)
        return out

    def export_note(self) -> ExportNote:
        return ExportNote(loadable=False, how="plain PyTorch: transformers cannot load it (config.json names "
                                              "model_type moe, which it refuses); models.load_exported(dir) "
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

    from models._attention import Documents, document_attention

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

        def forward(self, x: torch.Tensor, documents: Documents, cos: torch.Tensor,
                    sin: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            # -1 heads: under tensor parallelism each rank holds its own heads only.
            q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            return self.o(document_attention(q, k, v, documents).reshape(b, s, -1))

    class Expert(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            self.w1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
            self.w3 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
            self.w2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class SparseMoE(nn.Module):
        """Top-k routing, dropless: each expert runs on exactly the tokens routed to it."""

        def __init__(self, cfg: Config):
            super().__init__()
            self.num_experts, self.top_k = cfg.num_experts, cfg.top_k
            self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
            self.experts = nn.ModuleList(Expert(cfg) for _ in range(cfg.num_experts))
            # Router load since `Config.step_metrics` last read it (device tensors: no host sync per step).
            self.load: torch.Tensor | None = None
            self.aux_sum: torch.Tensor | float = 0.0
            self.forwards = 0

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            b, s, h = x.shape
            flat = x.reshape(-1, h)
            probs = F.softmax(self.gate(flat).float(), dim=-1)
            weights, chosen = torch.topk(probs, self.top_k, dim=-1)
            weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
            # Dropless: the (token, choice) pairs sorted by expert, each expert runs on its own
            # slice, whose length depends on the data (a host read, as in transformers' Mixtral).
            choice = chosen.reshape(-1)
            order = torch.argsort(choice, stable=True)
            sizes = torch.bincount(choice, minlength=self.num_experts).tolist()
            routed = flat[order // self.top_k].split(sizes)
            # Every expert runs, on an empty slice when no token chose it: all ranks use every
            # parameter each step (FSDP/DDP gradient reductions stay in step).
            ys = torch.cat([expert(part) for expert, part in zip(self.experts, routed, strict=True)])
            ys = ys * weights.reshape(-1, 1)[order]
            out = ys[torch.argsort(order)].view(-1, self.top_k, h).sum(dim=1)
            assigned = F.one_hot(chosen, self.num_experts).sum(dim=1).float()  # [tokens, experts]
            # Switch Transformer's balance loss: E x sum_e (share of assignments) x (mean probability).
            aux = self.num_experts * (assigned.mean(dim=0) / self.top_k * probs.mean(dim=0)).sum()
            if self.training:
                counts = assigned.detach().sum(dim=0)
                self.load = counts if self.load is None else self.load + counts
                self.aux_sum = self.aux_sum + aux.detach()
                self.forwards += 1
            return out.view(b, s, h), aux

    class Block(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            self.norm_1, self.norm_2 = RMSNorm(cfg.hidden_size), RMSNorm(cfg.hidden_size)
            self.attn, self.moe = Attention(cfg), SparseMoE(cfg)
            self.checkpointed = False

        def _forward(self, x: torch.Tensor, documents: Documents, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = x + self.attn(self.norm_1(x), documents, cos, sin)
            y, aux = self.moe(self.norm_2(x))
            return x + y, aux

        def forward(self, x: torch.Tensor, documents: Documents, cos: torch.Tensor,
                    sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if self.checkpointed and self.training:
                from torch.utils.checkpoint import checkpoint

                out: tuple[torch.Tensor, torch.Tensor] = checkpoint(self._forward, x, documents, cos, sin,
                                                                    use_reentrant=False)
                return out
            return self._forward(x, documents, cos, sin)

    class Output:
        def __init__(self, loss: torch.Tensor | None, logits: torch.Tensor, aux_loss: torch.Tensor):
            self.loss, self.logits, self.aux_loss = loss, logits, aux_loss

    class MoEModel(nn.Module):
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
            # A new document wherever the position restarts at 0; built once, O(s), for every block.
            documents = Documents.from_positions(position_ids).prepare()
            half = self.cfg.head_dim // 2
            inv = 1.0 / (self.cfg.rope_theta ** (torch.arange(half, device=device, dtype=torch.float32) / half))
            angles = position_ids[:, None, :, None].float() * inv  # [b, 1, s, half]
            x = self.wte(input_ids)
            cos = torch.cat((angles.cos(), angles.cos()), dim=-1).to(x.dtype)
            sin = torch.cat((angles.sin(), angles.sin()), dim=-1).to(x.dtype)
            aux_total = x.new_zeros((), dtype=torch.float32)
            for block in self.blocks:
                x, aux = block(x, documents, cos, sin)
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

    return {"MoEModel": MoEModel, "Block": Block}
