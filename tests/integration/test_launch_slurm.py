"""The `slurm` launcher on a real two-node cluster (two slurmd on this host, `tests/infra/slurm.sh`).

sbatch script -> srun doctor on both nodes -> srun accelerate launch with machine_rank
from SLURM_NODEID -> state followed with scontrol/squeue -> result.json.

The node-id checks and the crash/requeue checks read one probe job (module fixture): it is
submitted detached, followed by a fresh launcher from its run directory, crashes twice, is
retried in the job, requeued, and finishes.

Two-node training of the real trainer on this cluster, end to end (MLflow run, machine ranks,
a SIGKILLed node resumed): `test_launch_multinode_fsdp.py::test_slurm_two_nodes_fsdp_sigkill_of_node1_resumes_bitwise`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipelines.launchers import Phase, get_launcher, handle_for_run
from pipelines.launchers.slurm import SlurmLauncher
from tests.infra.launch_helpers import (
    checkpoints,
    make_job,
    probe_events,
    probe_ranks,
    result,
    training_started,
    wait_until,
)


def _slurm_output(run_dir) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("slurm-*.*")))


@pytest.fixture(scope="module")
def crashing_job(tmp_path_factory, slurm_cluster):
    """A 2-node probe job whose rank 0 crashes in its first two attempts: the in-job loop
    restarts once (max_restarts=1), then the job fails and the launcher requeues it; the
    third attempt resumes and finishes. Submitted detached, followed by a fresh launcher."""
    job, _ = make_job(tmp_path_factory.mktemp("crashing"), nodes=2, procs=1, launcher="slurm", max_restarts=1)
    job = replace(job, env={"PROBE_STEPS": "4", "PROBE_CRASH_AT_STEP": "3", "PROBE_CRASH_TIMES": "2"})
    handle = SlurmLauncher(max_requeues=1, requeue_hold_s=3).submit(job)  # returns at once: `--detach`
    submitted = {"job_id": handle.job_id, "script": (job.run_dir / "slurm" / "job.sbatch").is_file()}
    # Followed again from the run directory by a fresh launcher, as a later CI job would.
    lines: list[str] = []
    state = SlurmLauncher(max_requeues=1, requeue_hold_s=3).wait(handle_for_run(job.run_dir), on_log=lines.append)
    return {"job": job, "submitted": submitted, "lines": lines, "state": state}


def test_two_nodes_get_node_ids_0_and_1_and_one_process_group(crashing_job):
    job, lines, state = crashing_job["job"], crashing_job["lines"], crashing_job["state"]
    assert crashing_job["submitted"]["job_id"].isdigit() and crashing_job["submitted"]["script"]
    assert state.phase is Phase.SUCCEEDED and state.result_status == "finished", state
    ranks = probe_ranks(job.run_dir)
    assert sorted(r["slurm_nodeid"] for r in ranks) == ["0", "1"]
    assert sorted(r["node_rank"] for r in ranks) == ["0", "1"]  # machine_rank came from SLURM_NODEID
    assert all(r["world_size"] == 2 and r["allreduce"] == 3.0 for r in ranks)
    assert any("[node 1] " in line and "main 127.0.0.1:" in line for line in lines)  # NodeAddr, not "n1"
    # The doctor ran on both nodes, once per start of the job (the first and the requeued one).
    ready = [line for line in lines if "ready: 0 error(s)" in line]
    assert sorted(line.split(":")[0] for line in ready) == ["0", "0", "1", "1"], ready


def test_cancel_is_graceful(tmp_path, slurm_cluster):
    job, _ = make_job(tmp_path, nodes=2, procs=1, launcher="slurm")
    job = replace(job, env={"PROBE_STEPS": "600"})
    launcher = get_launcher("slurm")
    handle = launcher.submit(job)
    wait_until(lambda: training_started(job.run_dir), "the first steps")
    state = launcher.cancel(handle)
    assert state.phase is Phase.CANCELLED, state
    assert checkpoints(job.run_dir)
    assert {e["rank"] for e in probe_events(job.run_dir) if e["event"] == "sigterm"} == {0, 1}
    assert "[retry] restart" not in _slurm_output(job.run_dir)  # a cancel is never retried


def test_crashes_retry_in_the_job_then_requeue_the_job_and_resume(crashing_job):
    # Rank 0 crashes in its first two attempts: the in-job loop restarts once (max_restarts=1),
    # then the job fails and the launcher requeues it; the third attempt resumes and finishes.
    job, lines, state = crashing_job["job"], crashing_job["lines"], crashing_job["state"]
    assert state.ok and "restarts=1" in state.detail, (state, _slurm_output(job.run_dir)[-3000:])
    out = _slurm_output(job.run_dir)
    assert "[retry] restart 1/1 from the last valid checkpoint" in out
    assert any("requeue 1" in line for line in lines) and "restart 1 nodes n[1-2]" in out
    starts = [e["resumed_from"] for e in probe_events(job.run_dir) if e["event"] == "start" and e["rank"] == 1]
    assert starts == [None, 2, 2]  # fresh, in-job restart, requeued job: both resumed from step 2
    assert result(job.run_dir)["status"] == "finished"
