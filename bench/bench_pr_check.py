"""The pull-request check, as a person waits for it: validate -> plan -> data check -> smoke,
each a cold `pipeline` process on one example experiment, median of several runs.

The data cache is warm after the first run (as on a runner with a cache); the first
(cold) run is reported separately. Run: `.venv/bin/python bench/bench_pr_check.py [--runs N]`.
Appends to bench/RESULTS.md under "## PR check".
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scaffold import REPO, append_results_md, cpu_model, utc_stamp

PIPELINE = [sys.executable, "-m", "pipelines"]


def timed(args: list[str], out_dir: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(PIPELINE + args, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env=dict(os.environ, PIPELINE_RUNS_DIR=str(out_dir)))
    return time.perf_counter() - t0


def main(runs: int = 3, experiment: str = "higher-lr") -> dict[str, float]:
    spec = f"experiments/{experiment}.yaml"
    out = REPO / "runs" / "bench-pr-check"
    subprocess.run(PIPELINE + ["data", "demo"], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    steps = {
        "validate": ["validate", spec],
        "plan": ["plan", spec],
        "data_check": ["data", "check", spec, "--baseline", "base", "--out", str(out / "check")],
        "smoke": ["smoke", spec, "--run-dir", str(out / "smoke")],
    }
    samples: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(runs):
        for name, args in steps.items():
            samples[name].append(timed(args, out))
    figures = {f"{k}_s": round(statistics.median(v), 2) for k, v in samples.items()}
    figures["total_s"] = round(sum(figures.values()), 2)
    load = os.getloadavg()[0]
    print(figures)
    lines = [
        f"\n## PR check (bench/bench_pr_check.py) — {utc_stamp()}\n",
        f"Machine: {os.cpu_count()} CPUs, {cpu_model()}; Python {platform.python_version()}; 1-min load {load:.1f}.",
        f"`{spec}`: each step a cold `pipeline` process, median of {runs} runs (data cache warm).\n",
        "| step | median s |", "|---|---|",
        *[f"| {k.removesuffix('_s')} | {v} |" for k, v in figures.items()],
    ]
    append_results_md("\n".join(lines) + "\n")
    return figures


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--experiment", default="higher-lr")
    a = ap.parse_args()
    main(a.runs, a.experiment)
