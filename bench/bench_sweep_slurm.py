"""A 4-trial sweep on the two Slurm nodes of the test cluster, 2 at a time with successive-halving
pruning, against the sequential full grid (1 at a time, no pruning), in one bench run.

    .venv/bin/python bench/bench_sweep_slurm.py [--no-append]

The sweep is the one of tests/integration/test_sweep_slurm.py (tiny Llama, 24 steps, eval every 4, four
learning rates, every trial a 1-node Slurm job on one CPU process); the cluster is
tests/infra/slurm.sh (two slurmd nodes on this host), started and stopped here when it is not
running. Each mode runs the whole flow (trials, then the winner retrained on the hypothesis
seed) in its own temporary repository, so nothing is reused between them. Figures per mode:
wall time of the flow and of its trial phase (first trial start to last trial end), compute as
optimizer steps trained x processes and as Slurm node-seconds (each job's RunTime x nodes,
from `scontrol show job`), which trials were pruned at which step, the winner. Writes
bench/results/sweep_slurm.json and appends an entry to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from scaffold import append_results_md, cpu_model, slurm_test_cluster, utc_stamp, write_results_json


def _job(seed_dir: Path) -> dict[str, Any]:
    """The Slurm figures of a seed directory's job, without its log text (tests/infra/sweep_flow.py)."""
    from tests.infra.sweep_flow import slurm_job

    return {k: v for k, v in slurm_job(seed_dir).items() if k not in ("out", "starts", "logs")}


def run_mode(name: str, sweep_yaml: str) -> dict[str, Any]:
    from tests.infra.sweep_flow import Timed, run_flow, sweep_repo

    # No spaces in the path: it goes into #SBATCH --output=..., which sbatch splits at a space.
    with tempfile.TemporaryDirectory(prefix=f"sweep-{re.sub(r'[^a-z0-9]+', '-', name)}-") as tmp:
        repo = Path(tmp)
        spec_file = sweep_repo(repo, "tiny-slurm-sweep", sweep_yaml)
        os.environ["PIPELINE_RUNS_DIR"] = str(repo / "runs")
        rec = Timed()
        load_before = os.getloadavg()[0]
        t0 = time.time()
        candidate = run_flow(repo, spec_file, rec)
        wall = time.time() - t0
        outcomes = candidate.extra["sweep_outcomes"]
        trials = []
        for o in outcomes:
            label = f"{o.trial.name} seed {o.trial.resolved.seeds[0]}"
            start, end = rec.spans[label]
            world = o.trial.spec.resource.world_size
            trials.append({"trial": o.trial.name, "overrides": o.trial.overrides, "status": o.status,
                           "value": o.value, "pruned_at": o.pruned_at, "steps": o.steps_done, "processes": world,
                           "start_s": round(start - t0, 1), "end_s": round(end - t0, 1), **_job(rec.dirs[label])})
        confirm_label = f"{candidate.spec.name} seed {candidate.resolved.seeds[0]}"
        confirm = rec.spans[confirm_label]
        confirm_job = _job(rec.dirs[confirm_label])
        spans = [rec.spans[f"{t['trial']} seed {o.trial.resolved.seeds[0]}"] for t, o in zip(trials, outcomes, strict=True)]
        winner = candidate.extra["sweep_winner"]
        return {
            "mode": name, "wall_s": round(wall, 1),
            "trial_phase_s": round(max(e for _, e in spans) - min(s for s, _ in spans), 1),
            "confirm_s": round(confirm[1] - confirm[0], 1), "confirm_node_s": confirm_job["node_s"],
            "trial_steps_x_procs": sum((t["steps"] or 0) * t["processes"] for t in trials),
            "trial_node_s": sum(t["node_s"] for t in trials),
            "pruned": [f"{t['trial']} at step {t['pruned_at']} (trained {t['steps']})" for t in trials if t["pruned_at"]],
            "winner": winner, "winner_value": next(t["value"] for t in trials if t["trial"] == winner),
            "winner_overrides": next(t["overrides"] for t in trials if t["trial"] == winner),
            "confirmed_on_seeds": list(candidate.resolved.seeds), "verdict": candidate.verdict,
            "max_concurrent_trials": max(sum(1 for s, e in spans if s <= at < e) for at, _ in spans),
            "load_avg_before": round(load_before, 2), "load_avg_after": round(os.getloadavg()[0], 2),
            "trials": trials,
        }


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-append", action="store_true", help="do not write bench/RESULTS.md and bench/results/")
    args = parser.parse_args()
    from tests.infra.sweep_flow import SLURM_SWEEP as SWEEP

    sequential = SWEEP.replace("parallel: 2", "parallel: 1").replace("prune: true", "prune: false")
    assert sequential != SWEEP and "parallel: 1" in sequential and "prune: false" in sequential
    with slurm_test_cluster():
        slurm_version = subprocess.run(["sinfo", "-V"], capture_output=True, text=True).stdout.strip()
        pruned = run_mode("parallel 2, pruning", SWEEP)
        full = run_mode("sequential full grid", sequential)
    figures = {
        "when": utc_stamp(),
        "machine": {"platform": platform.platform(), "cpu": cpu_model(), "cores": os.cpu_count(),
                    "python": platform.python_version(), "slurm": slurm_version,
                    "cluster": "tests/infra/slurm.sh: 2 slurmd nodes (n1, n2) on this one host, each claiming every core"},
        "pruned_parallel": pruned, "sequential_full_grid": full,
        "ratios": {
            "wall": round(pruned["wall_s"] / full["wall_s"], 3),
            "trial_phase_wall": round(pruned["trial_phase_s"] / full["trial_phase_s"], 3),
            "trial_steps_x_procs": round(pruned["trial_steps_x_procs"] / full["trial_steps_x_procs"], 3),
            "trial_node_s": round(pruned["trial_node_s"] / full["trial_node_s"], 3),
        },
    }
    print(json.dumps(figures, indent=1))
    if not args.no_append:
        write_results_json("sweep_slurm", figures)
        append_results_md(markdown(figures))
    return figures


def markdown(f: dict[str, Any]) -> str:
    p, s, r, m = f["pruned_parallel"], f["sequential_full_grid"], f["ratios"], f["machine"]
    rows = [("flow wall time (trials + winner on the hypothesis seed), s", p["wall_s"], s["wall_s"], r["wall"]),
            ("trial phase wall time, s", p["trial_phase_s"], s["trial_phase_s"], r["trial_phase_wall"]),
            ("trial compute, optimizer steps x processes", p["trial_steps_x_procs"], s["trial_steps_x_procs"],
             r["trial_steps_x_procs"]),
            ("trial compute, Slurm node-seconds (RunTime x nodes)", p["trial_node_s"], s["trial_node_s"], r["trial_node_s"]),
            ("most trials at once", p["max_concurrent_trials"], s["max_concurrent_trials"], ""),
            ("winner", f"{p['winner']} {p['winner_overrides']}", f"{s['winner']} {s['winner_overrides']}", ""),
            ("winner's selection eval/loss", f"{p['winner_value']:.4f}", f"{s['winner_value']:.4f}", ""),
            ("winner retrained on seed(s)", p["confirmed_on_seeds"], s["confirmed_on_seeds"], ""),
            ("1-min load average before / after", f"{p['load_avg_before']} / {p['load_avg_after']}",
             f"{s['load_avg_before']} / {s['load_avg_after']}", "")]
    lines = ["", f"## Sweep on 2 Slurm nodes: pruned, 2 at a time vs the sequential full grid "
             f"(bench/bench_sweep_slurm.py) — {f['when']}", "",
             f"Machine: {m['cpu']}, {m['cores']} CPUs shared with other sessions, {m['platform']}, Python {m['python']}, "
             f"{m['slurm']}; {m['cluster']}. The sweep of tests/integration/test_sweep_slurm.py: tiny Llama (49k parameters), "
             "24 steps, eval every 4, `train.lr` in [0.006, 0.003, 1e-06, 2e-06], every trial a 1-node Slurm job "
             "(one CPU process, the node taken whole), selection seed 11234, the winner retrained on seed 1234. "
             "One run of each mode, pruned first, each in its own repository.", "",
             "| figure | parallel 2, pruning | sequential full grid | ratio |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    lines += ["", "Trials (start and end in s from the start of the flow; node-seconds from `scontrol show job`):", "",
              "| mode | trial | lr | status | steps | job | node | start-end s | node-s |", "|---|---|---|---|---|---|---|---|---|"]
    for mode in (p, s):
        for t in mode["trials"]:
            status = f"pruned at step {t['pruned_at']}" if t["pruned_at"] else t["status"]
            lines.append(f"| {mode['mode']} | {t['trial']} | {t['overrides'].get('train.lr')} | {status} | {t['steps']} | "
                         f"{t['job_id']} ({t['state']}, restarts {t['restarts']}) | {t['node']} | "
                         f"{t['start_s']}-{t['end_s']} | {t['node_s']} |")
    lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
