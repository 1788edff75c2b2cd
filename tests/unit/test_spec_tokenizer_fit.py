"""`pipeline validate` refuses a local tokenizer larger than the model's embedding, with the
file:line of `data.tokenizer.path`, reading tokenizer.json as JSON (no torch). Reproduced on
the old main: 4,096 tokens with `model.vocab_size: 2048` passed validate, prepare, the data
checks, smoke and doctor, then failed training four times."""

from __future__ import annotations

import json
from pathlib import Path

from validation.loader import check_spec, tokenizer_file_vocab

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


def test_vocab_of_a_tokenizer_file_counts_added_tokens(tmp_path: Path):
    _tokenizer(tmp_path, 4000, added=96)
    assert tokenizer_file_vocab(tmp_path / "tokenizer.json") == 4096
    assert tokenizer_file_vocab(tmp_path / "missing.json") is None


def test_a_local_tokenizer_larger_than_the_model_is_refused_at_its_line(tmp_path: Path):
    _tokenizer(tmp_path / "data" / "tok", 4096)
    path = _spec(tmp_path, 2048)
    spec, issues = check_spec(path, repo_root=tmp_path)
    assert spec is None
    (issue,) = [i for i in issues if i.field == "data.tokenizer.path"]
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "path: data/tok" in text)
    assert issue.line == line
    assert "4,096 tokens but model.vocab_size is 2,048" in issue.message


def test_a_local_tokenizer_that_fits_passes(tmp_path: Path):
    _tokenizer(tmp_path / "data" / "tok", 2000)
    spec, issues = check_spec(_spec(tmp_path, 2048), repo_root=tmp_path)
    assert issues == [] and spec is not None
