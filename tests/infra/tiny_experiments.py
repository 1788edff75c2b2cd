"""The tiny experiment files the end-to-end flows train: `BASE` (tiny-base: a 32-wide llama,
8 steps on two demo sources, one CPU process) and `CANDIDATE`, a template that extends
tiny-base.yaml with another peak learning rate (`CANDIDATE.format(name=..., lr=...)`)."""

from __future__ import annotations

BASE = """\
name: tiny-base
owner: ml-platform
hypothesis:
  statement: The tiny reference configuration trains to a finite held-out loss on the demo mixture.
  metric: eval/loss
  direction: decrease
  min_effect: 0.01
  baseline: champion
model: {model_type: llama, hidden_size: 32, num_layers: 2, num_heads: 2, vocab_size: 512,
        max_position_embeddings: 64}
data:
  sources:
    - {name: code, path: data/demo/code.jsonl, weight: 0.5}
    - {name: docs, path: data/demo/docs.jsonl, weight: 0.5}
  seq_len: 32
  tokenizer: {kind: bpe, vocab_size: 512}
  checks: {min_documents: 20, min_tokens: 2000}
train: {lr: 0.003, warmup_steps: 2, max_steps: 8, micro_batch_size: 4, log_interval: 2,
        eval_interval: 4, eval_batches: 2, checkpoint_interval: 4, keep_last: 1}
resource: {cpu_processes: 1, time_limit_minutes: 10}
"""

CANDIDATE = """\
name: {name}
owner: ml-platform
extends: tiny-base.yaml
hypothesis:
  statement: A higher peak learning rate lowers the held-out loss of the tiny model within the same budget.
  metric: eval/loss
  direction: decrease
  min_effect: 0.01
  baseline: tiny-base
train: {{lr: {lr}}}
"""
