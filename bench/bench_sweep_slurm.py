"""A 4-trial sweep on the two Slurm nodes of the test cluster, 2 at a time with successive-halving
pruning, against the sequential full grid (1 at a time, no pruning), in one bench run.

    .venv/bin/python bench/bench_sweep_slurm.py [--no-append]

The sweep is the one of tests/test_sweep_slurm.py (tiny Llama, 24 steps, eval every 4, four
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
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SLURM_SH = REPO / "tests" / "infra" / "slurm.sh"


def _seconds(text: str) -> int:
    """Slurm's RunTime `[days-]hh:mm:ss` in seconds."""
    days, _, clock = text.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return (int(days) if days else 0) * 86400 + h * 3600 + m * 60 + s


def _job(seed_dir: Path) -> dict[str, Any]:
    """The Slurm job that trained a seed directory: id, node, state, restarts, RunTime."""
    job_id = json.loads((seed_dir / "launch.json").read_text())["job_id"]
    out = "".join(p.read_text(errors="replace") for p in sorted((seed_dir / "logs").glob("slurm-*.out")))
    first = re.search(r"^\[sbatch\] job \d+ restart \d+ nodes (\S+)", out, re.M)
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    fields = dict(re.findall(r"(\w+)=(\S*)", shown))
    return {"job_id": job_id, "node": first[1] if first else None, "state": fields.get("JobState"),
            "restarts": int(fields.get("Restarts", "0") or 0), "node_s": _seconds(fields.get("RunTime", "0:0:0"))
            * int(fields.get("NumNodes", "1") or 1)}


def run_mode(name: str, sweep_yaml: str) -> dict[str, Any]:
    from pipelines.orchestrate import ExperimentFlow, Reporter, RunOptions
    from tests.test_orchestrate_e2e import BASE
    from validation.data import build_demo_corpus

    class Timed(Reporter):
        def __init__(self) -> None:
            self.dirs: dict[str, Path] = {}
            self.spans: dict[str, tuple[float, float]] = {}

        def training(self, label: str, run_dir: Path, total_steps: int) -> Callable[[], None]:
            started = time.time()
            self.dirs[label] = run_dir

            def end() -> None:
                self.spans[label] = (started, time.time())
            return end

    # No spaces in the path: it goes into #SBATCH --output=..., which sbatch splits at a space.
    with tempfile.TemporaryDirectory(prefix=f"sweep-{re.sub(r'[^a-z0-9]+', '-', name)}-") as tmp:
        repo = Path(tmp)
        (repo / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
        (repo / "experiments").mkdir()
        (repo / "experiments" / "tiny-base.yaml").write_text(BASE)
        (repo / "experiments" / "tiny-slurm-sweep.yaml").write_text(sweep_yaml)
        build_demo_corpus(repo / "data" / "demo", max_bytes=150_000)
        os.environ["PIPELINE_RUNS_DIR"] = str(repo / "runs")
        rec = Timed()
        load_before = os.getloadavg()[0]
        t0 = time.time()
        flow = ExperimentFlow(repo, RunOptions(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}", smoke=False), rec)
        candidate, _ = flow.run(repo / "experiments" / "tiny-slurm-sweep.yaml")
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
    from tests.test_sweep_slurm import SWEEP

    sequential = SWEEP.replace("parallel: 2", "parallel: 1").replace("prune: true", "prune: false")
    assert sequential != SWEEP and "parallel: 1" in sequential and "prune: false" in sequential
    state = Path(os.environ.get("SLURM_TEST_STATE", "/tmp/pipeline-slurm"))
    running = subprocess.run([str(SLURM_SH), "status"], capture_output=True).returncode == 0
    if not running:
        subprocess.run([str(SLURM_SH), "start"], check=True, capture_output=True, timeout=900)
    os.environ["SLURM_CONF"] = str(state / "slurm.conf")
    try:
        slurm_version = subprocess.run(["sinfo", "-V"], capture_output=True, text=True).stdout.strip()
        pruned = run_mode("parallel 2, pruning", SWEEP)
        full = run_mode("sequential full grid", sequential)
    finally:
        if not running:
            subprocess.run([str(SLURM_SH), "stop"], capture_output=True, timeout=120)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    figures = {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
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
        (REPO / "bench" / "results").mkdir(exist_ok=True)
        (REPO / "bench" / "results" / "sweep_slurm.json").write_text(json.dumps(figures, indent=1) + "\n")
        with (REPO / "bench" / "RESULTS.md").open("a", encoding="utf-8") as handle:
            handle.write(markdown(figures))
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
             f"{m['slurm']}; {m['cluster']}. The sweep of tests/test_sweep_slurm.py: tiny Llama (49k parameters), "
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
