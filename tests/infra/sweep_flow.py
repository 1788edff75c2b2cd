"""The sweep end-to-end scaffolding shared by tests/e2e/test_orchestrate_sweep.py,
tests/integration/test_sweep_slurm.py and bench/bench_sweep_slurm.py: a scratch repository with
the tiny base and one sweep file, a reporter that records when each training ran and where, and what
Slurm says about the job that trained a seed directory."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipelines.orchestrate import ExperimentFlow, Reporter, RunOptions
from tests.infra.tiny_experiments import BASE


class Timed(Reporter):
    """Start and end of every training (label -> seed dir, span)."""

    def __init__(self) -> None:
        self.dirs: dict[str, Path] = {}
        self.spans: dict[str, tuple[float, float]] = {}

    def training(self, label: str, run_dir: Path, total_steps: int) -> Callable[[], None]:
        started = time.time()
        self.dirs[label] = run_dir

        def end() -> None:
            self.spans[label] = (started, time.time())
        return end


def sweep_repo(root: Path, name: str, sweep_yaml: str) -> Path:
    """`root` as a scratch repository: pyproject, tiny-base, experiments/<name>.yaml, a small demo
    corpus. Returns the sweep file."""
    from tests.infra.corpus import demo_corpus

    (root / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    (root / "experiments").mkdir()
    (root / "experiments" / "tiny-base.yaml").write_text(BASE)
    (root / "experiments" / f"{name}.yaml").write_text(sweep_yaml)
    demo_corpus(root / "data" / "demo", 150_000)
    return root / "experiments" / f"{name}.yaml"


def run_flow(root: Path, spec_file: Path, rec: Reporter) -> Any:
    """The whole flow (no smoke) with a sqlite MLflow store in `root`; returns the candidate."""
    flow = ExperimentFlow(root, RunOptions(tracking_uri=f"sqlite:///{root / 'mlflow.db'}", smoke=False), rec)
    candidate, _ = flow.run(spec_file)
    return candidate


def _seconds(text: str) -> int:
    """Slurm's RunTime `[days-]hh:mm:ss` in seconds."""
    days, _, clock = text.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return (int(days) if days else 0) * 86400 + h * 3600 + m * 60 + s


def slurm_job(seed_dir: Path) -> dict[str, Any]:
    """What Slurm says about the job a seed directory was trained by: id, log files and text,
    every start of the batch script (its first line), the node, state, restarts, node-seconds."""
    handle = json.loads((seed_dir / "launch.json").read_text())
    job_id = handle["job_id"]
    logs = sorted((seed_dir / "logs").glob("slurm-*.out"))
    out = "".join(p.read_text(errors="replace") for p in logs)
    # `[sbatch] job 212 restart 0 nodes n1 main ...`: the batch script's first line, per start.
    starts = re.findall(r"^\[sbatch\] job (\d+) restart (\d+) nodes (\S+)", out, re.M)
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    fields = dict(re.findall(r"(\w+)=(\S*)", shown))
    return {"launcher": handle["launcher"], "job_id": job_id, "logs": [p.name for p in logs], "out": out,
            "starts": starts, "node": starts[0][2] if starts else None, "state": fields.get("JobState"),
            "restarts": int(fields["Restarts"]) if fields.get("Restarts", "").isdigit() else None,
            "node_s": _seconds(fields.get("RunTime", "0:0:0")) * int(fields.get("NumNodes", "1") or 1)}


# The 4-trial Slurm sweep of tests/integration/test_sweep_slurm.py and bench/bench_sweep_slurm.py.
SLURM_SWEEP = """\
name: tiny-slurm-sweep
owner: ml-platform
extends: tiny-base.yaml
hypothesis:
  statement: The best of four learning rates trains the tiny model to a lower held-out loss on Slurm.
  metric: eval/loss
  direction: decrease
  min_effect: 0.01
  baseline: champion
train: {max_steps: 24, eval_interval: 4, checkpoint_interval: 8}
resource: {launcher: slurm, nodes: 1, cpu_processes: 1, time_limit_minutes: 10}
sweep:
  parameters: {train.lr: [0.006, 0.003, 0.000001, 0.000002]}
  parallel: 2
  prune: true
  reduction_factor: 2
"""
