"""Inputs people have (issue 18): a directory path, compressed JSON Lines, Parquet directories,
a Hugging Face `datasets` folder written by `save_to_disk`, and one clear line for each bad case."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from basics.errors import DataError
from pipelines.dataprep.sources import jsonl_boundaries, read_documents, resolve_files
from tests.infra.data_helpers import prose, write_jsonl
from validation.spec import DataSource

TEXTS = [prose(i) for i in range(12)]


def _read(repo: Path, path: str, **kw) -> list[str]:
    source = DataSource(name="src", path=path, weight=1.0, **kw)
    return [doc for f in resolve_files(source, repo) for doc in read_documents(source, f)]


def _lines(texts: list[str]) -> bytes:
    return "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()


def test_directory_means_every_data_file_under_it(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "data/mine/parquet_dir"
    (folder / "sub").mkdir(parents=True)
    pq.write_table(pa.table({"text": TEXTS[:6]}), folder / "a.parquet")
    pq.write_table(pa.table({"text": TEXTS[6:]}), folder / "sub/b.parquet")
    (folder / "_SUCCESS").write_text("")
    (folder / ".hidden.parquet").write_text("not data")
    assert _read(tmp_path, "data/mine/parquet_dir") == TEXTS


def test_gzip_and_zstd_json_lines(tmp_path: Path) -> None:
    import zstandard

    (tmp_path / "data").mkdir()
    (tmp_path / "data/a.jsonl.gz").write_bytes(gzip.compress(_lines(TEXTS[:6])))
    (tmp_path / "data/b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(_lines(TEXTS[6:])))
    assert _read(tmp_path, "data") == TEXTS
    (tmp_path / "data/bad.jsonl.gz").write_bytes(b"this is not gzip")
    with pytest.raises(DataError, match=r"cannot read .*bad.jsonl.gz \(is it a valid gzip file\?\)"):
        _read(tmp_path, "data/bad.jsonl.gz")


def test_datasets_save_to_disk_folder(tmp_path: Path) -> None:
    import pyarrow as pa

    folder = tmp_path / "data/hf"
    folder.mkdir(parents=True)
    table = pa.table({"text": TEXTS, "id": list(range(len(TEXTS)))})
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    (folder / "dataset_info.json").write_text("{}")
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    assert _read(tmp_path, "data/hf") == TEXTS
    with pytest.raises(DataError, match="has no column 'body'"):
        _read(tmp_path, "data/hf", text_field="body")


def test_empty_directory_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "data/none").mkdir(parents=True)
    with pytest.raises(DataError, match="the directory 'data/none' holds no data file"):
        _read(tmp_path, "data/none")


def test_byte_ranges_cover_every_line_once(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "data/r.jsonl", [prose(i, words=i % 40 + 1) for i in range(300)])
    source = DataSource(name="src", path="data/r.jsonl", weight=1.0)
    whole = list(read_documents(source, path))
    for task_bytes in (1, 100, 777, 5000, 1 << 30):
        cuts = jsonl_boundaries(path, task_bytes)
        assert cuts[0] == 0 and cuts[-1] == path.stat().st_size and cuts == sorted(set(cuts))
        parts = [d for a, b in zip(cuts[:-1], cuts[1:], strict=True) for d in read_documents(source, path, a, b)]
        assert parts == whole, task_bytes
