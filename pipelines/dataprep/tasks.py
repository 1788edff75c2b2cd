"""The three kinds of preparation task, each a pure function of its inputs on disk.

    scan      (one per input range)  read, clean, drop empty/short, hash; write the cleaned text
                                     and a hash record per document, grouped by hash bucket
    dedup     (one per hash bucket)  sort the bucket's records of every scan task; the first
                                     occurrence (file order) of each text in a source is kept
    tokenize  (one per input range)  encode the kept documents in bounded batches; write the
                                     range's train/eval token shards and its statistics

Between dedup and tokenize the driver does a small merge (counts, the split rebalance of
tiny sources, the BPE sample and training: `pipelines.dataprep.prepare`). A task writes all
its output into a fresh directory and renames it into place as its last act, so a task
killed at any point leaves either nothing or its whole, correct output; rerunning it
writes the same bytes. datatrove's executors run these (locally or as a Slurm array) and
mark each finished task, so a rerun skips what is done.

Memory: a scan or tokenize task holds per-document metadata of its own range only (the
text is streamed to disk, then memory-mapped and encoded in batches of
`ENCODE_BATCH_CHARS`); a dedup task holds one bucket, 1/T of the corpus's 40-byte records.
Nothing grows with the corpus at a fixed `task_bytes`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from basics.environment import scoped_environ
from pipelines.dataprep.clean import clean_text, document_hash, non_ascii_count
from validation.spec import DataSource

ENCODE_BATCH_CHARS = 1_000_000
SAMPLE_SLACK_DOCS = 1  # a bucket offers one document beyond the BPE budget (a rebalance may remove one)

DOC_DTYPE = np.dtype([("end", "<u8"), ("h0", "<u8"), ("h1", "<u8"), ("chars", "<u8"), ("non_ascii", "<u8")])
REC_DTYPE = np.dtype([("h0", "<u8"), ("h1", "<u8"), ("task", "<u4"), ("idx", "<u4"), ("chars", "<u8")])
DUP_DTYPE = np.dtype([("task", "<u4"), ("idx", "<u4")])
BAND_DTYPE = np.dtype([("bh", "<u8"), ("band", "<u4"), ("task", "<u4"), ("idx", "<u4")])
EDGE_DTYPE = np.dtype([("task_a", "<u4"), ("idx_a", "<u4"), ("task_b", "<u4"), ("idx_b", "<u4")])

# MinHash LSH (near_dedup): 16 bands of 8 rows over word 5-gram shingles. A pair with Jaccard
# similarity s shares a band with probability 1 - (1 - s**8)**16: 0.5 at s = 0.70, 0.99 at s = 0.85.
MINHASH_BANDS, MINHASH_ROWS, SHINGLE_WORDS = 16, 8, 5
_MH_RNG = np.random.default_rng(0x6D696E68617368)
_MH_A = _MH_RNG.integers(1, 2**63, size=MINHASH_BANDS * MINHASH_ROWS, dtype=np.uint64) | np.uint64(1)
_MH_B = _MH_RNG.integers(0, 2**63, size=MINHASH_BANDS * MINHASH_ROWS, dtype=np.uint64)
_MH_MIX = _MH_RNG.integers(1, 2**63, size=max(MINHASH_ROWS, SHINGLE_WORDS), dtype=np.uint64) | np.uint64(1)


def minhash_bands(text: str) -> np.ndarray:
    """One 64-bit hash per LSH band of the document's MinHash signature (deterministic everywhere:
    crc32 of the words, multiply-shift permutations mod 2**64, no Python `hash`)."""
    import zlib

    words = np.array([zlib.crc32(w.encode("utf-8")) for w in text.split()] or [0], dtype=np.uint64)
    k = min(SHINGLE_WORDS, words.size)
    with np.errstate(over="ignore"):
        shingles = np.zeros(words.size - k + 1, dtype=np.uint64)
        for j in range(k):
            shingles = shingles + words[j:words.size - k + 1 + j] * _MH_MIX[j]
        signature = ((_MH_A[:, None] * shingles[None, :] + _MH_B[:, None]) >> np.uint64(32)).min(axis=1)
        rows = signature.reshape(MINHASH_BANDS, MINHASH_ROWS)
        bands: np.ndarray = (rows * _MH_MIX[None, :MINHASH_ROWS]).sum(axis=1, dtype=np.uint64)
    return bands


@dataclass(frozen=True)
class TaskInput:
    """One scan/tokenize task: a whole file, or the byte range [start, end) of a JSON Lines file."""

    source: int  # index of the source in the spec
    file: str
    start: int = 0
    end: int | None = None
    size: int = 0  # input bytes this task reads (for progress and ETA)


@dataclass(frozen=True)
class Plan:
    """Everything the tasks need, fixed before the first one runs (pickled into each task)."""

    build: str  # the build directory
    sources: list[DataSource]
    tasks: list[TaskInput]
    buckets: int
    min_doc_chars: int
    eval_threshold: int  # a document is held out when h0 < this (is_held_out on the first 8 hash bytes)
    sample_chars: int
    logs: str  # where task-starts.jsonl goes
    near_dedup: bool = False
    run: int = 1
    threads: int = 1  # tokenizer threads per task
    extra: dict[str, Any] = field(default_factory=dict)

    def task_dir(self, stage: str, rank: int) -> Path:
        return Path(self.build) / stage / "out" / f"{rank:05d}"


def bucket_of(h0: np.ndarray, buckets: int) -> np.ndarray:
    """Hash-range bucket: monotone in h0, so bucket order is hash order."""
    out: np.ndarray = ((h0 >> np.uint64(32)) * np.uint64(buckets)) >> np.uint64(32)
    return out


def _hash_words(digest: bytes) -> tuple[int, int]:
    return int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:16], "big")


class _Task:
    """A datatrove pipeline step: `step(data, rank, world_size)`; writes `out/<rank>` atomically."""

    stage = ""

    def __init__(self, plan: Plan):
        self.plan = plan

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.plan.tasks)} ranges, {self.plan.buckets} buckets)"

    def __call__(self, data: Any, rank: int, world_size: int) -> None:
        from basics.errors import DataError

        _quiet_datatrove()
        self._record_start(rank)
        final = self.plan.task_dir(self.stage, rank)
        tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            self.run(rank, tmp)
        except DataError as exc:  # the user's input: one line for the driver to show
            errors = Path(self.plan.build) / self.stage / "errors"
            errors.mkdir(parents=True, exist_ok=True)
            (errors / f"{rank:05d}.txt").write_text(str(exc))
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if final.exists():  # a killed earlier attempt renamed its output but was not marked complete
            shutil.rmtree(final)
        os.rename(tmp, final)

    def _record_start(self, rank: int) -> None:
        line = json.dumps({"stage": self.stage, "rank": rank, "run": self.plan.run, "pid": os.getpid(),
                           "t": round(time.time(), 3)}) + "\n"
        fd = os.open(Path(self.plan.logs) / "task-starts.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def run(self, rank: int, out: Path) -> None:
        raise NotImplementedError


class ScanTask(_Task):
    stage = "scan"

    def run(self, rank: int, out: Path) -> None:
        from pipelines.dataprep.sources import read_documents

        task = self.plan.tasks[rank]
        source = self.plan.sources[task.source]
        read = empty = 0
        meta: list[tuple[int, int, int, int, int]] = []
        bands: list[np.ndarray] = []
        end = 0
        with (out / "text.bin").open("wb") as text_file:
            for raw in read_documents(source, Path(task.file), task.start, task.end):
                read += 1
                text = clean_text(raw)
                if not text or len(text) < self.plan.min_doc_chars:
                    empty += 1
                    continue
                encoded = text.encode("utf-8")
                text_file.write(encoded)
                end += len(encoded)
                h0, h1 = _hash_words(document_hash(text))
                meta.append((end, h0, h1, len(text), non_ascii_count(text)))
                if self.plan.near_dedup:
                    bands.append(minhash_bands(text))
        docs = np.array(meta, dtype=DOC_DTYPE)
        np.save(out / "docs.npy", docs)
        records = np.empty(docs.size, dtype=REC_DTYPE)
        records["h0"], records["h1"], records["chars"] = docs["h0"], docs["h1"], docs["chars"]
        records["task"], records["idx"] = rank, np.arange(docs.size, dtype=np.uint32)
        bucket = bucket_of(docs["h0"], self.plan.buckets)
        order = np.argsort(bucket, kind="stable")
        np.save(out / "records.npy", records[order])
        np.save(out / "bucket_offsets.npy", np.searchsorted(bucket[order], np.arange(self.plan.buckets + 1)))
        if self.plan.near_dedup:
            band_rec = np.empty(docs.size * MINHASH_BANDS, dtype=BAND_DTYPE)
            if docs.size:
                band_rec["bh"] = np.concatenate(bands)
            band_rec["band"] = np.tile(np.arange(MINHASH_BANDS, dtype=np.uint32), docs.size)
            band_rec["task"] = rank
            band_rec["idx"] = np.repeat(np.arange(docs.size, dtype=np.uint32), MINHASH_BANDS)
            band_bucket = bucket_of(band_rec["bh"], self.plan.buckets)
            band_order = np.argsort(band_bucket, kind="stable")
            np.save(out / "bands.npy", band_rec[band_order])
            np.save(out / "band_offsets.npy", np.searchsorted(band_bucket[band_order],
                                                              np.arange(self.plan.buckets + 1)))
        (out / "counts.json").write_text(json.dumps({"read": read, "empty": empty}))


class DedupTask(_Task):
    stage = "dedup"

    def run(self, rank: int, out: Path) -> None:
        plan = self.plan
        parts = []
        for t in range(len(plan.tasks)):
            scan = plan.task_dir("scan", t)
            offsets = np.load(scan / "bucket_offsets.npy")
            if offsets[rank + 1] > offsets[rank]:
                parts.append(np.load(scan / "records.npy", mmap_mode="r")[offsets[rank]:offsets[rank + 1]])
        rec = np.concatenate(parts) if parts else np.empty(0, dtype=REC_DTYPE)
        src = np.array([task.source for task in plan.tasks], dtype=np.int64)[rec["task"]] if rec.size else \
            np.empty(0, dtype=np.int64)
        order = np.lexsort((rec["idx"], rec["task"], rec["h1"], rec["h0"], src))
        rec, src = rec[order], src[order]
        same = np.zeros(rec.size, dtype=bool)
        if rec.size > 1:
            same[1:] = (src[1:] == src[:-1]) & (rec["h0"][1:] == rec["h0"][:-1]) & (rec["h1"][1:] == rec["h1"][:-1])
        dups = np.empty(int(same.sum()), dtype=DUP_DTYPE)
        dups["task"], dups["idx"] = rec["task"][same], rec["idx"][same]
        dups = dups[np.lexsort((dups["idx"], dups["task"]))]
        np.save(out / "dups.npy", dups)
        np.save(out / "dup_offsets.npy", np.searchsorted(dups["task"], np.arange(len(plan.tasks) + 1)))
        kept, ksrc = rec[~same], src[~same]
        held = kept["h0"] < np.uint64(plan.eval_threshold)
        summary: dict[str, Any] = {}
        for s in range(len(plan.sources)):
            mine = ksrc == s
            train, ev = kept[mine & ~held], kept[mine & held]
            summary[str(s)] = {
                "duplicates": int((same & (src == s)).sum()),
                "train": int(train.size),
                "eval": int(ev.size),
                # sorted by (h0, h1): the first train record has the smallest hash, the last eval the largest
                "min_train": _rec_json(train[0]) if train.size else None,
                "max_eval": _rec_json(ev[-1]) if ev.size else None,
            }
        # BPE sample candidates: kept training documents of every source in hash order, up to the budget.
        train_all = kept[~held]
        train_all = train_all[np.lexsort((train_all["h1"], train_all["h0"]))]
        cum = np.cumsum(train_all["chars"].astype(np.int64))
        # near_dedup removes documents only after this merge: offer twice the budget then
        budget = plan.sample_chars * (2 if plan.near_dedup else 1)
        take = int(np.searchsorted(cum, budget, side="left")) + 1 + SAMPLE_SLACK_DOCS
        np.save(out / "sample.npy", train_all[:take])
        (out / "summary.json").write_text(json.dumps(summary))
        if plan.near_dedup:
            np.save(out / "near_edges.npy", self._near_edges(rank))

    def _near_edges(self, rank: int) -> np.ndarray:
        """Pairs (first, other) of documents of one source that share an LSH band hash."""
        plan = self.plan
        parts = []
        for t in range(len(plan.tasks)):
            scan = plan.task_dir("scan", t)
            offsets = np.load(scan / "band_offsets.npy")
            if offsets[rank + 1] > offsets[rank]:
                parts.append(np.load(scan / "bands.npy", mmap_mode="r")[offsets[rank]:offsets[rank + 1]])
        rec = np.concatenate(parts) if parts else np.empty(0, dtype=BAND_DTYPE)
        if rec.size < 2:
            return np.empty(0, dtype=EDGE_DTYPE)
        src = np.array([task.source for task in plan.tasks], dtype=np.int64)[rec["task"]]
        order = np.lexsort((rec["idx"], rec["task"], rec["bh"], rec["band"], src))
        rec, src = rec[order], src[order]
        new_group = np.ones(rec.size, dtype=bool)
        new_group[1:] = (src[1:] != src[:-1]) | (rec["band"][1:] != rec["band"][:-1]) | (rec["bh"][1:] != rec["bh"][:-1])
        first = np.maximum.accumulate(np.where(new_group, np.arange(rec.size), 0))
        member = ~new_group
        edges = np.empty(int(member.sum()), dtype=EDGE_DTYPE)
        edges["task_a"], edges["idx_a"] = rec["task"][first[member]], rec["idx"][first[member]]
        edges["task_b"], edges["idx_b"] = rec["task"][member], rec["idx"][member]
        return np.unique(edges)


def _rec_json(r: np.void) -> list[int]:
    return [int(r["h0"]), int(r["h1"]), int(r["task"]), int(r["idx"])]


class TokenizeTask(_Task):
    stage = "tokenize"

    def run(self, rank: int, out: Path) -> None:
        # In-process (one worker) this is the caller's process: leave its environment as it was.
        with scoped_environ(**_tokenizer_threads(self.plan.threads)):
            self._run(rank, out)
            release_free_heap()

    def _run(self, rank: int, out: Path) -> None:
        plan = self.plan
        tokenizer = load_tokenizer(plan.extra["tokenizer"])
        vocab_size = tokenizer.get_vocab_size()
        dtype = np.dtype(plan.extra["token_dtype"])
        scan = plan.task_dir("scan", rank)
        docs = np.load(scan / "docs.npy")
        keep = np.ones(docs.size, dtype=bool)
        for b in range(plan.buckets):
            dedup = plan.task_dir("dedup", b)
            offsets = np.load(dedup / "dup_offsets.npy")
            if offsets[rank + 1] > offsets[rank]:
                keep[np.load(dedup / "dups.npy", mmap_mode="r")[offsets[rank]:offsets[rank + 1]]["idx"]] = False
        near = Path(plan.build) / "near" / f"{rank:05d}.npy"
        if plan.near_dedup and near.is_file():
            keep[np.load(near)] = False
        held = docs["h0"] < np.uint64(plan.eval_threshold)
        for idx in plan.extra["flip"].get(str(rank), []):  # rebalanced tiny sources
            held[idx] = not held[idx]
        text = np.memmap(scan / "text.bin", dtype=np.uint8, mode="r") if docs.size and docs["end"][-1] else None
        starts = np.concatenate([[0], docs["end"][:-1]]).astype(np.int64) if docs.size else np.zeros(0, np.int64)
        counts = np.zeros(vocab_size, dtype=np.int64)
        stats: dict[str, Any] = {}
        for split, mask in (("train", keep & ~held), ("eval", keep & held)):
            chosen = np.flatnonzero(mask)
            lengths = np.zeros(chosen.size, dtype=np.int64)
            utf8 = 0
            if chosen.size:
                assert text is not None
                with (out / f"{split}.tokens.bin").open("wb") as tokens_file:
                    at = 0
                    while at < chosen.size:
                        stop, chars = at, 0
                        while stop < chosen.size and (stop == at or chars + int(docs["chars"][chosen[stop]])
                                                      <= ENCODE_BATCH_CHARS):
                            chars += int(docs["chars"][chosen[stop]])
                            stop += 1
                        batch = [bytes(text[starts[i]:docs["end"][i]]).decode("utf-8") for i in chosen[at:stop]]
                        utf8 += sum(int(docs["end"][i] - starts[i]) for i in chosen[at:stop])
                        ids, batch_lengths = encode_batch(tokenizer, batch, dtype)
                        lengths[at:stop] = batch_lengths
                        tokens_file.write(ids.tobytes())
                        if ids.size:
                            counts += np.bincount(ids, minlength=vocab_size)[:vocab_size]
                        at = stop
                np.save(out / f"{split}.index.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
            tok_values, tok_counts = np.unique(lengths, return_counts=True)
            chr_values, chr_counts = np.unique(docs["chars"][chosen].astype(np.int64), return_counts=True)
            stats[split] = {
                "documents": int(chosen.size),
                "tokens": int(lengths.sum()),
                "chars": int(docs["chars"][chosen].sum()),
                "non_ascii": int(docs["non_ascii"][chosen].sum()),
                "bytes": utf8,
                "doc_tokens_hist": [tok_values.tolist(), tok_counts.tolist()],
                "doc_chars_hist": [chr_values.tolist(), chr_counts.tolist()],
            }
        np.save(out / "token_counts.npy", counts)
        (out / "stats.json").write_text(json.dumps(stats))


_TOKENIZERS: dict[tuple[str, int, int], Any] = {}


def load_tokenizer(path: str) -> Any:
    """One `Tokenizer` per file per process, reused by every task the process runs.

    `tokenizers` keeps about 2 MB of anonymous memory of every `Tokenizer.from_file` after the
    object is gone (measured on the 6 GB bench's tokenizer: 8 loads +16 MB, climbing; one load
    reused: flat), and a datatrove worker runs tasks one after another, so a worker that loaded
    it per task grew with the corpus (~4 MB per 64 MiB task). Keyed by path, size and mtime."""
    from tokenizers import Tokenizer

    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if key not in _TOKENIZERS:
        _TOKENIZERS.clear()  # another version's tokenizer: the old one is not needed again
        _TOKENIZERS[key] = Tokenizer.from_file(path)
    return _TOKENIZERS[key]


def release_free_heap() -> None:
    """Give the C heap's free pages back to the OS after a task (glibc `malloc_trim`; a no-op
    elsewhere): a task's batches leave freed arenas a long-lived worker would otherwise keep
    (measured after one 6 MB task: 54 MiB anonymous memory without the trim, 36 MiB with it)."""
    import ctypes

    # The process's own symbol table (dlopen(NULL)) holds libc's: `ctypes.util.find_library`
    # would run `ldconfig -p` in a child process after every task to find the same library.
    try:
        libc = ctypes.CDLL(None)
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass


def encode_batch(tokenizer: Any, texts: list[str], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of `texts` back to back and each one's length (one `encode_batch_fast` call)."""
    from itertools import chain

    encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), dtype=dtype, count=int(lengths.sum()))
    return ids, lengths


def _tokenizer_threads(threads: int) -> dict[str, str]:
    """One worker per core gets one tokenizer thread; a lone worker gets every core (a thread
    count the environment already sets is kept)."""
    return {"TOKENIZERS_PARALLELISM": "true" if threads > 1 else "false",
            "RAYON_NUM_THREADS": os.environ.get("RAYON_NUM_THREADS", str(max(1, threads)))}


def _quiet_datatrove() -> None:
    """datatrove logs every task's INFO lines to stderr; keep them in its per-task log file only
    (the driver shows one progress bar and errors as one line)."""
    import datatrove.executor.base as base  # type: ignore[import-untyped]
    from datatrove.utils import logging as dt_logging  # type: ignore[import-untyped]

    if getattr(base, "_pipeline_quiet", False):
        return

    def add_task_logger(logging_dir: Any, rank: int, local_rank: int = 0, node_rank: int = -1) -> Any:
        dt_logging.logger.remove()
        logfile = logging_dir.open(f"logs/task_{rank:05d}.log", "w")
        dt_logging.logger.add(logfile, colorize=False, level="DEBUG")
        return logfile

    def close_task_logger(logfile: Any) -> None:
        dt_logging.logger.complete()
        dt_logging.logger.remove()
        logfile.close()

    base.add_task_logger = add_task_logger
    base.close_task_logger = close_task_logger
    base.log_pipeline = lambda pipeline: None
    dt_logging.logger.remove()
    base._pipeline_quiet = True
