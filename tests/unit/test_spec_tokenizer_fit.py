"""`pipeline validate` refuses a local tokenizer larger than the model's embedding, with the
file:line of `data.tokenizer.path`, reading tokenizer.json as JSON (no torch). Reproduced on
the old main: 4,096 tokens with `model.vocab_size: 2048` passed validate, prepare, the data
checks, smoke and doctor, then failed training four times."""

from __future__ import annotations

from pathlib import Path

from tests.infra.tokenizer_fit_repo import spec_file, write_tokenizer
from validation.loader import check_spec, tokenizer_file_vocab


def test_vocab_of_a_tokenizer_file_counts_added_tokens(tmp_path: Path):
    write_tokenizer(tmp_path, 4000, added=96)
    assert tokenizer_file_vocab(tmp_path / "tokenizer.json") == 4096
    assert tokenizer_file_vocab(tmp_path / "missing.json") is None


def test_a_local_tokenizer_larger_than_the_model_is_refused_at_its_line(tmp_path: Path):
    write_tokenizer(tmp_path / "data" / "tok", 4096)
    path = spec_file(tmp_path, 2048)
    spec, issues = check_spec(path, repo_root=tmp_path)
    assert spec is None
    (issue,) = [i for i in issues if i.field == "data.tokenizer.path"]
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "path: data/tok" in text)
    assert issue.line == line
    assert "4,096 tokens but model.vocab_size is 2,048" in issue.message


def test_a_local_tokenizer_that_fits_passes(tmp_path: Path):
    write_tokenizer(tmp_path / "data" / "tok", 2000)
    spec, issues = check_spec(spec_file(tmp_path, 2048), repo_root=tmp_path)
    assert issues == [] and spec is not None
