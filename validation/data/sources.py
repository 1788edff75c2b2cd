"""Reading documents from a source's files: JSON Lines, plain text, Parquet.

Every problem a user can cause (no file matches, unreadable file, binary content,
invalid UTF-8 or JSON, a missing text field) becomes a `DataError` that names the
source and the file, with a line number where there is one. Files are read as bytes
and decoded strictly, so nothing is silently replaced; a single huge line is fine
(it is read whole, never truncated).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from pathlib import Path

from validation.errors import DataError
from validation.paths import data_roots
from validation.spec import DataSource

_BINARY_SNIFF_BYTES = 8192


def resolve_files(source: DataSource, repo_root: Path) -> list[Path]:
    """The files a source's glob matches, sorted, each checked to lie inside a data root."""
    pattern = source.path if os.path.isabs(source.path) else str(Path(repo_root) / source.path)
    matches = sorted(Path(p) for p in glob.glob(pattern, recursive=True))
    files = [p for p in matches if p.is_file()]
    if not files:
        what = "no file matches" if not glob.has_magic(source.path) else "the glob matches no file"
        hint = "; build the demo corpus with `pipeline data demo`" if source.path.startswith("data/demo/") else ""
        raise DataError(f"data source '{source.name}': {what} '{source.path}' (looked in {pattern}){hint}")
    roots = data_roots(repo_root)
    for path in files:
        real = path.resolve()
        if not any(real.is_relative_to(root) for root in roots):
            allowed = ", ".join(str(r) for r in roots)
            raise DataError(
                f"data source '{source.name}': {path} is outside the data roots ({allowed}); "
                "move it under data/ or add its directory to PIPELINE_DATA_ROOTS"
            )
        if not os.access(real, os.R_OK):
            raise DataError(f"data source '{source.name}': cannot read {path} (permission denied)")
    return files


def file_format(source: DataSource, path: Path) -> str:
    if source.format != "auto":
        return source.format
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    return "text"


def read_documents(source: DataSource, path: Path) -> Iterator[str]:
    """Yield the raw text of every document in one file, in file order."""
    fmt = file_format(source, path)
    try:
        if fmt == "parquet":
            yield from _read_parquet(source, path)
        elif fmt == "jsonl":
            yield from _read_jsonl(source, path)
        else:
            yield from _read_text(source, path)
    except OSError as exc:
        raise DataError(f"data source '{source.name}': cannot read {path}: {exc.strerror or exc}") from exc


def _decode(source: DataSource, path: Path, raw: bytes, line_no: int | None) -> str:
    where = f"{path}:{line_no}" if line_no else str(path)
    if b"\x00" in raw:
        raise DataError(f"data source '{source.name}': {where} looks binary (contains NUL bytes); expected text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"data source '{source.name}': {where} is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at "
            f"offset {exc.start}); re-encode the file as UTF-8"
        ) from exc


def _read_jsonl(source: DataSource, path: Path) -> Iterator[str]:
    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            line = _decode(source, path, raw, line_no)
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"data source '{source.name}': {path}:{line_no} is not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict) or source.text_field not in record:
                raise DataError(
                    f"data source '{source.name}': {path}:{line_no} has no field '{source.text_field}' "
                    "(set text_field in the source)"
                )
            text = record[source.text_field]
            if text is None:
                yield ""
                continue
            if not isinstance(text, str):
                raise DataError(
                    f"data source '{source.name}': {path}:{line_no} field '{source.text_field}' is "
                    f"{type(text).__name__}, expected a string"
                )
            yield text


def _read_text(source: DataSource, path: Path) -> Iterator[str]:
    """Plain text: documents are separated by one or more blank lines."""
    with path.open("rb") as handle:
        head = handle.read(_BINARY_SNIFF_BYTES)
        if b"\x00" in head:
            raise DataError(f"data source '{source.name}': {path} looks binary (contains NUL bytes); expected text")
        handle.seek(0)
        block: list[str] = []
        for line_no, raw in enumerate(handle, start=1):
            line = _decode(source, path, raw, line_no)
            if line.strip():
                block.append(line)
            elif block:
                yield "".join(block)
                block = []
        if block:
            yield "".join(block)


def _read_parquet(source: DataSource, path: Path) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowInvalid, pa.ArrowException) as exc:
        raise DataError(f"data source '{source.name}': {path} is not a readable Parquet file ({exc})") from exc
    if source.text_field not in parquet.schema_arrow.names:
        raise DataError(
            f"data source '{source.name}': {path} has no column '{source.text_field}' "
            f"(columns: {', '.join(parquet.schema_arrow.names)})"
        )
    column_type = parquet.schema_arrow.field(source.text_field).type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
        raise DataError(
            f"data source '{source.name}': {path} column '{source.text_field}' is {column_type}, expected string"
        )
    for batch in parquet.iter_batches(columns=[source.text_field], batch_size=4096):
        for text in batch.column(0).to_pylist():
            yield text or ""
