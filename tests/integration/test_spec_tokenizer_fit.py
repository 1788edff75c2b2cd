"""`pipeline validate`'s check of a local tokenizer against the model's embedding reads
tokenizer.json as JSON: no torch is imported (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _tokenizer(directory: Path, n: int, added: int = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    vocab = {f"t{i}": i for i in range(n)}
    body = {"version": "1.0", "model": {"type": "BPE", "vocab": vocab, "merges": []},
            "added_tokens": [{"id": n + i, "content": f"<s{i}>", "special": True} for i in range(added)]}
    (directory / "tokenizer.json").write_text(json.dumps(body))


def _spec(repo: Path, model_vocab: int) -> Path:
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


def test_the_check_imports_no_torch(tmp_path: Path):
    _tokenizer(tmp_path / "data" / "tok", 4096)
    path = _spec(tmp_path, 2048)
    code = (f"import sys; from validation.loader import check_spec; s, i = check_spec({str(path)!r}, "
            f"repo_root={str(tmp_path)!r}); assert i; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.strip() == "False"
