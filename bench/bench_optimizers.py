"""AdamW vs Muon step time under DDP and FSDP2 (2 CPU gloo ranks), measured side by side.

The real trainer (`accelerate launch ... -m trainer`) on one prepared demo corpus, a Llama of
hidden 256 x 4 layers (vocab 2048, seq 128, micro-batch 8 per rank), 16 steps; the figure is
the median `perf/step_time_s` of steps 5-16 from metrics.jsonl. The four runs are interleaved
(adamw-ddp, muon-ddp, adamw-fsdp, muon-fsdp), `--repeats` times. Muon under FSDP gathers each
hidden matrix, orthogonalises it on one rank in turn and broadcasts it (models/optimizers/muon.py);
the ratio muon-fsdp / muon-ddp is what that costs. Appends to bench/RESULTS.md.

    .venv/bin/python bench/bench_optimizers.py [--repeats 1]
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

from scaffold import REPO, append_results_md, child_env, cpu_model, experiment, free_port, utc_stamp

RUNS = [("adamw", "ddp"), ("muon", "ddp"), ("adamw", "fsdp"), ("muon", "fsdp")]


def spec(optimizer: str, layout: str, data_root: Path) -> dict[str, Any]:
    return experiment(
        "bench-optimizers", "Muon's step costs about what AdamW's does under both data-parallel layouts.",
        "perf/tokens_per_s",
        model={"model_type": "llama", "hidden_size": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 4,
               "intermediate_size": 768, "vocab_size": 2048, "max_position_embeddings": 256,
               "tie_word_embeddings": False},
        data={"sources": [{"name": n, "path": str(data_root / f"{n}.jsonl"), "weight": w}
                          for n, w in (("code", 0.5), ("docs", 0.3), ("reference", 0.2))],
              "seq_len": 128, "tokenizer": {"vocab_size": 2048}},
        train={"max_steps": 16, "warmup_steps": 2, "micro_batch_size": 8, "log_interval": 1,
               "eval_interval": 1000, "checkpoint_interval": 1000, "grad_clip": 1.0,
               "optimizer": {"name": optimizer}},
        parallel={"dp": 2, "fsdp": layout == "fsdp"},
        resource={"cpu_processes": 2},
    )


def run(optimizer: str, layout: str, tmp: Path, data_root: Path, data_dir: Path) -> float:
    run_dir = tmp / f"{optimizer}-{layout}-{time.time_ns()}"
    run_dir.mkdir()
    (run_dir / "spec.resolved.json").write_text(json.dumps(spec(optimizer, layout, data_root)))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), "-m", "trainer", "--spec", str(run_dir / "spec.resolved.json"),
           "--run-dir", str(run_dir), "--data-dir", str(data_dir), "--tracking-uri", "none"]
    env = child_env(OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="true", PIPELINE_DATA_ROOTS=str(data_root))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    result = json.loads((run_dir / "result.json").read_text()) if (run_dir / "result.json").exists() else {}
    if result.get("status") != "finished":
        raise SystemExit(f"{optimizer}/{layout} failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    times = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = sorted((int(p["step"]), float(p["value"])) for p in times if p["key"] == "perf/step_time_s")
    return statistics.median(v for s, v in steps if s >= 5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    from pipelines.dataprep.demo_corpus import build_demo_corpus
    from pipelines.dataprep.prepare import prepare_data
    from validation.spec import DataSpec

    with tempfile.TemporaryDirectory(prefix="bench-optimizers-") as name:
        tmp = Path(name)
        data_root = tmp / "demo"
        os.environ["PIPELINE_DATA_ROOTS"] = str(tmp)
        build_demo_corpus(data_root, 1_500_000)
        data = DataSpec.model_validate(spec("adamw", "ddp", data_root)["data"])
        prepared = prepare_data(data, REPO, tmp / "cache", progress=False)
        samples: dict[tuple[str, str], list[float]] = {r: [] for r in RUNS}
        for _ in range(args.repeats):
            for optimizer, layout in RUNS:
                samples[(optimizer, layout)].append(run(optimizer, layout, tmp, data_root, prepared.path))
    med = {k: statistics.median(v) for k, v in samples.items()}
    cpu, when = cpu_model(), utc_stamp()
    load = os.getloadavg()[0]
    lines = [f"\n## Optimizers: AdamW vs Muon step time, DDP vs FSDP2 (bench/bench_optimizers.py) — {when}\n",
             f"Machine: {cpu}, {os.cpu_count()} CPUs, 2 gloo ranks x 1 thread; 1-min load {load:.1f} at the end "
             f"(shared machine). Llama 256 x 4 layers (3.7 M params untied), seq 128, micro 8 per rank; median step "
             f"time of steps 5-16, {args.repeats} repeat(s), runs interleaved.\n",
             "| optimizer | DDP s/step | FSDP2 s/step | FSDP / DDP |", "|---|---|---|---|"]
    for optimizer in ("adamw", "muon"):
        ddp, fsdp = med[(optimizer, "ddp")], med[(optimizer, "fsdp")]
        lines.append(f"| {optimizer} | {ddp:.3f} | {fsdp:.3f} | {fsdp / ddp:.2f} |")
    lines.append(f"\nMuon / AdamW: DDP {med[('muon', 'ddp')] / med[('adamw', 'ddp')]:.2f}, "
                 f"FSDP2 {med[('muon', 'fsdp')] / med[('adamw', 'fsdp')]:.2f}. Samples: "
                 + "; ".join(f"{o}-{lay} {', '.join(f'{x:.3f}' for x in v)}" for (o, lay), v in samples.items()))
    append_results_md("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
