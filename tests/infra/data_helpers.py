"""Helpers shared by the data tests (tests/*/test_data_*.py; import as `tests.infra.data_helpers`).

Specs are built from a fully specified dict with `ExperimentSpec.model_validate`, so
these tests do not depend on the YAML loader; corpora are small slices of the demo
corpus (capped bytes per source) so every test stays quick.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from validation.spec import ExperimentSpec

SMALL_DEMO_BYTES = 60_000


def make_spec(sources: list[dict[str, Any]], name: str = "data-test", **data: Any) -> ExperimentSpec:
    spec = {
        "name": name,
        "owner": "tester",
        "hypothesis": {
            "statement": "A small mixture of demo sources trains a tiny model without surprises at all.",
            "metric": "eval/loss",
            "direction": "decrease",
            "min_effect": 0.01,
            "baseline": "base",
        },
        "model": {"model_type": "llama", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 512,
                  "max_position_embeddings": 256},
        "data": {"sources": sources, "seq_len": 64, "tokenizer": {"kind": "bpe", "vocab_size": 400},
                 "eval_fraction": 0.1, "checks": {"min_documents": 5, "min_tokens": 500}, **data},
        "train": {"max_steps": 20, "warmup_steps": 5, "micro_batch_size": 4, "grad_accum_steps": 2, "seed": 7},
    }
    return ExperimentSpec.model_validate(spec)


def demo_sources(weights: dict[str, float] | None = None, root: str = "data/demo") -> list[dict[str, Any]]:
    weights = weights or {"code": 0.5, "docs": 0.3, "reference": 0.2}
    return [{"name": n, "path": f"{root}/{n}.jsonl", "weight": w} for n, w in weights.items()]


def build_small_demo(repo: Path, max_bytes: int = SMALL_DEMO_BYTES) -> Path:
    """`repo/data/demo/`: a copy of the session's one build of the demo corpus at this cap."""
    from tests.infra.corpus import demo_corpus

    return demo_corpus(repo / "data" / "demo", max_bytes)


def write_jsonl(path: Path, texts: list[Any], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps({field: text}) + "\n")
    return path


def prose(i: int, words: int = 30) -> str:
    """A distinct, deterministic, English-like document."""
    vocab = ("the data model trains on tokens and every batch holds rows of documents that never attend "
             "across their boundaries while the loss falls slowly over many careful steps").split()
    return " ".join(vocab[(i * 7 + k * 3) % len(vocab)] for k in range(words)) + f" (document {i})."
