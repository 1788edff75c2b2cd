"""A scratch repository whose base experiment uses a local tokenizer of a chosen size beside a model
vocabulary of another (tests/*/test_spec_tokenizer_fit.py)."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def write_tokenizer(directory: Path, n: int, added: int = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    vocab = {f"t{i}": i for i in range(n)}
    body = {"version": "1.0", "model": {"type": "BPE", "vocab": vocab, "merges": []},
            "added_tokens": [{"id": n + i, "content": f"<s{i}>", "special": True} for i in range(added)]}
    (directory / "tokenizer.json").write_text(json.dumps(body))


def spec_file(repo: Path, model_vocab: int) -> Path:
    base = (REPO / "experiments" / "base.yaml").read_text()
    (repo / "experiments").mkdir(parents=True, exist_ok=True)
    text = base.replace("  vocab_size: 2048\n  max_position", f"  vocab_size: {model_vocab}\n  max_position")
    text = text.replace("    kind: bpe\n    vocab_size: 2048", "    kind: local\n    path: data/tok\n    vocab_size: 2048")
    path = repo / "experiments" / "base.yaml"
    path.write_text(text)
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    for name in ("code", "docs", "reference"):
        (repo / "data" / "demo").mkdir(parents=True, exist_ok=True)
        (repo / "data" / "demo" / f"{name}.jsonl").write_text('{"text": "x"}\n')
    return path
