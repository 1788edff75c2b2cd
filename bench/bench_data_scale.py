"""Data preparation at corpus scale (issue 18): peak memory, tokenization throughput against
the `tokenizers` batch-encode ceiling, and local determinism, for one generated JSON Lines
source of a given size.

    .venv/bin/python bench/bench_data_scale.py --mb 600 [--workers 2] [--no-append]
    nice -n 10 .venv/bin/python bench/bench_data_scale.py --mb 6144 --skip-ceiling   # the big one

The corpus is generated into a temporary directory (never the repository; removed after),
English-like documents of varied length with 2 % exact duplicates. The preparation runs in a
child process (`pipeline`'s own `prepare_data`, the spec's default byte-level BPE, vocab
4096); peak RSS is sampled every 0.2 s over the child's whole process tree (driver, datatrove
workers, forkserver, manager) and also read from the kernel's per-process high-water mark
(`ru_maxrss` of the largest child). The ceiling is `Tokenizer.encode_batch_fast` alone, all
cores, on the cleaned text of the first `--ceiling-mb` of the same corpus with the same
tokenizer, run right after the preparation on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from scaffold import REPO, append_results_md, cpu_model, utc_stamp

WORDS = ("the of and to in is that for it as with was on be by this are from at or an have not which but "
         "all their were can more one has been its when there than other some them into only time new these "
         "would two may first any like over such our use most also well where after year way even many "
         "model data training token batch shard memory worker stream corpus merge index cluster node job "
         "loss step rate value result function method class module return import error file path").split()


def generate(path: Path, target_bytes: int, seed: int = 0) -> dict:
    """English-like JSON Lines: documents of 40-4000 words, every 50th an exact copy of an earlier one."""
    rng = random.Random(seed)
    pool = [" ".join(rng.choice(WORDS) for _ in range(64)) for _ in range(4096)]
    written = docs = dups = 0
    recent: list[str] = []
    with path.open("w", encoding="utf-8") as handle:
        while written < target_bytes:
            if recent and docs % 50 == 49:
                text = recent[rng.randrange(len(recent))]
                dups += 1
            else:
                n = int(rng.lognormvariate(5.3, 0.8)) // 64 + 1
                parts = [pool[rng.randrange(len(pool))] for _ in range(n)]
                text = f"Document {docs}. " + ". ".join(parts) + "."
                if len(recent) < 1000:
                    recent.append(text)
                else:
                    recent[rng.randrange(1000)] = text
            line = json.dumps({"text": text}) + "\n"
            handle.write(line)
            written += len(line)
            docs += 1
    return {"bytes": written, "documents": docs, "duplicates_written": dups}


_CHILD = """
import json, sys, time
from pathlib import Path
from pipelines.dataprep.prepare import prepare_data
from validation.spec import DataSpec
repo, cache, workers = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
data = DataSpec.model_validate({"sources": [{"name": "big", "path": "data/big.jsonl", "weight": 1.0}]})
t = time.perf_counter()
prepared = prepare_data(data, repo, cache_root=cache, progress=False, workers=workers)
print(json.dumps({"seconds": round(time.perf_counter() - t, 2), "version": prepared.version,
                  "path": str(prepared.path), "stats": prepared.stats["big"]}))
"""


def _tree_rss(pid: int) -> int:
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run_prepare(repo: Path, cache: Path, workers: int, status: Path | None = None) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(repo), str(cache), str(workers)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    peak = [0]

    started = time.perf_counter()

    def sample() -> None:
        last = 0.0
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            if status and time.perf_counter() - last > 10:  # a long run can be read while it runs
                last = time.perf_counter()
                stages = sorted(p.parent.parent.name + "/" + str(len(list(p.iterdir())))
                                for p in cache.glob(".build-*/*/logs/completions"))
                status.write_text(json.dumps({"elapsed_s": round(last - started), "peak_tree_rss_mib":
                                              round(peak[0] / 2**20, 1), "completed": stages}) + "\n")
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    sampler.join()
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_tree_rss_mib"] = round(peak[0] / 2**20, 1)
    result["max_process_rss_mib"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
    version = result["version"]
    result["timings"] = json.loads((cache / ".logs" / version / "timings.json").read_text())
    return result


def ceiling(corpus: Path, tokenizer_path: Path, mb: float) -> dict:
    """`encode_batch_fast` alone on the cleaned text of the corpus's first `mb` MB, all cores."""
    from tokenizers import Tokenizer

    from basics.environment import scoped_environ
    from pipelines.dataprep.clean import clean_text

    texts, size = [], 0
    with corpus.open(encoding="utf-8") as handle:
        for line in handle:
            text = clean_text(json.loads(line)["text"])
            texts.append(text)
            size += len(text.encode("utf-8"))
            if size >= mb * 1e6:
                break
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    best = None
    with scoped_environ(TOKENIZERS_PARALLELISM="true"):
        for _ in range(2):
            wall = cpu = 0.0
            tokens = 0
            for i in range(0, len(texts), 2000):  # batches of documents, as the preparation encodes
                t, c = time.perf_counter(), time.process_time()
                encodings = tokenizer.encode_batch_fast(texts[i:i + 2000], add_special_tokens=False)
                wall, cpu = wall + time.perf_counter() - t, cpu + time.process_time() - c
                tokens += sum(len(e) for e in encodings)  # outside the clock: the encoder alone is timed
            if best is None or wall < best[0]:
                best = (wall, cpu / wall, tokens)
    assert best is not None
    return {"ceiling_mb": round(size / 1e6, 1), "ceiling_tokens_per_s": round(best[2] / best[0]),
            "ceiling_cpu_per_wall": round(best[1], 2)}


_SAMPLE_CHILD = """
import json, sys
from pathlib import Path
from pipelines.dataprep.prepare import prepare_data
from validation.spec import DataSpec
repo, cache, workers = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
data = DataSpec.model_validate({"sources": [{"name": "s", "path": "data/sample.jsonl", "weight": 1.0}], "task_bytes": 16 << 20,
                                "tokenizer": {"kind": "local", "path": "data/tok"}})
prepared = prepare_data(data, repo, cache_root=cache, progress=False, workers=workers)
print(json.dumps({"version": prepared.version, "tokens": prepared.stats["s"]["tokens"]}))
"""


def side_by_side(repo: Path, corpus: Path, tokenizer_path: Path, mb: float, workers: int, rounds: int = 2) -> dict:
    """The preparation's tokenize stage and the bare encoder on the same text, interleaved
    (ceiling, stage, ceiling, stage, ...), so both see the same load of a shared machine."""
    import shutil

    sample = repo / "data/sample.jsonl"
    with corpus.open("rb") as src, sample.open("wb") as dst:
        written = 0
        for line in src:
            dst.write(line)
            written += len(line)
            if written >= mb * 1e6:
                break
    (repo / "data/tok").mkdir(exist_ok=True)
    shutil.copyfile(tokenizer_path, repo / "data/tok/tokenizer.json")
    ceilings, stages = [], []
    for r in range(rounds):
        ceilings.append(ceiling(sample, tokenizer_path, mb)["ceiling_tokens_per_s"])
        cache = repo / f"sample-cache-{r}"
        out = subprocess.run([sys.executable, "-c", _SAMPLE_CHILD, str(repo), str(cache), str(workers)],
                             capture_output=True, text=True, cwd=REPO)
        assert out.returncode == 0, out.stderr[-2000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        timings = json.loads((cache / ".logs" / got["version"] / "timings.json").read_text())
        stages.append(round(got["tokens"] / timings["seconds"]["tokenize"]))
        shutil.rmtree(cache)
    ceilings.append(ceiling(sample, tokenizer_path, mb)["ceiling_tokens_per_s"])
    ratios = [round(stages[i] / ((ceilings[i] + ceilings[i + 1]) / 2), 3) for i in range(rounds)]
    return {"side_by_side_mb": round(written / 1e6, 1), "side_by_side_ceiling_tokens_per_s": ceilings,
            "side_by_side_stage_tokens_per_s": stages, "side_by_side_stage_vs_ceiling": ratios}


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=600.0, help="size of the generated source")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--ceiling-mb", type=float, default=60.0)
    parser.add_argument("--skip-ceiling", action="store_true", help="no ceiling and no side-by-side runs")
    parser.add_argument("--tmp", default=None, help="where the corpus and cache go (default: the system temp)")
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--status", type=Path, default=None, help="rewrite this JSON file every 10 s while preparing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        repo = Path(tmp)
        (repo / "data").mkdir()
        t = time.perf_counter()
        gen = generate(repo / "data/big.jsonl", int(args.mb * 1e6))
        gen["generate_s"] = round(time.perf_counter() - t, 1)
        run = run_prepare(repo, repo / "cache", args.workers, args.status)
        st = run.pop("stats")
        tokenize_s = run["timings"]["seconds"]["tokenize"]
        figures = {
            "input_mb": round(gen["bytes"] / 1e6, 1), "documents_read": st["documents_read"],
            "duplicates_dropped": st["duplicates_dropped"], "tokens": st["tokens"], "workers": args.workers,
            "tasks": run["timings"]["tasks"], "prepare_s": run["seconds"], "stage_s": run["timings"]["seconds"],
            "peak_tree_rss_mib": run["peak_tree_rss_mib"], "max_process_rss_mib": run["max_process_rss_mib"],
            "prepare_tokens_per_s": round(st["tokens"] / run["seconds"]),
            "tokenize_stage_tokens_per_s": round(st["tokens"] / tokenize_s),
            "generate_s": gen["generate_s"],
        }
        if not args.skip_ceiling:
            figures.update(ceiling(repo / "data/big.jsonl", Path(run["path"]) / "tokenizer/tokenizer.json",
                                   args.ceiling_mb))
            figures["tokenize_stage_vs_ceiling"] = round(figures["tokenize_stage_tokens_per_s"]
                                                         / figures["ceiling_tokens_per_s"], 3)
            figures.update(side_by_side(repo, repo / "data/big.jsonl", Path(run["path"]) / "tokenizer/tokenizer.json",
                                        args.ceiling_mb, args.workers))
        figures["load_avg_end"] = round(os.getloadavg()[0], 1)
    print(json.dumps(figures, indent=1))
    if not args.no_append:
        _append(figures)
    return figures


def _append(figures: dict) -> None:
    import tokenizers

    lines = ["", f"## Data at scale (bench/bench_data_scale.py, {figures['input_mb']} MB) — {utc_stamp()}", "",
             f"Machine: {os.cpu_count()} CPUs (nproc), {cpu_model()}, "
             f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, shared with other "
             f"sessions (1-min load average {figures['load_avg_end']} at the end); Python "
             f"{platform.python_version()}, tokenizers {tokenizers.__version__}.", "",
             "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in figures.items()]
    append_results_md("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
