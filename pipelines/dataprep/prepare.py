"""One-time, idempotent, versioned preparation: files -> cleaned, de-duplicated,
tokenized shards in `data/cache/<version>/` (the version: `pipelines.dataprep.inputs`).

The work is a fixed set of tasks (`pipelines.dataprep.tasks`: scan and tokenize per input
range, dedup per hash bucket) run by datatrove's executors on local workers or as Slurm
array jobs (`pipelines.dataprep.executors`), with a small merge in this process between them.
Everything streams in bounded memory; the task list depends on the input and
`data.task_bytes` only, so the version and every output byte are the same for any number
of workers and for Slurm. Tasks write into `.build-<version>/` next to the cache, and a
rerun after a crash (even SIGKILL) skips the tasks datatrove marked complete. The result
is assembled in `.build-<version>/final` and renamed into place once `manifest.json` has
been written, so a crash never leaves a directory that looks complete. A cached version is used only after its manifest verifies; a corrupt one is
deleted and rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from basics.environment import scoped_environ
from basics.errors import DataError
from basics.files import atomic_write_json
from pipelines.dataprep.executors import SlurmOptions, run_stage
from pipelines.dataprep.inputs import BPE_SAMPLE_CHARS, SPECIAL_TOKENS, VersionInputs, compute_version
from pipelines.dataprep.sources import jsonl_boundaries, splittable
from pipelines.dataprep.tasks import (
    ENCODE_BATCH_CHARS,
    REC_DTYPE,
    DedupTask,
    Plan,
    ScanTask,
    TaskInput,
    TokenizeTask,
    encode_batch,
)
from validation.data.prepared import SPLITS, PreparedData, write_manifest
from validation.data.profile import histogram_summary, merge_histograms, token_profile
from validation.spec import DataSpec

log = logging.getLogger("pipelines.dataprep")

SMALL_INPUT_BYTES = 32 << 20  # below this, `workers=None` means one in-process worker


# --------------------------------------------------------------------------- entry point


def prepare_data(
    data: DataSpec,
    repo_root: Path,
    cache_root: Path | None = None,
    progress: bool = True,
    workers: int | None = None,
    launcher: str = "local",
    slurm: SlurmOptions | None = None,
    expected_digests: Mapping[str, str] | None = None,
) -> PreparedData:
    """Prepare (or reuse) the data version of `data`; idempotent, safe to call from several processes.

    `workers`: local processes (default: every core); `launcher="slurm"` submits each stage as
    a Slurm array job instead (`slurm` says how) and waits for it. A rerun after a crash resumes."""
    repo_root = Path(repo_root).resolve()
    if cache_root:
        cache_root = Path(cache_root).resolve()
    else:  # PIPELINE_DATA_CACHE (storage shared by the runners), else <repo>/data/cache
        from pipelines.rundir import data_cache_root

        cache_root = data_cache_root(repo_root)
    assert launcher in ("local", "slurm"), launcher
    inputs = compute_version(data, repo_root, cache_root)
    if workers is None:  # a pool costs seconds to start: small inputs are quicker in this process
        workers = 1 if inputs.input_bytes < SMALL_INPUT_BYTES else (os.cpu_count() or 1)
    workers = max(1, workers)
    final = cache_root / inputs.version
    expected = (expected_digests or {}).get(inputs.version)
    cached = _open_if_valid(final, expected)
    if cached:
        return cached
    with _exclusive(cache_root / f".{inputs.version}.lock"):
        build = cache_root / f".build-{inputs.version}"
        cached = _open_if_valid(final, expected)  # another process may have finished meanwhile
        if cached:
            shutil.rmtree(build, ignore_errors=True)  # left by a run killed between rename and clean-up
            return cached
        if not build.is_dir():
            check_free_space(cache_root, needed=2 * inputs.input_bytes + (64 << 20))
        build.mkdir(parents=True, exist_ok=True)
        logs = cache_root / ".logs" / inputs.version
        logs.mkdir(parents=True, exist_ok=True)
        try:
            done = _build(data, inputs, build, logs, workers, launcher, slurm, progress)
        except DataError:
            # The input's fault: nothing to resume (the same input fails the same way).
            shutil.rmtree(build, ignore_errors=True)
            raise
        os.rename(done, final)
        shutil.rmtree(build, ignore_errors=True)
    prepared = PreparedData.open(final)
    if expected and prepared.content_digest != expected:
        raise DataError(f"data version {inputs.version}: prepared content {prepared.content_digest[:16]} differs from "
                        f"the content attested for it ({expected[:16]}): the inputs or the preparation code changed "
                        "under the same version; not trained on")
    return prepared


def _open_if_valid(final: Path, expected: str | None = None) -> PreparedData | None:
    if not final.exists():
        return None
    try:
        prepared = PreparedData.open(final)
        if expected and prepared.content_digest != expected:
            raise DataError(f"content {prepared.content_digest[:16]} is not the content attested for this version "
                            f"({expected[:16]}): rewritten on the shared cache")
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


def encode_documents(tokenizer: Any, texts: list[str], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of `texts` back to back, and each document's length; batched across cores
    (the whole list in memory: for benches and small inputs; preparation streams)."""
    parts: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    start = 0
    while start < len(texts):
        end, chars = start, 0
        while end < len(texts) and (end == start or chars + len(texts[end]) <= ENCODE_BATCH_CHARS):
            chars += len(texts[end])
            end += 1
        ids, batch_lengths = encode_batch(tokenizer, texts[start:end], dtype)
        parts.append(ids)
        lengths.append(batch_lengths)
        start = end
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    return tokens, (np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64))


def plan_tasks(data: DataSpec, inputs: VersionInputs) -> list[TaskInput]:
    """The fixed task list: every file in spec order, an uncompressed JSON Lines file cut into
    byte ranges of about `data.task_bytes` at line starts. Depends on the bytes alone."""
    tasks = []
    for s, source in enumerate(data.sources):
        for path in inputs.files[source.name]:
            if splittable(source, path):
                cuts = jsonl_boundaries(path, data.task_bytes)
                tasks += [TaskInput(s, str(path), a, b, b - a) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
            else:
                tasks.append(TaskInput(s, str(path), 0, None, path.stat().st_size))
    return tasks


def _next_run(build: Path) -> int:
    counter = build / "runs"
    run = int(counter.read_text()) + 1 if counter.is_file() else 1
    counter.write_text(str(run))
    return run


def _build(data: DataSpec, inputs: VersionInputs, build: Path, logs: Path, workers: int, launcher: str,
           slurm: SlurmOptions | None, progress: bool) -> Path:
    """Run the tasks (resuming whatever an earlier, killed run finished) and assemble
    `build/final`, manifest last. Returns that directory."""
    started = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        timings[name] = round(time.perf_counter() - started - sum(timings.values()), 3)

    tasks = plan_tasks(data, inputs)
    cpus = os.cpu_count() or 1
    plan = Plan(
        build=str(build), sources=list(data.sources), tasks=tasks, buckets=max(1, len(tasks)),
        min_doc_chars=data.min_doc_chars, eval_threshold=_eval_threshold(data.eval_fraction),
        sample_chars=BPE_SAMPLE_CHARS, logs=str(logs), run=_next_run(build), near_dedup=data.near_dedup,
        threads=1 if launcher == "slurm" else max(1, cpus // max(1, min(workers, len(tasks)))),
    )
    log.info("data %s: %d tasks, %d dedup buckets, run %d", inputs.version, len(tasks), plan.buckets, plan.run)
    with _Bar(progress, build, tasks) as bar:
        bar.stage("scan")
        run_stage("scan", ScanTask(plan), len(tasks), build, workers, launcher, slurm, bar.tick)
        bar.stage("dedup")
        run_stage("dedup", DedupTask(plan), plan.buckets, build, workers, launcher, slurm, bar.tick)
        lap("scan_dedup")
        merged = _merge_counts(data, plan)
        final = build / "final"
        tokenizer_file = final / "tokenizer" / "tokenizer.json"
        if not tokenizer_file.is_file():  # deterministic, so a resumed run may keep the earlier one
            bar.stage(f"training BPE tokenizer (vocab {data.tokenizer.vocab_size})" if not inputs.tokenizer_file
                      else "tokenizer")
            _write_tokenizer(data, inputs, plan, merged, tokenizer_file)
        lap("tokenizer")
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        vocab_size = tokenizer.get_vocab_size()
        dtype = np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
        plan = replace(plan, extra={"tokenizer": str(tokenizer_file), "token_dtype": dtype.name,
                                    "flip": merged["flip"]})
        bar.stage("tokenize")
        run_stage("tokenize", TokenizeTask(plan), len(tasks), build, workers, launcher, slurm, bar.tick)
        lap("tokenize")
    vocab = [tokenizer.id_to_token(i) or "" for i in range(vocab_size)]
    shards, stats = _assemble(data, plan, merged, final, vocab)
    prep = {
        "version": inputs.version,
        "sources": [s.name for s in data.sources],
        "vocab_size": vocab_size,
        "token_dtype": dtype.name,
        "inputs": {name: [str(p) for p in paths] for name, paths in inputs.files.items()},
        "version_payload": inputs.payload,
        "tasks": len(tasks),
        "shards": shards,
    }
    (final / "prep.json").write_text(json.dumps(prep, indent=1, sort_keys=True) + "\n")
    (final / "stats.json").write_text(json.dumps({"version": inputs.version, "sources": stats}, indent=1,
                                                 sort_keys=True) + "\n")
    write_manifest(final, inputs.version)
    lap("assemble")
    # How long it took is about this run, not the data: kept beside the cache, outside the version.
    atomic_write_json(logs / "timings.json", {"run": plan.run, "workers": workers, "launcher": launcher,
                                              "seconds": timings, "tasks": len(tasks)}, indent=1)
    return final


def _eval_threshold(eval_fraction: float) -> int:
    """The smallest h0 that is not held out: `is_held_out` reads h0 / 2**64 < eval_fraction."""
    lo, hi = 0, 1 << 64
    while lo < hi:  # first h0 with h0 / 2**64 >= eval_fraction (float arithmetic, as is_held_out)
        mid = (lo + hi) // 2
        if mid / 2**64 < eval_fraction:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _merge_counts(data: DataSpec, plan: Plan) -> dict[str, Any]:
    """The small merge after dedup: per-source counts, rebalance of tiny sources, errors."""
    read = [0] * len(data.sources)
    empty = [0] * len(data.sources)
    for rank, task in enumerate(plan.tasks):
        counts = json.loads((plan.task_dir("scan", rank) / "counts.json").read_text())
        read[task.source] += counts["read"]
        empty[task.source] += counts["empty"]
    per: list[dict[str, Any]] = [{"duplicates": 0, "train": 0, "eval": 0, "min_train": None, "max_eval": None}
                                 for _ in data.sources]
    for b in range(plan.buckets):
        summary = json.loads((plan.task_dir("dedup", b) / "summary.json").read_text())
        for s, entry in summary.items():
            agg = per[int(s)]
            for key in ("duplicates", "train", "eval"):
                agg[key] += entry[key]
            if entry["min_train"] and (agg["min_train"] is None or entry["min_train"][:2] < agg["min_train"][:2]):
                agg["min_train"] = entry["min_train"]
            if entry["max_eval"] and (agg["max_eval"] is None or entry["max_eval"][:2] > agg["max_eval"][:2]):
                agg["max_eval"] = entry["max_eval"]
    near = _near_duplicates(plan) if plan.near_dedup else {}
    for near_task, idxs in near.items():
        docs = np.load(plan.task_dir("scan", near_task) / "docs.npy", mmap_mode="r")
        held = int((docs["h0"][idxs] < np.uint64(plan.eval_threshold)).sum())
        agg = per[plan.tasks[near_task].source]
        agg["near"] = agg.get("near", 0) + len(idxs)
        agg["eval"] -= held
        agg["train"] -= len(idxs) - held
        for key in ("min_train", "max_eval"):
            if agg[key] and agg[key][2] == near_task and agg[key][3] in set(idxs.tolist()):
                agg[f"recompute_{key}"] = True
    near_keys = {(t, int(i)) for t, idxs in near.items() for i in idxs}
    for s, agg in enumerate(per):
        if agg.pop("recompute_min_train", False) or agg.pop("recompute_max_eval", False):
            agg["min_train"], agg["max_eval"] = _extreme_kept(plan, s, near)
    flip: dict[str, list[int]] = {}
    moved: dict[str, set[tuple[int, int]]] = {"to_eval": set(), "to_train": set(), "near": near_keys}
    for s, source in enumerate(data.sources):
        agg = per[s]
        kept = agg["train"] + agg["eval"]
        if read[s] == 0:
            raise DataError(f"data source '{source.name}' is empty: its files hold no documents ({source.path})")
        if kept == 0:
            raise DataError(
                f"data source '{source.name}': no documents left after cleaning ({read[s]} read, "
                f"{empty[s]} empty or shorter than {data.min_doc_chars} chars, {agg['duplicates']} duplicates)"
            )
        # Keep both splits non-empty when there are two or more documents (still decided by hash);
        # a single document is for training.
        move = None
        if kept < 2:
            move = agg["max_eval"] if agg["eval"] else None
            direction = "to_train"
        elif not agg["eval"]:
            move, direction = agg["min_train"], "to_eval"
        elif not agg["train"]:
            move, direction = agg["max_eval"], "to_train"
        if move:
            flip.setdefault(str(move[2]), []).append(int(move[3]))
            moved[direction].add((int(move[2]), int(move[3])))
            delta = 1 if direction == "to_eval" else -1
            agg["eval"] += delta
            agg["train"] -= delta
    return {"read": read, "empty": empty, "per": per, "flip": flip, "moved": moved}


def _exact_duplicates(plan: Plan, task: int) -> np.ndarray:
    """Indexes of a scan task's documents that dedup found to be exact duplicates."""
    parts = []
    for b in range(plan.buckets):
        dedup = plan.task_dir("dedup", b)
        offsets = np.load(dedup / "dup_offsets.npy")
        parts.append(np.load(dedup / "dups.npy", mmap_mode="r")[offsets[task]:offsets[task + 1]]["idx"])
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def _near_duplicates(plan: Plan) -> dict[int, np.ndarray]:
    """Near duplicates to drop, per scan task: every document of an LSH cluster (union of the
    band-sharing pairs, within a source) but the first in file order. Written to build/near/."""
    edges = np.concatenate([np.load(plan.task_dir("dedup", b) / "near_edges.npy") for b in range(plan.buckets)])
    exact = np.concatenate([(np.uint64(t) << np.uint64(32)) | _exact_duplicates(plan, t).astype(np.uint64)
                            for t in range(len(plan.tasks))])
    a = (edges["task_a"].astype(np.uint64) << np.uint64(32)) | edges["idx_a"].astype(np.uint64)
    b = (edges["task_b"].astype(np.uint64) << np.uint64(32)) | edges["idx_b"].astype(np.uint64)
    live = ~(np.isin(a, exact) | np.isin(b, exact))  # an exact copy is already gone (same bands as its original)
    a, b = a[live], b[live]
    nodes, inverse = np.unique(np.concatenate([a, b]), return_inverse=True)
    parent = list(range(nodes.size))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in zip(inverse[: a.size].tolist(), inverse[a.size:].tolist(), strict=True):
        ri, rj = root(i), root(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)  # the smallest key (earliest document) is the root
    removed = np.array([k for k in range(nodes.size) if root(k) != k], dtype=np.int64)
    keys = nodes[removed] if removed.size else np.zeros(0, dtype=np.uint64)
    out: dict[int, np.ndarray] = {}
    folder = Path(plan.build) / "near"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    tasks = (keys >> np.uint64(32)).astype(np.int64)
    idxs = (keys & np.uint64(0xFFFFFFFF)).astype(np.int64)
    for task in np.unique(tasks).tolist():
        out[task] = np.sort(idxs[tasks == task])
        np.save(folder / f"{task:05d}.npy", out[task])
    return out


def _extreme_kept(plan: Plan, source: int, near: dict[int, np.ndarray]) -> tuple[list[int] | None, list[int] | None]:
    """(smallest-hash kept train document, largest-hash kept eval document) of a source, by scanning
    its tasks (needed only when near_dedup removed the one the dedup summary named)."""
    best_train: list[int] | None = None
    best_eval: list[int] | None = None
    for task, t in enumerate(plan.tasks):
        if t.source != source:
            continue
        docs = np.load(plan.task_dir("scan", task) / "docs.npy")
        keep = np.ones(docs.size, dtype=bool)
        keep[_exact_duplicates(plan, task)] = False
        keep[near.get(task, np.zeros(0, dtype=np.int64))] = False
        for i in np.flatnonzero(keep).tolist():
            rec = [int(docs["h0"][i]), int(docs["h1"][i]), task, i]
            if rec[0] < plan.eval_threshold:
                if best_eval is None or rec[:2] > best_eval[:2]:
                    best_eval = rec
            elif best_train is None or rec[:2] < best_train[:2]:
                best_train = rec
    return best_train, best_eval


def _bpe_sample(plan: Plan, merged: dict[str, Any]) -> list[str]:
    """Kept training documents of every source in hash order, up to BPE_SAMPLE_CHARS: the same
    sample for any number of tasks (each dedup bucket offers its smallest hashes)."""
    parts = [np.load(plan.task_dir("dedup", b) / "sample.npy") for b in range(plan.buckets)]
    candidates = np.concatenate(parts) if parts else np.empty(0, dtype=REC_DTYPE)
    extra = []
    for task, idx in sorted(merged["moved"]["to_train"]):
        doc = np.load(plan.task_dir("scan", task) / "docs.npy", mmap_mode="r")[idx]
        extra.append((doc["h0"], doc["h1"], task, idx, doc["chars"]))
    if extra:
        candidates = np.concatenate([candidates, np.array(extra, dtype=REC_DTYPE)])
    candidates = candidates[np.lexsort((candidates["h1"], candidates["h0"]))]
    chosen: dict[int, list[int]] = {}
    order: list[tuple[int, int]] = []
    total = 0
    for rec in candidates:
        if total >= BPE_SAMPLE_CHARS:
            break
        key = (int(rec["task"]), int(rec["idx"]))
        if key in merged["moved"]["to_eval"] or key in merged["moved"]["near"]:
            continue
        chosen.setdefault(key[0], []).append(key[1])
        order.append(key)
        total += int(rec["chars"])
    texts: dict[tuple[int, int], str] = {}
    for task, idxs in chosen.items():
        scan = plan.task_dir("scan", task)
        docs = np.load(scan / "docs.npy", mmap_mode="r")
        text = np.memmap(scan / "text.bin", dtype=np.uint8, mode="r")
        for i in idxs:
            start = int(docs["end"][i - 1]) if i else 0
            texts[(task, i)] = bytes(text[start:int(docs["end"][i])]).decode("utf-8")
    return [texts[key] for key in order]


def _write_tokenizer(data: DataSpec, inputs: VersionInputs, plan: Plan, merged: dict[str, Any],
                     tokenizer_file: Path) -> None:
    tokenizer_file.parent.mkdir(parents=True, exist_ok=True)
    # Outside `final/`: a run killed mid-write must not leave a stray file that the manifest would list.
    tmp = Path(plan.build) / f".tokenizer.json.tmp-{os.getpid()}"
    if inputs.tokenizer_file:
        from tokenizers import Tokenizer

        shutil.copyfile(inputs.tokenizer_file, tmp)
        try:
            Tokenizer.from_file(str(tmp))
        except Exception as exc:  # the library raises plain Exception for a bad file
            tmp.unlink()
            raise DataError(f"data.tokenizer: {inputs.tokenizer_file} is not a valid tokenizer.json ({exc})") from exc
    else:
        # Every core for the BPE (the CLI turns tokenizers' threads off process-wide, for forked workers).
        with scoped_environ(TOKENIZERS_PARALLELISM="true"):
            tokenizer = _train_tokenizer(_bpe_sample(plan, merged), data.tokenizer.vocab_size)
        tokenizer.save(str(tmp))
    os.replace(tmp, tokenizer_file)


def _assemble(data: DataSpec, plan: Plan, merged: dict[str, Any], final: Path,
              vocab: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Link every task's shards into `final/sources/<name>/<split>/` and merge the statistics.
    Hard links leave the tasks' outputs intact, so a run killed here redoes only this step."""
    shutil.rmtree(final / "sources", ignore_errors=True)
    shards: dict[str, Any] = {}
    stats: dict[str, Any] = {}
    for s, source in enumerate(data.sources):
        counts = np.zeros(len(vocab), dtype=np.int64)
        hists: dict[str, list[tuple[list[int], list[int]]]] = {"doc_tokens": [], "doc_chars": []}
        split_totals = {split: {"documents": 0, "tokens": 0, "chars": 0, "non_ascii": 0, "bytes": 0}
                        for split in SPLITS}
        shards[source.name] = {split: [] for split in SPLITS}
        for rank, task in enumerate(plan.tasks):
            if task.source != s:
                continue
            out = plan.task_dir("tokenize", rank)
            task_stats = json.loads((out / "stats.json").read_text())
            counts += np.load(out / "token_counts.npy")
            for split in SPLITS:
                st = task_stats[split]
                for key in split_totals[split]:
                    split_totals[split][key] += st[key]
                hists["doc_tokens"].append(st["doc_tokens_hist"])
                hists["doc_chars"].append(st["doc_chars_hist"])
                if st["documents"]:
                    folder = final / "sources" / source.name / split
                    folder.mkdir(parents=True, exist_ok=True)
                    for suffix in (".tokens.bin", ".index.npy"):
                        _link_or_copy(out / f"{split}{suffix}", folder / f"{rank:05d}{suffix}")
                    shards[source.name][split].append([f"{rank:05d}", st["tokens"], st["documents"]])
        tr, ev = split_totals["train"], split_totals["eval"]
        read, empty, dups = merged["read"][s], merged["empty"][s], merged["per"][s]["duplicates"]
        non_empty = read - empty
        chars = tr["chars"] + ev["chars"]
        bpt = ev if ev["tokens"] else tr
        stats[source.name] = {
            "documents": tr["documents"] + ev["documents"],
            "train_documents": tr["documents"],
            "eval_documents": ev["documents"],
            "documents_read": read,
            "empty_dropped": empty,
            "duplicates_dropped": dups,
            "near_duplicates_dropped": merged["per"][s].get("near", 0),
            "empty_rate": round(empty / read, 6),
            "duplicate_rate": round(dups / non_empty, 6) if non_empty else 0.0,
            "tokens": tr["tokens"] + ev["tokens"],
            "train_tokens": tr["tokens"],
            "eval_tokens": ev["tokens"],
            "chars": chars,
            "bytes": tr["bytes"] + ev["bytes"],
            "bytes_per_token": round(bpt["bytes"] / max(1, bpt["tokens"]), 6),
            "non_ascii_ratio": round((tr["non_ascii"] + ev["non_ascii"]) / max(1, chars), 6),
            "doc_tokens": histogram_summary(*merge_histograms(hists["doc_tokens"])),
            "doc_chars": histogram_summary(*merge_histograms(hists["doc_chars"])),
            "token_profile": token_profile(counts, vocab),
        }
    return shards, stats


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


class _Bar:
    """One rich progress bar on stderr across all workers: tasks, input bytes, documents,
    tokens/s and ETA, updated from the tasks' completion markers and outputs (or nothing)."""

    def __init__(self, enabled: bool, build: Path, tasks: list[TaskInput]):
        self.enabled = enabled
        self.build = build
        self.sizes = [t.size for t in tasks]
        self.total_bytes = max(1, sum(self.sizes))
        self._progress: Any = None
        self._task: Any = None
        self._stage = ""
        self._seen: dict[int, tuple[int, int]] = {}
        self._t0 = time.perf_counter()

    def __enter__(self) -> _Bar:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TextColumn("{task.fields[info]}"),
                TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True), transient=True,
            )
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress:
            self._progress.__exit__(*exc)

    def stage(self, name: str) -> None:
        self._stage, self._seen, self._t0 = name, {}, time.perf_counter()
        if self._progress:
            if self._task is not None:
                self._progress.remove_task(self._task)
            self._task = self._progress.add_task(name, total=self.total_bytes, info="")

    def tick(self, _done: int) -> None:
        if not self._progress or self._stage not in ("scan", "tokenize"):
            return
        folder = self.build / self._stage / "logs" / "completions"
        ranks = [int(n) for n in os.listdir(folder)] if folder.is_dir() else []
        for rank in ranks:
            if rank not in self._seen:
                self._seen[rank] = self._read(rank)
        done_bytes = sum(self.sizes[r] for r in ranks if r < len(self.sizes))
        docs = sum(v[0] for v in self._seen.values())
        tokens = sum(v[1] for v in self._seen.values())
        rate = tokens / max(1e-9, time.perf_counter() - self._t0)
        info = (f"{len(ranks)}/{len(self.sizes)} tasks  {done_bytes / 1e6:,.0f}/{self.total_bytes / 1e6:,.0f} MB  "
                f"{docs:,} docs" + (f"  {rate / 1e6:.2f} M tokens/s" if self._stage == "tokenize" else ""))
        self._progress.update(self._task, completed=done_bytes, info=info)

    def _read(self, rank: int) -> tuple[int, int]:
        out = self.build / self._stage / "out" / f"{rank:05d}"
        try:
            if self._stage == "scan":
                return json.loads((out / "counts.json").read_text())["read"], 0
            st = json.loads((out / "stats.json").read_text())
            return (sum(st[s]["documents"] for s in SPLITS), sum(st[s]["tokens"] for s in SPLITS))
        except (OSError, ValueError, KeyError):
            return 0, 0
