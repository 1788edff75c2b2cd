"""A 3-trial sweep on the two-node Slurm test cluster (issue 20, `tests/infra/slurm.sh`).

`resource.launcher: slurm`: every trial is its own 1-node Slurm job, two at a time
(`sweep.parallel: 2`), pruned by successive halving at its evals; the winner is retrained on
the hypothesis seed. What the test reads back from Slurm itself: job ids (`launch.json`),
the node each job got (the batch script's first line), `scontrol show job` (Restarts), and
the in-job retry loop's verdict on a pruned job.

Three trials, not the four of `SLURM_SWEEP` (bench/bench_sweep_slurm.py) or of the local sweep
(tests/e2e/test_orchestrate_sweep.py, which proves the pruning logic): two to train at once on
the two nodes, a third to be pruned, one Slurm job (doctor, accelerate, trainer) fewer.
Grid order: the two good learning rates train first, so the near-zero one meets both of its
rung values at step 4 and is pruned there (every trial trains on the same selection seed,
same data order, so at step 4 the losses differ by the learning rate only).
Measured with four trials: 154 s and 209 s (the test alone; 1-min load average 4 and 5 on 2
shared cores).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from pipelines.launchers import LaunchJob
from pipelines.launchers.slurm import render_sbatch
from pipelines.sweep import SELECTION_SEED_OFFSET
from tests.infra.sweep_flow import SLURM_SWEEP, Timed, run_flow, slurm_job, sweep_repo
from trainer.checkpoint import format as ckpt

# SLURM_SWEEP without its second near-zero learning rate: three trials.
SWEEP = (SLURM_SWEEP.replace("[0.006, 0.003, 0.000001, 0.000002]", "[0.006, 0.003, 0.000001]")
         .replace("The best of four learning rates", "The best of three learning rates"))
assert SWEEP.count("0.000002") == 0 and "three learning rates" in SWEEP


def test_a_one_process_job_takes_its_node_and_its_accelerate_outlives_the_sigterm(tmp_path: Path) -> None:
    def script(**kw: object) -> str:
        job = LaunchJob(spec_path=tmp_path / "spec.resolved.json", run_dir=tmp_path, data_dir=tmp_path, **kw)  # type: ignore[arg-type]
        text = render_sbatch(job, python="/usr/bin/python3")
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
        return text

    trap = '; trap "" TERM; exec '
    one = script(nodes=1, procs_per_node=1)
    # A sweep trial on CPU: the node whole (its torch threads use every core), so two trials take two nodes.
    assert "#SBATCH --exclusive\n" in one
    # accelerate's single-process parent ignores the step's SIGTERM; the trainer handles it and checkpoints.
    assert trap in one.splitlines()[-1]
    gpu = script(nodes=1, procs_per_node=1, use_gpu=True)  # the same parent; the GPUs are what is shared
    assert trap in gpu.splitlines()[-1] and "--exclusive" not in gpu and "--gres=gpu:1" in gpu
    for many in (script(nodes=2, procs_per_node=1), script(nodes=1, procs_per_node=2)):
        # Several processes: torch's elastic agent handles SIGTERM itself; 1 thread per CPU process.
        assert trap not in many.splitlines()[-1] and "--exclusive" not in many


def test_a_sweep_on_two_slurm_nodes_runs_trials_concurrently_prunes_and_confirms_on_fresh_seeds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slurm_cluster: object) -> None:
    spec_file = sweep_repo(tmp_path, "tiny-slurm-sweep", SWEEP)
    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(tmp_path / "runs"))
    # The tiny model's steps take 6-10 ms on an idle machine: the pruned trial ran its 24 steps in
    # 0.4 s, before the pruner's cancel (0.44 s after its step-4 eval) reached it (CI, idle).
    # Steps of 0.1 s are a slow machine's: the cancel lands mid-run however fast this one is.
    monkeypatch.setenv("TRAINER_FAULT_STEP_SECONDS", "0.1")
    rec = Timed()
    started = time.time()
    candidate = run_flow(tmp_path, spec_file, rec)
    print(f"3-trial sweep on 2 Slurm nodes, 2 at a time, with the winner's confirmation: {time.time() - started:.0f} s")

    trials = {k: v for k, v in rec.spans.items() if "-t" in k}
    assert len(trials) == 3, rec.spans
    jobs = {k: slurm_job(rec.dirs[k]) for k in trials}
    print({k: (j["job_id"], j["node"], j["state"], j["restarts"]) for k, j in jobs.items()})
    # Every trial was its own Slurm job, started once.
    assert all(j["launcher"] == "slurm" and j["job_id"].isdigit() for j in jobs.values()), jobs
    assert len({j["job_id"] for j in jobs.values()}) == 3
    assert all(len(j["starts"]) == 1 and j["restarts"] == 0 for j in jobs.values()), jobs
    # At least two trained at the same time, on the two different nodes (each trial takes a free node).
    overlapping = [(a, b) for a in trials for b in trials if a < b
                   and trials[a][0] < trials[b][1] and trials[b][0] < trials[a][1]]
    assert overlapping, trials
    assert any(jobs[a]["node"] != jobs[b]["node"] for a, b in overlapping), (overlapping, jobs)
    assert {j["node"] for j in jobs.values()} == {"n1", "n2"}

    outcomes = {f"{o.trial.name} seed {o.trial.resolved.seeds[0]}": o for o in candidate.extra["sweep_outcomes"]}
    pruned = [k for k, o in outcomes.items() if o.status == "pruned"]
    assert pruned, [(k, o.status) for k, o in outcomes.items()]
    for k in pruned:
        seed_dir, job, o = rec.dirs[k], jobs[k], outcomes[k]
        # Cancelled through the launcher, and not retried: no in-job restart, no requeue.
        assert (seed_dir / "cancel.requested").is_file() and (seed_dir / "pruned.json").is_file()
        assert "give-up: cancelled by request" in job["out"] and "[retry] restart" not in job["out"], job["out"][-2000:]
        assert job["logs"] == [f"slurm-{job['job_id']}.out"]
        # Stopped gracefully: the trainer got the SIGTERM, finished its step and checkpointed.
        saved = ckpt.list_checkpoints(seed_dir / "checkpoints")
        assert saved and saved[0][0] >= o.pruned_at, (k, saved, job["out"][-2000:])
        assert o.pruned_at is not None and o.steps_done is not None and o.pruned_at <= o.steps_done < 24

    # The winner, retrained under the sweep's name on the hypothesis seed (never a selection seed), on Slurm.
    assert candidate.spec.name == "tiny-slurm-sweep" and list(candidate.resolved.seeds) == [1234]
    picked = {s for o in outcomes.values() for s in o.trial.resolved.seeds}
    assert picked == {1234 + SELECTION_SEED_OFFSET} and 1234 not in picked
    confirm = [k for k in rec.spans if k == "tiny-slurm-sweep seed 1234"]
    assert confirm and slurm_job(rec.dirs[confirm[0]])["launcher"] == "slurm"
    assert candidate.report_dir is not None
    report = (candidate.report_dir / "report.md").read_text()
    assert "3 trials, " in report and "pruned at step" in report and "of the full grid" in report
    assert "hypothesis seed(s) [1234] only" in report and "selection seed(s) [11234]" in report
    assert all(name.split(" seed")[0] in report for name in trials)
