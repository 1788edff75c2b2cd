"""Reading sources: formats, and every way a user's file can be wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from basics.errors import DataError
from pipelines.dataprep.sources import read_documents, resolve_files
from tests.infra.data_helpers import write_jsonl
from validation.spec import DataSource


def _source(path: str, **kw) -> DataSource:
    return DataSource(name="src", path=path, weight=1.0, **kw)


def _read(repo: Path, path: str, **kw) -> list[str]:
    source = _source(path, **kw)
    return [doc for f in resolve_files(source, repo) for doc in read_documents(source, f)]


def test_jsonl_text_and_parquet_are_read_in_order(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_jsonl(tmp_path / "data/a.jsonl", ["first doc", "second doc"])
    write_jsonl(tmp_path / "data/b.jsonl", ["third"], field="body")
    (tmp_path / "data/c.txt").write_text("para one\nline two\n\n\npara two\n", encoding="utf-8")
    pq.write_table(pa.table({"text": ["pq one", "pq two"], "n": [1, 2]}), tmp_path / "data/d.parquet")
    assert _read(tmp_path, "data/a.jsonl") == ["first doc", "second doc"]
    assert _read(tmp_path, "data/b.jsonl", text_field="body") == ["third"]
    assert _read(tmp_path, "data/c.txt") == ["para one\nline two\n", "para two\n"]
    assert _read(tmp_path, "data/d.parquet") == ["pq one", "pq two"]


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("bin.txt", b"abc\x00\x01\x02def", "binary"),
        ("latin.txt", "caf\u00e9 au lait\n".encode("latin-1"), "not valid UTF-8"),
        ("bad.jsonl", b'{"text": "ok"}\n{not json}\n', "bad.jsonl:2 is not valid JSON"),
        ("nofield.jsonl", b'{"body": "x"}\n', "has no field 'text'"),
        ("num.jsonl", b'{"text": 3}\n', "expected a string"),
        ("binary.jsonl", b'{"text": "a\x00b"}\n', "binary"),
        ("fake.parquet", b"this is not parquet at all", "not a readable Parquet file"),
    ],
)
def test_broken_files_raise_a_data_error_naming_source_and_path(tmp_path: Path, name: str, content: bytes,
                                                                  needle: str) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / name).write_bytes(content)
    with pytest.raises(DataError) as err:
        _read(tmp_path, f"data/{name}")
    message = str(err.value)
    assert needle in message
    assert "'src'" in message and name in message


def test_missing_file_empty_glob_and_outside_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data").mkdir()
    with pytest.raises(DataError, match="no file matches 'data/missing.jsonl'"):
        _read(tmp_path, "data/missing.jsonl")
    with pytest.raises(DataError, match="glob matches no file"):
        _read(tmp_path, "data/*.parquet")
    outside = tmp_path / "elsewhere"
    write_jsonl(outside / "x.jsonl", ["some text here"])
    with pytest.raises(DataError, match="outside the data roots"):
        _read(tmp_path, str(outside / "x.jsonl"))
    monkeypatch.setenv("PIPELINE_DATA_ROOTS", str(outside))
    assert _read(tmp_path, str(outside / "x.jsonl")) == ["some text here"]


def test_huge_single_line_is_read_whole(tmp_path: Path) -> None:
    huge = "word " * 2_000_000  # 10 MB on one line
    write_jsonl(tmp_path / "data/huge.jsonl", [huge, "small"])
    (tmp_path / "data/huge.txt").write_text(huge, encoding="utf-8")
    assert [len(d) for d in _read(tmp_path, "data/huge.jsonl")] == [len(huge), 5]
    assert [len(d) for d in _read(tmp_path, "data/huge.txt")] == [len(huge)]


def test_unreadable_file(tmp_path: Path) -> None:
    import os

    # An OSError while reading (here: the path is a directory) becomes a DataError naming it.
    (tmp_path / "data/folder.jsonl").mkdir(parents=True)
    with pytest.raises(DataError, match="'src': cannot read .*folder.jsonl"):
        list(read_documents(_source("data/folder.jsonl"), tmp_path / "data/folder.jsonl"))
    path = write_jsonl(tmp_path / "data/locked.jsonl", ["text"])
    path.chmod(0)
    try:
        if not os.access(path, os.R_OK):  # root reads anything: the permission case needs a normal user
            with pytest.raises(DataError, match="cannot read .*permission denied"):
                _read(tmp_path, "data/locked.jsonl")
    finally:
        path.chmod(0o644)
