"""One-time, idempotent, versioned preparation: files -> cleaned, de-duplicated,
tokenized shards in `data/cache/<version>/`.

The version is a content hash of everything that determines the output: each input
file's bytes (sha256; never timestamps), the preparation parameters and the tokenizer
(its spec, or the sha256 of a local `tokenizer.json`). Mixture weights and `seq_len`
are not in it: they only change how prepared data is sampled, so experiments that
re-weight the same sources share one preparation.

The work is done in a temporary directory next to the cache and renamed into place
once `manifest.json` has been written, so a crash never leaves a directory that looks
complete. A cached version is used only after its manifest verifies; a corrupt one is
deleted and rebuilt. Re-hashing unchanged inputs is avoided with a side file keyed by
(path, size, mtime) that caches each file's sha256 (the version itself stays
content-based: a touched but unchanged file still maps to the same version).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from validation.data.clean import clean_text, document_hash, is_held_out, non_ascii_count
from validation.data.prepared import PreparedData, write_manifest
from validation.data.profile import length_summary, token_profile
from validation.data.sources import file_format, read_documents, resolve_files
from validation.errors import DataError
from validation.files import atomic_write_json, sha256_file
from validation.paths import data_roots
from validation.spec import DataSpec

log = logging.getLogger("validation.data")

# Bump when the on-disk layout or the cleaning changes: old caches then get new versions.
PREP_FORMAT = 2
# Text the BPE is trained on at most (documents in hash order, train split only).
# Training on more barely changes a 4k-32k vocabulary and costs seconds per MB.
BPE_SAMPLE_CHARS = 8_000_000
SPECIAL_TOKENS = ("<|endoftext|>",)
_ENCODE_BATCH_CHARS = 2_000_000
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


# --------------------------------------------------------------------------- entry point


def prepare_data(
    data: DataSpec,
    repo_root: Path,
    cache_root: Path | None = None,
    progress: bool = True,
) -> PreparedData:
    """Prepare (or reuse) the data version of `data`; idempotent, safe to call from several processes."""
    repo_root = Path(repo_root).resolve()
    cache_root = Path(cache_root).resolve() if cache_root else repo_root / "data" / "cache"
    inputs = compute_version(data, repo_root, cache_root)
    final = cache_root / inputs.version
    cached = _open_if_valid(final)
    if cached:
        return cached
    with _exclusive(cache_root / f".{inputs.version}.lock"):
        cached = _open_if_valid(final)  # another process may have finished meanwhile
        if cached:
            return cached
        check_free_space(cache_root, needed=2 * inputs.input_bytes + (64 << 20))
        tmp = cache_root / f".tmp-{inputs.version}-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir(parents=True)
        try:
            _build(data, inputs, tmp, progress)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    prepared = PreparedData.open(final)
    return prepared


def _open_if_valid(final: Path) -> PreparedData | None:
    if not final.exists():
        return None
    try:
        prepared = PreparedData.open(final)
    except (DataError, OSError, ValueError, KeyError) as exc:
        log.warning("discarding cached data %s: %s; rebuilding", final.name, exc)
        trash = final.with_name(f".corrupt-{final.name}-{secrets.token_hex(4)}")
        with contextlib.suppress(OSError):
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        return None
    prepared.cache_hit = True
    return prepared


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check_free_space(directory: Path, needed: int) -> None:
    """Refuse to start writing when the cache's file system cannot hold the result."""
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise DataError(
            f"not enough disk space in {directory}: about {needed / 1e6:.0f} MB needed, "
            f"{free / 1e6:.0f} MB free; free space or point the cache elsewhere"
        )


# --------------------------------------------------------------------------- build


@dataclass
class _SourceDocs:
    name: str
    read: int = 0
    empty: int = 0
    duplicates: int = 0
    chars: int = 0
    non_ascii: int = 0
    texts: dict[str, list[str]] = field(default_factory=lambda: {"train": [], "eval": []})
    digests: dict[str, list[bytes]] = field(default_factory=lambda: {"train": [], "eval": []})


def _collect(data: DataSpec, inputs: VersionInputs, bar: _Bar) -> list[_SourceDocs]:
    collected = []
    for source in data.sources:
        docs = _SourceDocs(source.name)
        seen: set[bytes] = set()
        for path in inputs.files[source.name]:
            for raw in read_documents(source, path):
                docs.read += 1
                text = clean_text(raw)
                if not text or len(text) < data.min_doc_chars:
                    docs.empty += 1
                    continue
                digest = document_hash(text)
                if digest in seen:
                    docs.duplicates += 1
                    continue
                seen.add(digest)
                split = "eval" if is_held_out(digest, data.eval_fraction) else "train"
                docs.texts[split].append(text)
                docs.digests[split].append(digest)
                docs.chars += len(text)
                docs.non_ascii += non_ascii_count(text)
            bar.advance(path.stat().st_size)
        kept = len(docs.texts["train"]) + len(docs.texts["eval"])
        if docs.read == 0:
            raise DataError(f"data source '{source.name}' is empty: its files hold no documents ({source.path})")
        if kept == 0:
            raise DataError(
                f"data source '{source.name}': no documents left after cleaning ({docs.read} read, "
                f"{docs.empty} empty or shorter than {data.min_doc_chars} chars, {docs.duplicates} duplicates)"
            )
        _rebalance_split(docs)
        collected.append(docs)
    return collected


def _rebalance_split(docs: _SourceDocs) -> None:
    """Keep both splits non-empty when there are two or more documents (still decided by hash)."""
    train, held = docs.digests["train"], docs.digests["eval"]
    if len(train) + len(held) < 2:
        if held:  # a single document is for training
            docs.texts["train"], docs.digests["train"] = docs.texts["eval"], held
            docs.texts["eval"], docs.digests["eval"] = [], []
        return
    if not held:
        move, src, dst = min(range(len(train)), key=train.__getitem__), "train", "eval"
    elif not train:
        move, src, dst = max(range(len(held)), key=held.__getitem__), "eval", "train"
    else:
        return
    docs.texts[dst].append(docs.texts[src].pop(move))
    docs.digests[dst].append(docs.digests[src].pop(move))


def _bpe_sample(collected: list[_SourceDocs]) -> list[str]:
    """Train-split documents of every source in hash order, up to BPE_SAMPLE_CHARS."""
    ordered = sorted(
        ((d, t) for docs in collected for d, t in zip(docs.digests["train"], docs.texts["train"], strict=True)),
        key=lambda pair: pair[0],
    )
    sample, total = [], 0
    for _, text in ordered:
        if total >= BPE_SAMPLE_CHARS:
            break
        sample.append(text)
        total += len(text)
    return sample


def _train_tokenizer(sample: list[str], vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(sample, trainer=trainer, length=len(sample))
    return tokenizer


@contextlib.contextmanager
def parallel_tokenizers() -> Iterator[None]:
    """Let `tokenizers` use every core for this block (the CLI disables it process-wide
    so that forked workers elsewhere do not deadlock or warn)."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def encode_documents(tokenizer: Any, texts: list[str], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of `texts` back to back, and each document's length; batched across cores."""
    parts: list[np.ndarray] = []
    lengths: list[int] = []
    start = 0
    while start < len(texts):
        end, chars = start, 0
        while end < len(texts) and (end == start or chars + len(texts[end]) <= _ENCODE_BATCH_CHARS):
            chars += len(texts[end])
            end += 1
        encodings = tokenizer.encode_batch_fast(texts[start:end], add_special_tokens=False)
        batch_lengths = [len(e.ids) for e in encodings]
        parts.append(np.fromiter(chain.from_iterable(e.ids for e in encodings), dtype=dtype, count=sum(batch_lengths)))
        lengths.extend(batch_lengths)
        start = end
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    return tokens, np.asarray(lengths, dtype=np.int64)


def _build(data: DataSpec, inputs: VersionInputs, out: Path, progress: bool) -> None:
    started = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        timings[name] = round(time.perf_counter() - started - sum(timings.values()), 3)

    with _Bar(progress) as bar:
        bar.start("reading and cleaning", inputs.input_bytes)
        collected = _collect(data, inputs, bar)
        lap("read_clean_dedup")
        (out / "tokenizer").mkdir()
        tokenizer_file = out / "tokenizer" / "tokenizer.json"
        with parallel_tokenizers():
            if inputs.tokenizer_file:
                from tokenizers import Tokenizer

                shutil.copyfile(inputs.tokenizer_file, tokenizer_file)
                try:
                    tokenizer = Tokenizer.from_file(str(tokenizer_file))
                except Exception as exc:  # the library raises plain Exception for a bad file
                    raise DataError(f"data.tokenizer: {inputs.tokenizer_file} is not a valid tokenizer.json ({exc})") from exc
            else:
                bar.start(f"training BPE tokenizer (vocab {data.tokenizer.vocab_size})", None)
                tokenizer = _train_tokenizer(_bpe_sample(collected), data.tokenizer.vocab_size)
                tokenizer.save(str(tokenizer_file))
            lap("tokenizer")
            vocab_size = tokenizer.get_vocab_size()
            dtype = np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
            vocab = [tokenizer.id_to_token(i) or "" for i in range(vocab_size)]
            bar.start("tokenizing", max(1, sum(d.chars for d in collected)))
            stats = {}
            for docs in collected:
                stats[docs.name] = _tokenize_source(docs, tokenizer, dtype, vocab, out, bar)
            lap("tokenize_write_stats")
    prep = {
        "version": inputs.version,
        "sources": [s.name for s in data.sources],
        "vocab_size": vocab_size,
        "token_dtype": dtype.name,
        "inputs": {
            name: [str(p) for p in paths] for name, paths in inputs.files.items()
        },
        "version_payload": inputs.payload,
        "prepare_seconds": timings,
    }
    (out / "prep.json").write_text(json.dumps(prep, indent=1, sort_keys=True) + "\n")
    (out / "stats.json").write_text(
        json.dumps({"version": inputs.version, "sources": stats}, indent=1, sort_keys=True) + "\n"
    )
    write_manifest(out, inputs.version)


def _tokenize_source(docs: _SourceDocs, tokenizer: Any, dtype: np.dtype, vocab: list[str],
                     out: Path, bar: _Bar) -> dict[str, Any]:
    base = out / "sources" / docs.name
    base.mkdir(parents=True)
    counts = np.zeros(len(vocab), dtype=np.int64)
    lengths_all, split_tokens, split_bytes = [], {}, {}
    for split in ("train", "eval"):
        texts = docs.texts[split]
        tokens, lengths = encode_documents(tokenizer, texts, dtype)
        bar.advance(sum(len(t) for t in texts))
        tokens.tofile(base / f"{split}.tokens.bin")
        np.save(base / f"{split}.index.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        if tokens.size:
            counts += np.bincount(tokens, minlength=len(vocab))[: len(vocab)]
        lengths_all.append(lengths)
        split_tokens[split] = int(tokens.size)
        split_bytes[split] = sum(len(t.encode("utf-8")) for t in texts)
    lengths = np.concatenate(lengths_all)
    char_lengths = np.fromiter((len(t) for t in chain(docs.texts["train"], docs.texts["eval"])), dtype=np.int64)
    kept = int(lengths.size)
    non_empty = docs.read - docs.empty
    bpt_split = "eval" if split_tokens["eval"] else "train"
    return {
        "documents": kept,
        "train_documents": len(docs.texts["train"]),
        "eval_documents": len(docs.texts["eval"]),
        "documents_read": docs.read,
        "empty_dropped": docs.empty,
        "duplicates_dropped": docs.duplicates,
        "empty_rate": round(docs.empty / docs.read, 6),
        "duplicate_rate": round(docs.duplicates / non_empty, 6) if non_empty else 0.0,
        "tokens": int(lengths.sum()),
        "train_tokens": split_tokens["train"],
        "eval_tokens": split_tokens["eval"],
        "chars": docs.chars,
        "bytes": split_bytes["train"] + split_bytes["eval"],
        "bytes_per_token": round(split_bytes[bpt_split] / max(1, split_tokens[bpt_split]), 6),
        "non_ascii_ratio": round(docs.non_ascii / max(1, docs.chars), 6),
        "doc_tokens": length_summary(lengths),
        "doc_chars": length_summary(char_lengths),
        "token_profile": token_profile(counts, vocab),
    }


class _Bar:
    """A rich progress bar on stderr for the long steps, or nothing."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> _Bar:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                console=Console(stderr=True), transient=True,
            )
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress:
            self._progress.__exit__(*exc)

    def start(self, description: str, total: int | None) -> None:
        if self._progress:
            if self._task is not None:
                self._progress.update(self._task, completed=self._progress.tasks[-1].total or 1)
            self._task = self._progress.add_task(description, total=total)

    def advance(self, amount: int) -> None:
        if self._progress and self._task is not None:
            self._progress.advance(self._task, amount)


