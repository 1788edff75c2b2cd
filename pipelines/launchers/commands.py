"""The `accelerate launch` command line for one machine of a job (pure).

On CPU, `accelerate launch --cpu --num_processes 2` starts ONE process; processes that
really synchronise gradients need `ACCELERATE_USE_CPU=true` with `--multi_gpu` (gloo),
measured with accelerate 1.15 (see STACK-NOTES). `--num_processes` is the total over
all machines. Precision is decided by the trainer from the spec, so the launcher pins
`--mixed_precision no --dynamo_backend no` and no accelerate config file leaks in.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass

from basics.environment import apply_offline_env
from pipelines.launchers.interface import LaunchJob


@dataclass(frozen=True)
class Rendezvous:
    """Where rank 0 listens and which machine this command is for."""

    num_machines: int = 1
    machine_rank: int | str = 0
    """An int, or a shell expression such as `$SLURM_NODEID` for a generated script."""
    main_ip: str = "127.0.0.1"
    main_port: int | str = 29500
    num_machines_text: str | None = None
    """Overrides how `--num_machines` is written (e.g. `$SLURM_NNODES` in a batch script)."""


def accelerate_command(job: LaunchJob, rdzv: Rendezvous, python: str | None = None) -> list[str]:
    """`python -m accelerate.commands.launch [options] <program> --spec ... --run-dir ...`."""
    cmd = [python or sys.executable, "-m", "accelerate.commands.launch"]
    single_process = job.world_size == 1
    if job.use_gpu:
        cmd += ["--num_processes", str(job.world_size)]
        if not single_process:
            cmd += ["--multi_gpu"]
    elif single_process:
        cmd += ["--cpu", "--num_processes", "1"]
    else:
        cmd += ["--multi_gpu", "--num_processes", str(job.world_size), "--num_cpu_threads_per_process", "1"]
    cmd += ["--num_machines", rdzv.num_machines_text or str(rdzv.num_machines), "--mixed_precision", "no", "--dynamo_backend", "no"]
    if not single_process:
        cmd += ["--main_process_ip", rdzv.main_ip, "--main_process_port", str(rdzv.main_port)]
        if rdzv.num_machines > 1:
            cmd += ["--machine_rank", str(rdzv.machine_rank)]
    return cmd + job.trainer_args()


def launch_env(job: LaunchJob, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every training process: ours, the job's, and the fixed switches."""
    env = dict(os.environ if base is None else base)
    env.update(job.env)
    apply_offline_env(env)
    env["PYTHONUNBUFFERED"] = "1"  # log lines reach launcher.log as they happen
    if not job.use_gpu:
        env["ACCELERATE_USE_CPU"] = "true"
    if job.tracking_uri:
        env["MLFLOW_TRACKING_URI"] = job.tracking_uri
    return env


def free_port() -> int:
    """A TCP port free on this host right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    assert host and port.isdigit(), f"rendezvous must be host:port, got {endpoint!r}"
    return host, int(port)
