"""`train.compile` under FSDP2 on 2 CPU gloo ranks: compiled vs eager step time, measured side by side.

The real trainer (`accelerate launch ... -m trainer`) on one prepared demo corpus, a Llama of
hidden 256 x 4 layers (vocab 2048, seq 128, micro-batch 8 per rank, untied), fp32, 16 steps,
`parallel: {dp: 2, fsdp: true}`; `train.compile: true` compiles each decoder block with
inductor before `fully_shard` (trainer/parallel.py `apply_compile`). Figures: the median
`perf/step_time_s` of steps 5-16 from metrics.jsonl, the first step's time (the compile, with a
fresh TORCHINDUCTOR_CACHE_DIR per run: cold), and the largest relative difference of the
compiled run's `train/loss` from the eager one's at the same step. Runs interleaved
(eager, compiled, then compiled, eager, ...) `--repeats` times. Appends to bench/RESULTS.md, every
step's time to bench/results/compile.json.

    .venv/bin/python bench/bench_compile.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scaffold import (
    REPO,
    append_results_md,
    child_env,
    cpu_model,
    experiment,
    free_port,
    utc_stamp,
    write_results_json,
)

RUNS = ("eager", "compiled")


def spec(compiled: bool, data_root: Path) -> dict[str, Any]:
    return experiment(
        "bench-compile", "Per-block torch.compile makes the FSDP2 step faster than eager on CPU.",
        "perf/tokens_per_s",
        model={"model_type": "llama", "hidden_size": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 4,
               "intermediate_size": 768, "vocab_size": 2048, "max_position_embeddings": 256,
               "tie_word_embeddings": False},
        data={"sources": [{"name": n, "path": str(data_root / f"{n}.jsonl"), "weight": w}
                          for n, w in (("code", 0.5), ("docs", 0.3), ("reference", 0.2))],
              "seq_len": 128, "tokenizer": {"vocab_size": 2048}},
        train={"max_steps": 16, "warmup_steps": 2, "micro_batch_size": 8, "log_interval": 1,
               "eval_interval": 1000, "checkpoint_interval": 1000, "grad_clip": 1.0, "compile": compiled},
        parallel={"dp": 2, "fsdp": True},
        resource={"cpu_processes": 2},
    )


def run(compiled: bool, tmp: Path, data_root: Path, data_dir: Path) -> dict[str, Any]:
    run_dir = tmp / f"{RUNS[compiled]}-{time.time_ns()}"
    run_dir.mkdir()
    (run_dir / "spec.resolved.json").write_text(json.dumps(spec(compiled, data_root)))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), "-m", "trainer", "--spec", str(run_dir / "spec.resolved.json"),
           "--run-dir", str(run_dir), "--data-dir", str(data_dir), "--tracking-uri", "none"]
    env = child_env(OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="true", PIPELINE_DATA_ROOTS=str(data_root),
                    TORCHINDUCTOR_CACHE_DIR=str(run_dir / "inductor-cache"))
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    result = json.loads((run_dir / "result.json").read_text()) if (run_dir / "result.json").exists() else {}
    if result.get("status") != "finished":
        raise SystemExit(f"{RUNS[compiled]} failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    points = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = dict(sorted((int(p["step"]), float(p["value"])) for p in points if p["key"] == "perf/step_time_s"))
    losses = {int(p["step"]): float(p["value"]) for p in points if p["key"] == "train/loss"}
    return {"step_s": statistics.median(v for s, v in times.items() if s >= 5), "first_step_s": times[min(times)],
            "wall_s": wall, "losses": losses, "step_times": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    from pipelines.dataprep.demo_corpus import build_demo_corpus
    from pipelines.dataprep.prepare import prepare_data
    from validation.spec import DataSpec

    with tempfile.TemporaryDirectory(prefix="bench-compile-") as name:
        tmp = Path(name)
        data_root = tmp / "demo"
        os.environ["PIPELINE_DATA_ROOTS"] = str(tmp)
        build_demo_corpus(data_root, 1_500_000)
        data = DataSpec.model_validate(spec(False, data_root)["data"])
        prepared = prepare_data(data, REPO, tmp / "cache", progress=False)
        samples: dict[str, list[dict[str, Any]]] = {r: [] for r in RUNS}
        loads = []
        for repeat in range(args.repeats):  # eager, compiled, compiled, eager, ...: a load trend cancels
            for compiled in ((False, True) if repeat % 2 == 0 else (True, False)):
                samples[RUNS[compiled]].append(run(compiled, tmp, data_root, prepared.path))
                loads.append(os.getloadavg()[0])
    med = {r: statistics.median(s["step_s"] for s in v) for r, v in samples.items()}
    first = {r: statistics.median(s["first_step_s"] for s in v) for r, v in samples.items()}
    rel = max(abs(c["losses"][k] - e["losses"][k]) / abs(e["losses"][k])
              for e, c in zip(samples["eager"], samples["compiled"], strict=True) for k in e["losses"])
    lines = [f"\n## Compile under FSDP2: per-block torch.compile vs eager (bench/bench_compile.py) — {utc_stamp()}\n",
             f"Machine: {cpu_model()}, {os.cpu_count()} CPUs, 2 gloo ranks x 1 thread, shared with other sessions "
             f"(1-min load after each run: {', '.join(f'{x:.1f}' for x in loads)}). Llama 256 x 4 layers "
             f"(untied), seq 128, micro 8 per rank, fp32, 16 steps; median step time of steps 5-16, first step "
             f"with a cold inductor cache, {args.repeats} repeat(s), runs interleaved.\n",
             "| run | s/step (steps 5-16) | first step s | launch wall s |", "|---|---|---|---|"]
    for r in RUNS:
        lines.append(f"| {r} | {med[r]:.3f} | {first[r]:.1f} | "
                     f"{statistics.median(s['wall_s'] for s in samples[r]):.0f} |")
    lines.append(f"\nCompiled / eager step time: {med['compiled'] / med['eager']:.2f}. Largest relative loss "
                 f"difference, compiled vs eager, over all steps: {rel:.1e}. Samples (s/step): "
                 + "; ".join(f"{r} " + ", ".join(f"{s['step_s']:.3f}" for s in v) for r, v in samples.items()))
    write_results_json("compile", {"loads": loads, "samples": samples})
    lines.append("Every step's time: bench/results/compile.json.")
    append_results_md("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
