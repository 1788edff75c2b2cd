"""Plug-in files with the mistakes that make a hypothesis lie (issue 38), for the contract tests.

`TEMPLATE` is a correct architecture file written from scratch (a tiny plain-PyTorch GPT that
keeps every promise of the contract: counts, FLOPs, a TP plan, causal attention within each
packed document, all state in `state_dict()`, an honest export note). Each entry of `MISTAKES`
is that file with a few lines changed, the way a researcher's first draft gets them wrong; its
`marker` is a text of the changed file whose line the contract must name. `write(name, folder)`
writes `folder/<name>.py` (model_type = the file's name, as discovery requires).

Self-contained on purpose: the mistakes must not move when the shipped files change (issue 40
edits the attention of nanogpt and the Llama family).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEMPLATE = '''"""A GPT written from scratch in plain PyTorch (a contract-test file: {name})."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from models import Architecture, ExportNote, TPStyle

if TYPE_CHECKING:
    import torch


class Config(Architecture):
    """LayerNorm without biases, learned positions, GELU MLP (4 x hidden), tied head by default."""

    model_type: Literal["{name}"] = "{name}"
    """The architecture (this file)."""

    tp_plan: ClassVar[dict[str, TPStyle]] = {{
        "attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "mlp.fc": "colwise",
        "attn.proj": "rowwise", "mlp.proj": "rowwise",
    }}

    def block_parameters(self) -> int:
        h = self.hidden_size
        return self.num_layers * (12 * h * h + 2 * h)

    def parameter_count(self) -> int:
        v, h = self.vocab_size, self.hidden_size
        total = v * h + self.max_position_embeddings * h + self.block_parameters() + h
        return total if self.tie_word_embeddings else total + v * h

    def matmul_parameters(self) -> int:
        return self.num_layers * 12 * self.hidden_size ** 2 + self.vocab_size * self.hidden_size

    def activation_bytes_per_layer(self, seq_len: int, micro_batch: int, element_bytes: float) -> float:
        s, b, h = seq_len, micro_batch, self.hidden_size
        return 17 * s * b * h * element_bytes + s * s * b

    def build(self) -> torch.nn.Module:
        model: torch.nn.Module = modules()["GPT"](self)
        return model

    def blocks(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        return list(model.blocks)  # type: ignore[arg-type]

    def input_embeddings(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.wte  # type: ignore[return-value]

    def output_modules(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        return [model.ln_f, model.lm_head]  # type: ignore[list-item]

    def init_parameter(self, model: torch.nn.Module, name: str, shape: Any, gen: torch.Generator) -> torch.Tensor:
        import torch

        if ".ln" in f".{{name}}":
            return torch.ones(shape)
        std = 0.02 / math.sqrt(2 * self.num_layers) if name.endswith("proj.weight") else 0.02
        return torch.empty(shape).normal_(0.0, std, generator=gen)

    def export_note(self) -> ExportNote:
        return ExportNote(loadable=False, how="plain PyTorch: models.load_exported(dir) rebuilds it")

    def export(self, model: torch.nn.Module, out_dir: Path) -> ExportNote:
        fields = self.model_dump(mode="json", exclude={{"init_from"}})
        (Path(out_dir) / "config.json").write_text(json.dumps(fields, indent=2) + "\\n")
        return self.export_note()


@cache
def modules() -> dict[str, type]:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class LayerNorm(nn.Module):
        def __init__(self, width: int):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)

    class Attention(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            h = cfg.hidden_size
            self.heads, self.head_dim = cfg.num_heads, cfg.head_dim
            self.q, self.k, self.v, self.proj = (nn.Linear(h, h, bias=False) for _ in range(4))

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return self.proj(y.transpose(1, 2).reshape(b, s, -1))

    class MLP(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            self.fc = nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False)
            self.proj = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(F.gelu(self.fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self, cfg: Config):
            super().__init__()
            self.ln_1, self.ln_2 = LayerNorm(cfg.hidden_size), LayerNorm(cfg.hidden_size)
            self.attn, self.mlp = Attention(cfg), MLP(cfg)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln_1(x), mask)
            return x + self.mlp(self.ln_2(x))

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
            self.ln_f = LayerNorm(cfg.hidden_size)
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
            doc = torch.cumsum((position_ids == 0).int(), dim=1)  # a document starts where positions restart
            causal = torch.ones(s, s, dtype=torch.bool, device=input_ids.device).tril()
            mask = (doc[:, :, None] == doc[:, None, :]) & causal
            x = self.wte(input_ids) + self.wpe(position_ids)
            for block in self.blocks:
                x = block(x, mask[:, None])
            logits = self.lm_head(self.ln_f(x))
            loss = None
            if labels is not None:
                loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(),
                                       labels[:, 1:].reshape(-1), ignore_index=-100)
            return Output(loss, logits)

    return {{"GPT": GPT}}
'''


@dataclass(frozen=True)
class Mistake:
    """One first-draft mistake: the lines it changes in `TEMPLATE`, and where the contract must point."""

    what: str
    changes: tuple[tuple[str, str], ...]
    marker: str
    """A text of the changed file: the failure names its line."""


def _indent(lines: str, spaces: int) -> str:
    return "\n".join((" " * spaces + line) if line else line for line in lines.splitlines())


MISTAKES: dict[str, Mistake] = {
    "boundary_leak": Mistake(
        "one causal mask for the whole row: a packed document attends to the documents before it",
        (("mask = (doc[:, :, None] == doc[:, None, :]) & causal", "mask = causal.expand(b, s, s)"),),
        marker="    def build(self) -> torch.nn.Module:",
    ),
    "causal_leak": Mistake(
        "a token attends to the later tokens of its own document (the causal part of the mask dropped)",
        (("mask = (doc[:, :, None] == doc[:, None, :]) & causal",
          "mask = doc[:, :, None] == doc[:, None, :]  # attention within the document"),),
        marker="        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:\n            b, s, _",
    ),
    "tp_share_leak": Mistake(
        "the mask is applied only when a rank holds every head: under tensor parallelism tokens see the future",
        (("            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)",
          "            whole = q.shape[1] * self.head_dim == self.proj.out_features  # every head on this rank\n"
          "            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask if whole else None)"),),
        marker="        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:\n            b, s, _",
    ),
    "export_mismatch": Mistake(
        "the export writes a GPT-2 config.json and says transformers loads it: the weight names are not GPT-2's",
        (('        return ExportNote(loadable=False, how="plain PyTorch: models.load_exported(dir) rebuilds it")',
          '        return ExportNote(loadable=True, how="transformers AutoModelForCausalLM.from_pretrained(dir)")'),
         ('        fields = self.model_dump(mode="json", exclude={"init_from"})\n'
          '        (Path(out_dir) / "config.json").write_text(json.dumps(fields, indent=2) + "\\n")',
          "        from transformers import GPT2Config  # the same shape as GPT-2, so its config\n\n"
          "        GPT2Config(vocab_size=self.vocab_size, n_embd=self.hidden_size, n_layer=self.num_layers,\n"
          "                   n_head=self.num_heads, n_positions=self.max_position_embeddings,\n"
          "                   tie_word_embeddings=self.tie_word_embeddings).save_pretrained(out_dir)")),
        marker="    def export(self, model: torch.nn.Module, out_dir: Path) -> ExportNote:",
    ),
    "param_in_forward": Mistake(
        "a learned gain created inside forward: never in the optimizer, never trained",
        (("            x = x + self.attn(self.ln_1(x), mask)\n            return x + self.mlp(self.ln_2(x))",
          "            x = x + self.attn(self.ln_1(x), mask)\n"
          "            if not hasattr(self, \"gain\"):  # a learned gain on the block's output\n"
          "                self.gain = nn.Parameter(torch.ones(x.shape[-1], device=x.device))\n"
          "            return (x + self.mlp(self.ln_2(x))) * self.gain"),),
        marker="                self.gain = nn.Parameter(",
    ),
    "unused_parameter": Mistake(
        "the MLP's norm reads ln_1 (a copy-paste slip): ln_2 is in the model, never used, never trained",
        (("            return x + self.mlp(self.ln_2(x))", "            return x + self.mlp(self.ln_1(x))"),),
        marker="            self.weight = nn.Parameter(torch.ones(width))",
    ),
    "unsaved_buffer": Mistake(
        "the embeddings' running RMS kept in a persistent=False buffer: not in state_dict(), lost on resume",
        (("            if cfg.tie_word_embeddings:\n                self.lm_head.weight = self.wte.weight\n\n"
          "        def tie_weights",
          "            if cfg.tie_word_embeddings:\n                self.lm_head.weight = self.wte.weight\n"
          "            self.register_buffer(\"running_rms\", torch.ones(()), persistent=False)\n\n"
          "        def tie_weights"),
         ("            x = self.wte(input_ids) + self.wpe(position_ids)\n",
          "            x = self.wte(input_ids) + self.wpe(position_ids)\n"
          "            if self.training:  # running statistics of the embeddings, used to scale them\n"
          "                with torch.no_grad():\n"
          "                    self.running_rms.lerp_(x.pow(2).mean().sqrt(), 0.1)\n"
          "            x = x / self.running_rms\n")),
        marker="            self.register_buffer(\"running_rms\"",
    ),
    "eval_dropout": Mistake(
        "dropout on the attention output through F.dropout, whose `training` defaults to True: random in eval",
        (("            return self.proj(y.transpose(1, 2).reshape(b, s, -1))",
          "            return F.dropout(self.proj(y.transpose(1, 2).reshape(b, s, -1)), 0.1)"),),
        marker="        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:\n            b, s, _",
    ),
    "tp_global_heads": Mistake(
        "the head count in the attention's view is the global one: under tp each rank holds num_heads / tp",
        (("p(x).view(b, s, -1, self.head_dim)", "p(x).view(b, s, self.heads, self.head_dim)"),),
        marker="p(x).view(b, s, self.heads, self.head_dim)",
    ),
}


def source(name: str, mistake: str | None = None) -> str:
    """The text of plug-in file `<name>.py`: the template, with `mistake`'s changes."""
    text = TEMPLATE.format(name=name)
    for old, new in MISTAKES[mistake].changes if mistake else ():
        assert text.count(old) == 1, (mistake, old)
        text = text.replace(old, new)
    return text


def marker_line(text: str, mistake: str) -> int:
    """The (1-based) line of `mistake`'s marker in `text` (a marker of several lines: its first)."""
    marker = MISTAKES[mistake].marker
    assert text.count(marker) == 1, (mistake, marker)
    return text[:text.index(marker)].count("\n") + 1


def write(name: str, folder: Path, mistake: str | None = None) -> Path:
    """`folder/<name>.py` with `mistake` (None: the correct template)."""
    path = Path(folder) / f"{name}.py"
    path.write_text(source(name, mistake))
    return path


def load(path: Path) -> Any:
    """The `Config` class of plug-in file `path`, imported under a module name of its own."""
    module_name = f"_contract_case_{path.stem}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module.Config
