"""The in-job retry loop of a Slurm batch script: run the `srun` step, relaunch it after crashes.

`exec python -m pipelines.launchers.supervise --run-dir RUN --max-restarts N -- srun ...`
applies the same rules as `run_with_retries` (see `pipelines.launchers.retry`), inside the
allocation, so a detached job recovers without anyone watching it. On SIGTERM (job
cancelled, preempted, out of time) it stops retrying and waits for the step, whose tasks
Slurm signals directly; the trainer checkpoints and the job ends with 143.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipelines.launchers.interface import read_result_status
from pipelines.launchers.retry import Verdict, cancel_requested, classify


def _run_in_job(run_dir: Path, max_restarts: int, command: list[str]) -> int:
    """Run `command` (the `srun` of the batch script) with the retry rules; its exit code."""
    terminating = False

    def on_term(signum: int, _frame: object) -> None:
        # Job cancelled, preempted or out of time: Slurm signals the tasks itself. Never pass the
        # signal on to srun: srun answers SIGTERM by killing its step (SIGKILL), no checkpoint.
        nonlocal terminating
        terminating = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    attempt = 0
    while True:
        attempt += 1
        started = time.time()
        child = subprocess.Popen(command)
        code = child.wait()
        if terminating:
            return 143
        decision = classify(code, read_result_status(run_dir, not_before=started), cancel_requested(run_dir))
        print(f"[retry] attempt {attempt}: exit {code}: {decision.verdict}: {decision.reason}", flush=True)
        if decision.verdict is Verdict.SUCCESS:
            return 0
        if decision.verdict is Verdict.GIVE_UP or attempt > max_restarts:
            return code if code > 0 else 128 - code
        print(f"[retry] restart {attempt}/{max_restarts} from the last valid checkpoint", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.launchers.supervise",
                                     description="Run a training command, relaunching it after crashes.")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--max-restarts", type=int, default=int(os.environ.get("PIPELINE_MAX_RESTARTS", "3")))
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command is required after --")
    return _run_in_job(args.run_dir, args.max_restarts, command)


if __name__ == "__main__":
    sys.exit(main())
