"""The parent of a one-process local job: what `accelerate launch` does for one process, without
importing torch (which costs `accelerate launch` 2 s of CPU idle and 10+ s on a loaded host).

For one process `accelerate launch` is a plain parent (its "simple launcher"): it sets some
environment variables (`one_process_env`), starts `python <program> ...`, waits, and on a
non-zero exit raises `CalledProcessError` (exit 1, the rank's exit code in the traceback, which
`logtail.process_failure` reads). This module does the same, so the rank keeps a live parent
(`trainer.runlock`: the job token, the parent-death signal) and the launcher sees the same exit
codes and log lines. Multi-process jobs keep `accelerate launch` (torch elastic).

    python pipelines/launchers/solo.py <python> <program> [args...]

Run by path, not `-m`: starting it imports nothing of the repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping


def one_process_env(env: Mapping[str, str], use_gpu: bool) -> dict[str, str]:
    """`env` plus what `accelerate launch --num_processes 1 --mixed_precision no --dynamo_backend no`
    (with `--cpu` unless `use_gpu`) sets for its process (accelerate 1.x `prepare_simple_launcher_cmd_env`)."""
    out = dict(env)
    cpu = not use_gpu
    out["ACCELERATE_USE_CPU"] = str(cpu)
    if cpu:
        out["KMP_AFFINITY"] = "granularity=fine,compact,1,0"
        out["KMP_BLOCKTIME"] = "1"
    out |= {"ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_DYNAMO_BACKEND": "NO",
            "ACCELERATE_DYNAMO_MODE": "default", "ACCELERATE_DYNAMO_USE_FULLGRAPH": "False",
            "ACCELERATE_DYNAMO_USE_DYNAMIC": "False", "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "False"}
    out["OMP_NUM_THREADS"] = str(_threads(env, cpu))
    return out


def launch_threads(env: Mapping[str, str] | None = None, world: int = 1) -> int:
    """The threads one CPU training process of a `world`-process job gets on this machine: one
    each when several share it (commands.py), else what `_threads` gives the single process."""
    return 1 if world > 1 else _threads(os.environ if env is None else env, True)


def _threads(env: Mapping[str, str], cpu: bool) -> int:
    # accelerate: $OMP_NUM_THREADS if set; else on CPU the physical cores (when > 1); else 1.
    try:
        given = int(env.get("OMP_NUM_THREADS", "") or 0)
    except ValueError:
        given = 0
    if given:
        return given
    if cpu:
        import psutil  # type: ignore[import-untyped]  # an accelerate dependency

        per_process = int((psutil.cpu_count(logical=False) or 1) / 1)
        if per_process > 1:
            return per_process
    return 1


def main(argv: list[str]) -> int:
    cmd = argv[1:]
    process = subprocess.Popen(cmd)
    process.wait()
    if process.returncode != 0:
        raise subprocess.CalledProcessError(returncode=process.returncode, cmd=cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
