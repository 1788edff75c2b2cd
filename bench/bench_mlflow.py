"""MLflow logging cost per training step: one `log_metric` call per point vs one `log_batch`
per log interval, against the same local store, side by side, medians of interleaved runs.

A step logs ~12 metric keys (loss, lr, grad norm, throughput, MFU, memory, mixture...).
Run: `.venv/bin/python bench/bench_mlflow.py`; appends to bench/RESULTS.md.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from scaffold import append_results_md, utc_stamp

from basics.environment import apply_offline_env

apply_offline_env()
KEYS = [f"k{i}" for i in range(12)]
STEPS = 20
REPEATS = 3


def per_point(client, run_id: str) -> float:
    t0 = time.perf_counter()
    for step in range(STEPS):
        for k in KEYS:
            client.log_metric(run_id, k, float(step), step=step)
    return (time.perf_counter() - t0) / STEPS


def batched(client, run_id: str) -> float:
    from mlflow.entities import Metric

    t0 = time.perf_counter()
    now = int(time.time() * 1000)
    for step in range(STEPS):
        client.log_batch(run_id, metrics=[Metric(k, float(step), now, step) for k in KEYS])
    return (time.perf_counter() - t0) / STEPS


def main() -> dict[str, float]:
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory() as tmp:
        client = MlflowClient(tracking_uri=f"sqlite:///{Path(tmp) / 'm.db'}")
        exp = client.create_experiment("bench")
        a, b = [], []
        for _ in range(REPEATS):  # interleaved
            a.append(per_point(client, client.create_run(exp).info.run_id))
            b.append(batched(client, client.create_run(exp).info.run_id))
    fig = {"per_point_ms_per_step": round(1000 * statistics.median(a), 2),
           "batched_ms_per_step": round(1000 * statistics.median(b), 2)}
    fig["ratio"] = round(fig["per_point_ms_per_step"] / fig["batched_ms_per_step"], 1)
    print(fig)
    append_results_md(f"\n## MLflow logging (bench/bench_mlflow.py) — {utc_stamp()}\n\n"
                      f"Machine: {os.cpu_count()} CPUs; local sqlite store; {len(KEYS)} keys per step, {STEPS} steps, "
                      f"median of {REPEATS} interleaved runs; 1-min load {os.getloadavg()[0]:.1f}.\n\n"
                      f"| per-point log_metric | log_batch | ratio |\n|---|---|---|\n"
                      f"| {fig['per_point_ms_per_step']} ms/step | {fig['batched_ms_per_step']} ms/step | "
                      f"{fig['ratio']}x |\n")
    return fig


if __name__ == "__main__":
    main()
