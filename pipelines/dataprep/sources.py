"""Reading documents from a source's files: JSON Lines (also `.gz` / `.zst`), plain text,
Parquet, and Arrow (a Hugging Face `datasets` folder written by `save_to_disk`).

A source's `path` is a glob or a directory (every data file under it, or the Arrow files a
`save_to_disk` folder lists in its `state.json`). A JSON Lines file is read in byte ranges
(`read_documents(..., start, end)`: the documents whose line starts in [start, end)), so one
big file is several preparation tasks; compressed, text, Parquet and Arrow files are read whole.

Every problem a user can cause (no file matches, unreadable file, binary content,
invalid UTF-8 or JSON, a missing text field) becomes a `DataError` that names the
source and the file, with a line number where there is one. Files are read as bytes
and decoded strictly, so nothing is silently replaced; a single huge line is fine
(it is read whole, never truncated).
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from basics.errors import DataError
from basics.paths import data_roots
from validation.spec import DataSource

_BINARY_SNIFF_BYTES = 8192
_COMPRESSED = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_DATA_SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet",
                  ".arrow": "arrow", ".txt": "text", ".md": "text", ".text": "text"}


def _directory_files(directory: Path, source: DataSource) -> list[Path]:
    """Every data file under a directory: the Arrow files of a `save_to_disk` folder, else the
    files with a known data suffix (any non-hidden file when the source names its format)."""
    state = directory / "state.json"
    if state.is_file() and (directory / "dataset_info.json").is_file():
        try:
            listed = [directory / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"data source '{source.name}': {state} is not a readable datasets state.json ({exc})") from exc
        return listed
    files = []
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).parts
        if not path.is_file() or any(part.startswith((".", "_")) for part in rel):
            continue
        if source.format != "auto" or _data_suffix(path) is not None:
            files.append(path)
    return files


def _data_suffix(path: Path) -> str | None:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in _COMPRESSED:
        suffixes = suffixes[:-1]
    return _DATA_SUFFIXES.get(suffixes[-1]) if suffixes else None


def compression(path: Path) -> str | None:
    """`gzip`, `zstd` or None, by the file's last suffix."""
    return _COMPRESSED.get(path.suffix.lower())


def resolve_files(source: DataSource, repo_root: Path) -> list[Path]:
    """The files a source's glob matches, sorted, each checked to lie inside a data root."""
    pattern = source.path if os.path.isabs(source.path) else str(Path(repo_root) / source.path)
    if Path(pattern).is_dir():
        files = _directory_files(Path(pattern), source)
        if not files:
            raise DataError(f"data source '{source.name}': the directory '{source.path}' holds no data file "
                            f"(.jsonl[.gz|.zst], .parquet, .arrow, .txt; looked in {pattern})")
    else:
        files = [p for p in sorted(Path(p) for p in glob.glob(pattern, recursive=True)) if p.is_file()]
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
    return _data_suffix(path) or "text"


def splittable(source: DataSource, path: Path) -> bool:
    """Whether a file can be read in byte ranges (uncompressed JSON Lines)."""
    return file_format(source, path) == "jsonl" and compression(path) is None


def read_documents(source: DataSource, path: Path, start: int = 0, end: int | None = None) -> Iterator[str]:
    """Yield the raw text of every document in one file (or one byte range of it), in file order."""
    fmt = file_format(source, path)
    assert (start, end) == (0, None) or splittable(source, path), (path, start, end)
    try:
        if fmt == "parquet":
            yield from _read_parquet(source, path)
        elif fmt == "arrow":
            yield from _read_arrow(source, path)
        elif fmt == "jsonl":
            yield from _read_jsonl(source, path, start, end)
        else:
            yield from _read_text(source, path)
    except (OSError, EOFError) as exc:
        what = f"a valid {compression(path)} file" if compression(path) else "readable"
        raise DataError(f"data source '{source.name}': cannot read {path} (is it {what}?): "
                        f"{getattr(exc, 'strerror', None) or exc}") from exc


def _open_binary(source: DataSource, path: Path) -> IO[bytes]:
    kind = compression(path)
    if kind == "gzip":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if kind == "zstd":
        import zstandard

        try:
            return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(path.open("rb")))
        except zstandard.ZstdError as exc:
            raise OSError(str(exc)) from exc
    return path.open("rb")


def jsonl_boundaries(path: Path, task_bytes: int) -> list[int]:
    """Byte offsets that cut an uncompressed JSON Lines file into ranges of about `task_bytes`,
    each at a line start; first 0, last the file size. A function of the bytes alone."""
    size = path.stat().st_size
    cuts = [0]
    with path.open("rb") as handle:
        at = task_bytes
        while at < size:
            handle.seek(at - 1)
            handle.readline()  # to the end of the line holding byte at-1: the next line starts after it
            pos = handle.tell()
            if pos >= size:
                break
            if pos > cuts[-1]:
                cuts.append(pos)
            at = max(pos, cuts[-1]) + task_bytes
    cuts.append(size)
    return cuts


def _line_number(path: Path, start: int, relative: int) -> int:
    """1-based line number in the whole file of line `relative` of the range starting at `start`
    (counted only when an error is reported)."""
    if start == 0:
        return relative
    newlines = 0
    with path.open("rb") as handle:
        remaining = start
        while remaining:
            chunk = handle.read(min(remaining, 1 << 20))
            if not chunk:
                break
            newlines += chunk.count(b"\n")
            remaining -= len(chunk)
    return newlines + relative


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


def _read_jsonl(source: DataSource, path: Path, start: int = 0, end: int | None = None) -> Iterator[str]:
    with _open_binary(source, path) as handle:
        if start:
            handle.seek(start)
        at = start
        for rel_no, raw in enumerate(handle, start=1):
            if end is not None and at >= end:
                break
            at += len(raw)
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8") if b"\x00" not in raw else None
            except UnicodeDecodeError:
                line = None
            if line is None:
                line = _decode(source, path, raw, _line_number(path, start, rel_no))  # raises, naming the line
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                line_no = _line_number(path, start, rel_no)
                raise DataError(f"data source '{source.name}': {path}:{line_no} is not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict) or source.text_field not in record:
                line_no = _line_number(path, start, rel_no)
                raise DataError(
                    f"data source '{source.name}': {path}:{line_no} has no field '{source.text_field}' "
                    "(set text_field in the source)"
                )
            text = record[source.text_field]
            if text is None:
                yield ""
                continue
            if not isinstance(text, str):
                line_no = _line_number(path, start, rel_no)
                raise DataError(
                    f"data source '{source.name}': {path}:{line_no} field '{source.text_field}' is "
                    f"{type(text).__name__}, expected a string"
                )
            yield text


def _read_text(source: DataSource, path: Path) -> Iterator[str]:
    """Plain text: documents are separated by one or more blank lines."""
    with _open_binary(source, path) as handle:
        head = handle.peek(_BINARY_SNIFF_BYTES)[:_BINARY_SNIFF_BYTES] if hasattr(handle, "peek") else b""
        if b"\x00" in head:
            raise DataError(f"data source '{source.name}': {path} looks binary (contains NUL bytes); expected text")
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


def _read_arrow(source: DataSource, path: Path) -> Iterator[str]:
    """An Arrow IPC file as `datasets.save_to_disk` writes it (stream format), batch by batch."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as mapped:
            try:
                reader = pa.ipc.open_stream(mapped)
            except pa.ArrowInvalid:
                mapped.seek(0)
                reader = pa.ipc.open_file(mapped)
            schema = reader.schema
            if source.text_field not in schema.names:
                raise DataError(f"data source '{source.name}': {path} has no column '{source.text_field}' "
                                f"(columns: {', '.join(schema.names)})")
            batches = reader if isinstance(reader, pa.ipc.RecordBatchStreamReader) else (
                reader.get_batch(i) for i in range(reader.num_record_batches))
            for batch in batches:
                for text in batch.column(schema.get_field_index(source.text_field)).to_pylist():
                    yield text or ""
    except (pa.ArrowInvalid, pa.ArrowException) as exc:
        raise DataError(f"data source '{source.name}': {path} is not a readable Arrow file ({exc})") from exc
