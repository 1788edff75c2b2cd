"""Multi-node FSDP for real: the `static` launcher (two "machines" on this host, one process
each, meeting at a fixed rendezvous) and the `slurm` launcher (two slurmd nodes on this host)
run an FSDP2 job end to end, sharded across the two nodes; a SIGKILL of node 1's trainer
between checkpoints is relaunched by the launcher's retry and resumes from the sharded (DCP)
checkpoint with per-step losses bitwise equal to the uninterrupted run.

The reference is one uninterrupted run of the same job on one machine with two processes
(`local` launcher, module fixture); losses come from metrics.jsonl. The static job runs once
(module fixture), with node 1 SIGKILLed after its first checkpoint: its per-step losses equal
the one-machine run's bitwise (the first test) and it resumed (the second). The static
launcher's own contract (each node's `accelerate launch` line: two machines, the fixed
rendezvous, its machine rank) is checked on that job too (it was `test_launch_static.py`).
Pipeline stages across the two static machines (pp 2, one stage each) train as the one-machine
run does.
The Slurm job also tracks to the session's MLflow server: it is the two-node CPU training on
Slurm end to end (it was `test_launch_slurm.py::test_two_node_cpu_training_end_to_end`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pipelines.launchers import LaunchJob, Phase, get_launcher, job_from_spec
from pipelines.launchers.commands import free_port
from pipelines.launchers.retry import run_with_retries
from tests.infra.launch_helpers import USE_TRAINER, checkpoints, result, tiny_spec_dict
from tests.infra.trainer_runs import step_losses
from validation.spec import ExperimentSpec

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not USE_TRAINER, reason="the trainer (python -m trainer) is not importable")]

STEPS = 12
# Synchronous sharded saves at 4, 8, 12; no evaluation before the end; no clipping and an
# untied LM head so FSDP's reductions are bitwise reproducible (docs/parallelism.md).
TRAIN = {"max_steps": STEPS, "checkpoint_interval": 4, "eval_interval": 1000, "keep_last": 4, "grad_clip": 0.0,
         "max_restarts": 2}
FSDP = {"dp": 2, "fsdp": True}


def fsdp_job(tmp: Path, *, nodes: int, procs: int, launcher: str, rendezvous: str | None = None,
             parallel: dict[str, Any] | None = None, train: dict[str, Any] | None = None) -> LaunchJob:
    """A 2-rank FSDP job (or `parallel`) of the real trainer on really prepared (tiny) data."""
    from pipelines.dataprep.prepare import prepare_data

    data_root = tmp / "data"
    data_root.mkdir(parents=True, exist_ok=True)
    raw = tiny_spec_dict(data_root, nodes=nodes, procs=procs, launcher=launcher, rendezvous=rendezvous,
                         train=TRAIN | (train or {}))
    raw["parallel"] = parallel or FSDP
    raw["model"]["tie_word_embeddings"] = False
    spec = ExperimentSpec.model_validate(raw)
    run_dir = tmp / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_path = run_dir / "spec.resolved.json"
    spec_path.write_text(json.dumps(spec.resolved_dict(), indent=2))
    os.environ["PIPELINE_DATA_ROOTS"] = str(data_root)
    prepared = prepare_data(spec.data, Path(__file__).resolve().parents[2], cache_root=tmp / "cache", progress=False)
    job = job_from_spec(spec, spec_path=spec_path, run_dir=run_dir, data_dir=prepared.path, program=("-m", "trainer"),
                        grace_seconds=30.0, time_limit_minutes=10)
    return replace(job, tracking_uri="none")


def _logs(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace")[-3000:] for p in sorted((run_dir / "logs").glob("*.log"))
                   + sorted((run_dir / "logs").glob("slurm-*.*")))


def run_static(tmp: Path, on_started: Any = None, **layout: Any) -> tuple[LaunchJob, list[Any]]:
    """Both static "machines" of one job, each under the launcher's own retry loop (as each
    runner of a matrix would run `pipeline submit`), in threads; `on_started(job)` runs meanwhile."""
    job = fsdp_job(tmp, nodes=2, procs=1, launcher="static", rendezvous=f"127.0.0.1:{free_port()}", **layout)
    outcomes: list[Any] = [None, None]

    def node(rank: int) -> None:
        outcomes[rank] = run_with_retries(get_launcher("static"), replace(job, node_rank=rank), timeout=240)

    threads = [threading.Thread(target=node, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    try:
        if on_started:
            on_started(job)
    finally:
        for t in threads:
            t.join()
    return job, outcomes


def assert_fsdp_across_nodes(run_dir: Path) -> dict[str, Any]:
    done = result(run_dir)
    assert done["status"] == "finished" and done["world_size"] == 2, done
    layout = done["layout"]
    # Sharded across the two machines (not HSDP with shard 1, not a silent DDP fallback).
    assert layout["fsdp"] and layout["sharded"] and layout["dp"] == 2 and layout.get("replicate", 1) == 1, layout
    assert layout["params_on_rank0"] <= done["n_params"] * 0.52, layout
    newest = run_dir / "checkpoints" / f"step_{STEPS:06d}"
    manifest = json.loads((newest / "MANIFEST.json").read_text())
    assert manifest["format"] == "dcp" and {"__0_0.distcp", "__1_0.distcp"} <= set(manifest["files"])
    return done


def assert_bitwise(got: dict[int, float], want: dict[int, float]) -> None:
    assert sorted(got) == list(range(1, STEPS + 1)) and sorted(want) == sorted(got)
    diffs = {step: got[step] - want[step] for step in want}
    assert all(d == 0.0 for d in diffs.values()), diffs


@pytest.fixture(scope="module")
def one_machine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same job on one machine with two processes (local launcher), uninterrupted: the reference."""
    job = fsdp_job(tmp_path_factory.mktemp("one-machine"), nodes=1, procs=2, launcher="local")
    launcher = get_launcher("local")
    state = launcher.wait(launcher.submit(job), timeout=240)
    assert state.phase is Phase.SUCCEEDED, (state, _logs(job.run_dir))
    return {"run_dir": job.run_dir, "losses": step_losses(job.run_dir)}


@pytest.fixture(scope="module")
def static_killed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The static job on two "machines", node 1's trainer SIGKILLed between checkpoints."""
    killed: dict[str, Any] = {}

    def kill(job: LaunchJob) -> None:
        killed.update(kill_node1_after_first_checkpoint(job.run_dir))

    job, outcomes = run_static(tmp_path_factory.mktemp("static"), on_started=kill)
    return {"job": job, "outcomes": outcomes, "killed": killed}


def test_static_two_machines_fsdp_equals_one_machine_two_ranks(static_killed: dict[str, Any],
                                                                 one_machine: dict[str, Any]) -> None:
    job, outcomes = static_killed["job"], static_killed["outcomes"]
    run_dir = job.run_dir
    assert all(o.state.phase is Phase.SUCCEEDED for o in outcomes), (outcomes, _logs(run_dir))
    assert_fsdp_across_nodes(run_dir)
    port = job.rendezvous.split(":")[1]
    for rank in (0, 1):
        log = (run_dir / "logs" / f"launcher-node{rank}.log").read_text()
        # Each node's own `accelerate launch`: two machines meeting at the fixed rendezvous, its rank.
        assert f"--num_machines 2 --mixed_precision no --dynamo_backend no --main_process_ip 127.0.0.1 " \
               f"--main_process_port {port} --machine_rank {rank}" in log, log[-2000:]
    # The same job on one machine with two processes (local launcher): the same losses, bitwise.
    assert result(one_machine["run_dir"])["layout"]["sharded"]
    assert_bitwise(step_losses(run_dir), one_machine["losses"])


def kill_node1_after_first_checkpoint(run_dir: Path) -> dict[str, Any]:
    """SIGKILL rank 1 (node 1's trainer process, not its launcher) once a sharded checkpoint
    exists and rank 0 has logged step 5; returns the step it had reached and the checkpoints."""

    def last_step() -> int:
        try:
            return max(step_losses(run_dir), default=0)
        except (OSError, ValueError):  # not there yet, or a line half written
            return 0

    # Polled finely: a step of this model takes a fraction of a second.
    deadline = time.monotonic() + 240
    while not (checkpoints(run_dir) and last_step() >= 5):
        assert time.monotonic() < deadline, "gave up waiting for step 5 after the first sharded checkpoint"
        time.sleep(0.02)
    lock = json.loads((run_dir / "locks" / "rank1.lock").read_text())
    killed = {"at_step": last_step(), "checkpoints": checkpoints(run_dir)}
    os.kill(int(lock["pid"]), signal.SIGKILL)
    return killed


def assert_resumed_bitwise(run_dir: Path, killed: dict[str, Any], reference: dict[int, float]) -> int:
    done = assert_fsdp_across_nodes(run_dir)
    resumed = int(str(done["resumed_from"]).rstrip("/").rsplit("_", 1)[1])
    assert resumed in (4, 8) and resumed <= killed["at_step"], (done["resumed_from"], killed)
    print(f"killed node 1 after step {killed['at_step']}, resumed from step {resumed}")
    assert_bitwise(step_losses(run_dir), reference)
    return resumed


def test_static_sigkill_of_node1_between_checkpoints_resumes_bitwise(static_killed: dict[str, Any],
                                                                       one_machine: dict[str, Any]) -> None:
    job, outcomes, killed = static_killed["job"], static_killed["outcomes"], static_killed["killed"]
    logs = _logs(job.run_dir)
    assert all(o.state.phase is Phase.SUCCEEDED for o in outcomes), (outcomes, logs)
    # torch elastic turns a rank killed by SIGKILL into exit 1 of `accelerate launch`, naming the signal.
    node1 = (job.run_dir / "logs" / "launcher-node1.log").read_text(errors="replace")
    assert outcomes[1].attempts == 2 and outcomes[1].decisions[0].reason.startswith("crashed"), outcomes[1]
    assert "Signal 9 (SIGKILL)" in node1, node1[-3000:]
    assert outcomes[0].attempts == 2, outcomes[0]  # node 0 lost its peer and was relaunched too
    assert_resumed_bitwise(job.run_dir, killed, one_machine["losses"])


def test_slurm_two_nodes_fsdp_sigkill_of_node1_resumes_bitwise(one_machine: dict[str, Any], tmp_path: Path,
                                                               slurm_cluster: Any, mlflow_server: Any) -> None:
    """The Slurm job end to end, with node 1's trainer SIGKILLed between checkpoints: the
    batch script's in-job retry loop relaunches both nodes, which resume from the DCP shards.
    Machine ranks come from SLURM_NODEID; the run is tracked in MLflow."""
    job = replace(fsdp_job(tmp_path, nodes=2, procs=1, launcher="slurm"), tracking_uri=mlflow_server.uri)
    launcher = get_launcher("slurm")
    handle = launcher.submit(job)
    killed = kill_node1_after_first_checkpoint(job.run_dir)
    state = launcher.wait(handle, timeout=300)
    out = _logs(job.run_dir)
    assert state.ok, (state, out)
    assert "[retry] restart 1/" in out, out
    assert_resumed_bitwise(job.run_dir, killed, one_machine["losses"])
    assert result(job.run_dir)["mlflow_run_id"]
    slurm_out = "".join(p.read_text(errors="replace") for p in sorted((job.run_dir / "logs").glob("slurm-*.out")))
    assert re.search(r"^0: \[node 0\] .* machine_rank=0 of 2", slurm_out, re.M), slurm_out[-3000:]
    assert re.search(r"^1: \[node 1\] .* machine_rank=1 of 2", slurm_out, re.M), slurm_out[-3000:]


def test_two_nodes_saving_their_handles_at_once_do_not_collide(tmp_path: Path) -> None:
    """The static nodes share the run directory and save `launch.json` together; a fixed
    temporary name made one node's save fail with FileNotFoundError (seen on a relaunch)."""
    from pipelines.launchers import LaunchHandle

    errors: list[BaseException] = []

    def save(node: int) -> None:
        for _ in range(300):
            try:
                LaunchHandle(launcher="static", job_id=str(node), run_dir=tmp_path).save()
            except OSError as err:
                errors.append(err)

    threads = [threading.Thread(target=save, args=(node,)) for node in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert LaunchHandle.load(tmp_path).job_id in ("0", "1") and not list(tmp_path.glob("*.tmp"))


def test_static_two_machines_run_the_two_pipeline_stages(tmp_path: Path, one_machine: dict[str, Any]) -> None:
    """pp 2 on two static "machines", one process each: stages are the outermost rank axis, so
    machine 0 runs the first stage (embeddings, first half of the blocks) and machine 1 the last
    (second half, norm, head, loss), activations crossing the rendezvous; the same global batch
    (micro-batch 2 x 4 micro-batches) trains as the one-machine FSDP run within float tolerance."""
    job, outcomes = run_static(tmp_path, parallel={"dp": 1, "pp": 2}, train={"grad_accum_steps": 2})
    assert all(o.state.phase is Phase.SUCCEEDED for o in outcomes), (outcomes, _logs(job.run_dir))
    done = result(job.run_dir)
    assert done["world_size"] == 2 and (done["layout"]["dp"], done["layout"]["pp"]) == (1, 2), done  # 1 replica, 2 stages
    got, want = step_losses(job.run_dir), one_machine["losses"]
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    assert all(abs(got[s] - want[s]) <= 1e-4 * abs(want[s]) for s in want), {s: got[s] - want[s] for s in want}
