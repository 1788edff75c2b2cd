"""What a preparation reads, known before it runs: the data version, and the size and time estimate.

The version is a content hash of everything that determines the output: each input
file's bytes (sha256; never timestamps), the preparation parameters and the tokenizer
(its spec, or the sha256 of a local `tokenizer.json`). Mixture weights and `seq_len`
are not in it: they only change how prepared data is sampled, so experiments that
re-weight the same sources share one preparation. Re-hashing unchanged inputs is avoided
with a side file keyed by (path, size, mtime) that caches each file's sha256 (the version
itself stays content-based: a touched but unchanged file still maps to the same version).

The estimate (`pipeline plan`, `pipeline data plan`) reads file sizes only: no hashing, no reading.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

from basics.errors import DataError
from basics.files import atomic_write_json, sha256_file
from basics.paths import data_roots
from pipelines.dataprep.sources import file_format, resolve_files, splittable
from validation.spec import DataSpec

# Bump when the on-disk layout or the cleaning changes: old caches then get new versions.
PREP_FORMAT = 3  # 3: one token shard per input task (sources/<name>/<split>/<task>.tokens.bin)
# Text the BPE is trained on at most (documents in hash order, train split only).
# Training on more barely changes a 4k-32k vocabulary and costs seconds per MB.
BPE_SAMPLE_CHARS = 8_000_000
SPECIAL_TOKENS = ("<|endoftext|>",)
_INPUT_HASHES = ".input-hashes.json"


# --------------------------------------------------------------------------- version


def _input_sha256(paths: list[Path], cache_file: Path) -> dict[Path, str]:
    """sha256 of each file, reusing cached hashes when (size, mtime_ns) are unchanged."""
    try:
        known = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        known = {}
    out: dict[Path, str] = {}
    changed = False
    for path in paths:
        st = path.stat()
        key = str(path.resolve())
        entry = known.get(key)
        if entry and entry[0] == st.st_size and entry[1] == st.st_mtime_ns:
            out[path] = entry[2]
        else:
            out[path] = sha256_file(path)
            known[key] = [st.st_size, st.st_mtime_ns, out[path]]
            changed = True
    if changed:
        with contextlib.suppress(OSError):  # a cache of hashes: losing it only costs time
            atomic_write_json(cache_file, known, indent=None)
    return out


def _local_tokenizer_file(data: DataSpec, repo_root: Path) -> Path | None:
    if data.tokenizer.kind != "local":
        return None
    if not data.tokenizer.path:
        raise DataError("data.tokenizer: kind 'local' needs a path to a directory with tokenizer.json")
    base = Path(data.tokenizer.path)
    base = base if base.is_absolute() else repo_root / base
    path = base / "tokenizer.json" if base.is_dir() or base.suffix != ".json" else base
    if not path.is_file():
        raise DataError(f"data.tokenizer: no tokenizer.json at {path}")
    if not any(path.resolve().is_relative_to(root) for root in data_roots(repo_root)):
        raise DataError(f"data.tokenizer: {path} is outside the data roots; move it under data/")
    return path


@dataclass(frozen=True)
class VersionInputs:
    """What the data version is computed from; kept in prep.json for people to read."""

    version: str
    payload: dict[str, Any]
    files: dict[str, list[Path]]
    tokenizer_file: Path | None
    input_bytes: int


def compute_version(data: DataSpec, repo_root: Path, cache_root: Path) -> VersionInputs:
    repo_root = Path(repo_root).resolve()
    files = {s.name: resolve_files(s, repo_root) for s in data.sources}
    all_files = list(chain.from_iterable(files.values()))
    tok_file = _local_tokenizer_file(data, repo_root)
    cache_root.mkdir(parents=True, exist_ok=True)
    hashes = _input_sha256(all_files + ([tok_file] if tok_file else []), cache_root / _INPUT_HASHES)
    tokenizer: dict[str, Any] = {"kind": data.tokenizer.kind}
    if tok_file:
        tokenizer["sha256"] = hashes[tok_file]
    else:
        tokenizer.update(vocab_size=data.tokenizer.vocab_size, sample_chars=BPE_SAMPLE_CHARS,
                         special_tokens=list(SPECIAL_TOKENS))
    payload = {
        "format": PREP_FORMAT,
        "min_doc_chars": data.min_doc_chars,
        "eval_fraction": data.eval_fraction,
        "task_bytes": data.task_bytes,
        "near_dedup": data.near_dedup,
        "tokenizer": tokenizer,
        "sources": [
            {
                "name": s.name,
                "text_field": s.text_field,
                "files": [[file_format(s, p), hashes[p]] for p in files[s.name]],
            }
            for s in data.sources
        ],
    }
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    version = hashlib.sha256(canonical.encode()).hexdigest()[:16]
    size = sum(p.stat().st_size for p in all_files)
    return VersionInputs(version, payload, files, tok_file, size)


# --------------------------------------------------------------------------- estimate

# Input MB per second per worker of a whole preparation (scan + dedup + byte-level BPE tokenize),
# measured by bench/bench_data_scale.py on the 2-core development machine (see bench/RESULTS.md).
PREPARE_MB_PER_WORKER_S = 0.75
BPE_TRAIN_S = 20.0  # training the BPE on its 8 M-char sample


def estimate_preparation(data: DataSpec, repo_root: Path, workers: int | None = None) -> dict[str, Any]:
    """Input size, task count and an estimated preparation time from file sizes alone (no hashing,
    no reading): what `pipeline data plan` shows before anything runs."""
    repo_root = Path(repo_root).resolve()
    size = tasks = 0
    for source in data.sources:
        for path in resolve_files(source, repo_root):
            n = path.stat().st_size
            size += n
            tasks += max(1, -(-n // data.task_bytes)) if splittable(source, path) else 1
    workers = max(1, workers or os.cpu_count() or 1)
    parallel = max(1, min(workers, tasks))
    seconds = size / 1e6 / (PREPARE_MB_PER_WORKER_S * parallel)
    seconds += BPE_TRAIN_S if data.tokenizer.kind == "bpe" else 0.0
    return {"input_bytes": size, "tasks": tasks, "workers": parallel, "estimated_seconds": round(seconds, 1)}
