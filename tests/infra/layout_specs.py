"""The tiny experiment of the layout-continuation tests (tests/*/test_continue_layout.py): one YAML
template whose layout, processes and batch split are parameters, the three layouts they use, and a
scratch repository that resolves it without data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPEC = """\
name: {name}
owner: ml-platform
hypothesis:
  statement: The tiny reference configuration trains to a finite held-out loss on the demo mixture.
  metric: eval/loss
  direction: decrease
  min_effect: 0.01
  baseline: champion
model: {{model_type: llama, hidden_size: 32, num_layers: 2, num_heads: 2, vocab_size: 512,
        max_position_embeddings: 64, tie_word_embeddings: false}}
data:
  sources:
    - {{name: code, path: data/demo/code.jsonl, weight: 0.5}}
    - {{name: docs, path: data/demo/docs.jsonl, weight: 0.5}}
  seq_len: 32
  tokenizer: {{kind: bpe, vocab_size: 512}}
  checks: {{min_documents: 20, min_tokens: 2000}}
train: {{lr: {lr}, warmup_steps: 2, max_steps: 12, micro_batch_size: {micro}, grad_accum_steps: {accum},
        log_interval: 1, eval_interval: 1000, eval_batches: 2, checkpoint_interval: 4, keep_last: 3,
        max_restarts: 0, grad_clip: 0.0}}
parallel: {parallel}
resource: {{cpu_processes: {procs}, time_limit_minutes: 10}}
"""
FSDP2 = {"parallel": "{dp: 2, fsdp: true}", "procs": 2, "micro": 2, "accum": 1}
ONE = {"parallel": "{dp: 1}", "procs": 1, "micro": 2, "accum": 2}
TP2 = {"parallel": "{dp: 1, tp: 2}", "procs": 2, "micro": 2, "accum": 2}


def write_spec(repo: Path, layout: dict[str, Any], name: str = "cont", lr: float = 0.003) -> Path:
    path = repo / "experiments" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SPEC.format(name=name, lr=lr, **layout))
    return path


def scratch_repo(root: Path) -> Path:
    (root / "data" / "demo").mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    for name in ("code", "docs"):
        (root / "data" / "demo" / f"{name}.jsonl").touch()
    return root
