"""A plain-PyTorch GPT in the style of nanoGPT (Karpathy): no transformers anywhere.

Written only through the public contract of `models` (docs/architectures.md). Separate
q/k/v projections (not nanoGPT's fused `c_attn`) so that tensor parallelism can split them
by head; LayerNorm with optional biases; learned positions indexed by `position_ids`, which
restart at 0 for every document packed into a row, and attention limited to the document
(models/_attention.py: each token attends to its own document, in O(seq_len) memory per block),
so packed rows equal documents alone.

Export: `model.safetensors` plus a `config.json` naming `model_type: nanogpt`; transformers
cannot load it (it is not a transformers model) and says so ("unrecognized model type");
`models.load_exported(dir)` rebuilds it with the same logits.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field

from models import Architecture, ExportNote, TPStyle

if TYPE_CHECKING:
    import torch


class Config(Architecture):
    """A GPT-2-shaped decoder in plain PyTorch: LayerNorm, learned positions, GELU MLP."""

    model_type: Literal["nanogpt"] = "nanogpt"
    """The architecture (this file: models/nanogpt.py)."""
    intermediate_size: Annotated[int, Field(ge=8, le=1048576)] | None = None
    """MLP width (defaults to 4 x hidden)."""
    bias: bool = False
    """Biases in the linear layers and LayerNorms (nanoGPT's `bias`; False is a bit better and faster)."""

    tp_plan: ClassVar[dict[str, TPStyle]] = {
        "attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "mlp.fc": "colwise",
        "attn.proj": "rowwise", "mlp.proj": "rowwise",
    }


    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    # ------------------------------------------------------------------ counts

    def block_parameters(self) -> int:
        h, f, b = self.hidden_size, self.ffn_size, int(self.bias)
        attn = 4 * h * h + b * 4 * h
        mlp = 2 * h * f + b * (f + h)
        norms = 2 * h * (1 + b)
        return self.num_layers * (attn + mlp + norms)

    def parameter_count(self) -> int:
        v, h = self.vocab_size, self.hidden_size
        total = v * h + self.max_position_embeddings * h + self.block_parameters() + h * (1 + int(self.bias))
        return total if self.tie_word_embeddings else total + v * h

    def matmul_parameters(self) -> int:
        h, f = self.hidden_size, self.ffn_size
        return self.num_layers * (4 * h * h + 2 * h * f) + self.vocab_size * h

    def activation_bytes_per_layer(self, seq_len: int, micro_batch: int, element_bytes: float) -> float:
        """Saved tensors of one block, per token (listed by bench/bench_architectures.py): each
        LayerNorm's input and output (4 x hidden), q, k, v and the attention output (4 x hidden:
        the output projection reads the kernel's output), the MLP's fc and GELU outputs (2 x ffn),
        the kernel's log-sum-exp (one per head) and the LayerNorms' statistics (4). No document
        mask: packed documents reach the kernel in O(seq_len) (models/_attention.py). Under FSDP's
        bf16 cast (`element_bytes.fsdp_cast`, validation/plan/memory.py) every one of them is 16-bit
        but the log-sum-exp (fp32): no norm upcasts here, so 2 B an element, not the Llama family's
        fitted bytes (measured per block, bench/bench_architectures.py: 2.005 B)."""
        s, b, h, f = seq_len, micro_batch, self.hidden_size, self.ffn_size
        if element_bytes < 4 and getattr(element_bytes, "fsdp_cast", False):
            return ((8 * h + 2 * f + 4) * 2 + self.num_heads * 4) * s * b
        return (8 * h + 2 * f + self.num_heads + 4) * s * b * element_bytes

    def smoke_overrides(self, vocab_size: int, seq_len: int) -> dict[str, Any]:
        return super().smoke_overrides(vocab_size, seq_len) | {"intermediate_size": 128}

    # ------------------------------------------------------------------ torch half

    def build(self) -> torch.nn.Module:
        gpt: Any = modules()["GPT"]
        built: torch.nn.Module = gpt(self)
        return built

    def blocks(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        return list(model.blocks)  # type: ignore[arg-type]

    def input_embeddings(self, model: torch.nn.Module) -> torch.nn.Module:
        emb: torch.nn.Module = model.wte  # type: ignore[assignment]
        return emb

    def output_modules(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        return [model.ln_f, model.lm_head]  # type: ignore[list-item]

    def enable_activation_checkpointing(self, model: torch.nn.Module) -> None:
        for block in self.blocks(model):
            block.checkpointed = True  # type: ignore[assignment]

    def init_parameter(self, model: torch.nn.Module, name: str, shape: Any, gen: torch.Generator) -> torch.Tensor:
        """nanoGPT's init: normal(0, 0.02), residual projections 0.02 / sqrt(2 x layers), LayerNorm
        weights 1, biases 0."""
        import torch

        if name.endswith("bias"):
            return torch.zeros(shape)
        if ".ln_" in f".{name}" or name.startswith("ln_"):
            return torch.ones(shape)
        std = 0.02 / math.sqrt(2 * self.num_layers) if name.endswith("proj.weight") else 0.02
        return torch.empty(shape).normal_(0.0, std, generator=gen)

    def export_note(self) -> ExportNote:
        return ExportNote(loadable=False, how="plain PyTorch: transformers cannot load it (config.json names "
                                              "model_type nanogpt, which it refuses); models.load_exported(dir) "
                                              "rebuilds it with the same logits; lm-eval scores it as "
                                              "model='gitops-train', model_args='pretrained=dir' once "
                                              "trainer.lm_eval_scoring is imported")

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

    class LayerNorm(nn.Module):
        def __init__(self, width: int, bias: bool):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))
            self.bias = nn.Parameter(torch.zeros(width)) if bias else None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)

    class Attention(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            h, bias = cfg.hidden_size, cfg.bias
            self.head_dim = cfg.head_dim
            self.q, self.k, self.v = (nn.Linear(h, h, bias=bias) for _ in range(3))
            self.proj = nn.Linear(h, h, bias=bias)

        def forward(self, x: torch.Tensor, documents: Documents) -> torch.Tensor:
            b, s, _ = x.shape
            # -1 heads: under tensor parallelism each rank holds its own heads only.
            q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
            return self.proj(document_attention(q, k, v, documents).reshape(b, s, -1))

    class MLP(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            self.fc = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=cfg.bias)
            self.proj = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=cfg.bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(F.gelu(self.fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            self.ln_1, self.ln_2 = LayerNorm(cfg.hidden_size, cfg.bias), LayerNorm(cfg.hidden_size, cfg.bias)
            self.attn, self.mlp = Attention(cfg), MLP(cfg)
            self.checkpointed = False

        def _forward(self, x: torch.Tensor, documents: Documents) -> torch.Tensor:
            x = x + self.attn(self.ln_1(x), documents)
            return x + self.mlp(self.ln_2(x))

        def forward(self, x: torch.Tensor, documents: Documents) -> torch.Tensor:
            if self.checkpointed and self.training:
                from torch.utils.checkpoint import checkpoint

                out: torch.Tensor = checkpoint(self._forward, x, documents, use_reentrant=False)
                return out
            return self._forward(x, documents)

    class Output:
        def __init__(self, loss: torch.Tensor | None, logits: torch.Tensor):
            self.loss, self.logits = loss, logits

    class GPT(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            self.cfg = cfg
            self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.wpe = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
            self.ln_f = LayerNorm(cfg.hidden_size, cfg.bias)
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            if cfg.tie_word_embeddings:
                self.lm_head.weight = self.wte.weight

        def tie_weights(self) -> None:
            if self.cfg.tie_word_embeddings:
                self.lm_head.weight = self.wte.weight

        def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                    labels: torch.Tensor | None = None, **_: Any) -> Output:
            b, s = input_ids.shape
            if position_ids is None:
                position_ids = torch.arange(s, device=input_ids.device).expand(b, s)
            # A new document wherever the position restarts at 0; built once, O(s), for every block.
            documents = Documents.from_positions(position_ids).prepare()
            x = self.wte(input_ids) + self.wpe(position_ids)
            for block in self.blocks:
                x = block(x, documents)
            logits = self.lm_head(self.ln_f(x))
            loss = None
            if labels is not None:
                loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(),
                                       labels[:, 1:].reshape(-1), ignore_index=-100)
            return Output(loss, logits)

    return {"GPT": GPT, "Block": Block}
