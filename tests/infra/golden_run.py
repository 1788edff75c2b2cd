"""The tiny deterministic CPU run whose per-step losses `tests/golden/losses_tiny.json` records.

Two seeded synthetic sources (identical bytes on every machine, unlike the interpreter's
standard library), a tiny llama spec (fp32, deterministic, 20 steps), and the losses read
back from the run's `metrics.jsonl`. tests/integration/test_trainer_golden.py compares them
with the recording; other tests reuse the corpus and spec as a small fixed training input.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
STEPS = 20

WORDS = {
    "prose": ("the model reads a line of text and learns which word comes next in the sentence while "
              "every batch holds rows from two sources mixed by weight so the loss falls slowly").split(),
    "code": ("def for in range return if else while import from class self value index list dict "
             "x y z i j k = + - * ( ) : [ ] 0 1 2").split(),
}


def write_corpus(root: Path) -> dict[str, Path]:
    """Two seeded synthetic sources (400 documents each): identical bytes on every machine."""
    rng = random.Random(1234)
    paths = {}
    root.mkdir(parents=True, exist_ok=True)
    for name, words in WORDS.items():
        path = root / f"{name}.jsonl"
        with open(path, "w", encoding="utf-8") as fh:
            for i in range(400):
                text = " ".join(rng.choice(words) for _ in range(rng.randint(30, 90)))
                fh.write(json.dumps({"id": f"{name}-{i}", "text": f"{name} {i}: {text}"}) + "\n")
        paths[name] = path
    return paths


def tiny_spec(corpus: dict[str, Path]) -> dict[str, Any]:
    return {
        "name": "golden-tiny",
        "owner": "ml-platform",
        "hypothesis": {
            "statement": "A tiny llama trained for twenty steps lowers its loss on the synthetic mixture.",
            "metric": "eval/loss", "direction": "decrease", "min_effect": 0.01, "baseline": "champion",
        },
        "model": {"model_type": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                  "intermediate_size": 64, "vocab_size": 320, "max_position_embeddings": 64},
        "data": {
            "sources": [{"name": "prose", "path": str(corpus["prose"]), "weight": 0.6},
                        {"name": "code", "path": str(corpus["code"]), "weight": 0.4}],
            "seq_len": 32, "tokenizer": {"vocab_size": 256},
        },
        "train": {"lr": 1e-2, "warmup_steps": 2, "max_steps": STEPS, "micro_batch_size": 4, "grad_accum_steps": 1,
                  "log_interval": 1, "eval_interval": 1000, "eval_batches": 1, "checkpoint_interval": 1000,
                  "keep_last": 1, "seed": 11, "precision": "fp32", "deterministic": True},
        "resource": {"cpu_processes": 1},
    }


def train_losses(run_dir: Path) -> dict[int, float]:
    """train/loss per step from metrics.jsonl (each (key, step) is recorded once)."""
    out: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        point = json.loads(line)
        if point["key"] == "train/loss":
            out[int(point["step"])] = float(point["value"])
    return out
