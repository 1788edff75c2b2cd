"""Process-level retry: a crashed training is relaunched and resumes from its last checkpoint.

The trainer resumes by itself from the newest valid checkpoint in `RUN/checkpoints/`, so a
retry is simply "launch the same job again". What must be decided is *whether* to retry:
a failure of the machinery is retried, a bad result of the training is not.

| what ended the attempt                                    | verdict  |
|-----------------------------------------------------------|----------|
| exit 0 (and `result.json` "finished" or absent)            | success  |
| `result.json` status "failed" / "stopped" / "diverged"     | give up: a bad result, rerunning |
|   (early stop, alert policy) and not killed by SIGTERM     |   the same thing gives the same answer |
| exit 2 usage/spec, 3 data, 11 doctor refused               | give up: deterministic, fix the input |
| a cancel requested by a user (`RUN/cancel.requested`)      | give up: cancelled |
| any other non-zero exit: Python crash (1), SIGKILL / OOM   | retry, up to `max_restarts` |
|   killer (-9, 137), SIGTERM preemption (-15, 143),         |          |
|   NCCL/gloo peer loss, Slurm NODE_FAIL / PREEMPTED / TIMEOUT|          |

The same rules drive the in-job loop of the Slurm batch script
(`python -m pipelines.launchers.supervise --run-dir RUN --max-restarts N -- srun ...`), so a
detached Slurm job retries without anyone watching it; after the in-job restarts are
used up the Slurm launcher requeues the whole job (`scontrol requeue`), which may land
on other nodes.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from basics.errors import no_retry_exit_codes
from pipelines.launchers.interface import JobState, Launcher, LaunchJob, LogSink, Phase, read_result_status

CANCEL_MARKER = "cancel.requested"
"""Written into the run directory by every launcher's `cancel`: no retry after it."""

NO_RETRY_EXIT_CODES = no_retry_exit_codes()  # the registry in basics.errors: 2 input, 3 data, 11 doctor...
PREEMPTION_EXIT_CODES = {143, -signal.SIGTERM}


class Verdict(StrEnum):
    SUCCESS = "success"
    RETRY = "retry"
    GIVE_UP = "give-up"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str


def classify(exit_code: int | None, result_status: str | None, cancelled: bool = False,
             phase: Phase | None = None, failure: str = "") -> Decision:
    """Decide what an ended attempt means (pure; the table in the module docstring). `failure`
    says which process ended it and how (`JobState.failure`), for the reason."""
    if cancelled:
        return Decision(Verdict.GIVE_UP, "cancelled by request")
    if exit_code == 0 and result_status in (None, "finished") and phase not in (Phase.LOST, Phase.TIMEOUT):
        return Decision(Verdict.SUCCESS, "finished")
    preempted = exit_code in PREEMPTION_EXIT_CODES
    if result_status in ("failed", "stopped", "diverged") and not preempted:
        return Decision(Verdict.GIVE_UP, f"training result is '{result_status}' (a bad result is not retried)")
    if exit_code in NO_RETRY_EXIT_CODES:
        return Decision(Verdict.GIVE_UP, f"exit {exit_code}: {NO_RETRY_EXIT_CODES[exit_code]}")
    if phase is Phase.LOST:
        return Decision(Verdict.RETRY, "node lost or preempted")
    if phase is Phase.TIMEOUT:
        return Decision(Verdict.RETRY, "time limit reached")
    if exit_code is None:
        return Decision(Verdict.RETRY, "ended without an exit status")
    return Decision(Verdict.RETRY, f"crashed: {failure or describe_exit(exit_code)}")


def describe_exit(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    if code > 128 and code - 128 in signal.Signals._value2member_map_:
        return f"exit {code} ({signal.Signals(code - 128).name})"
    return f"exit {code}"


def cancel_requested(run_dir: Path) -> bool:
    return (Path(run_dir) / CANCEL_MARKER).exists()


@dataclass(frozen=True)
class RetryOutcome:
    state: JobState
    attempts: int
    decisions: tuple[Decision, ...]


def run_with_retries(launcher: Launcher, job: LaunchJob, on_log: LogSink | None = None,
                     timeout: float | None = None) -> RetryOutcome:
    """Submit `job`, wait, and relaunch it after a crash up to `job.max_restarts` times.

    A launcher whose jobs retry by themselves (`retries_inside`, Slurm: in-job loop plus
    requeue) is submitted once, so attempts do not multiply.
    """
    say = on_log or (lambda line: None)
    limit = 0 if getattr(launcher, "retries_inside", False) else job.max_restarts
    decisions: list[Decision] = []
    attempt = 0
    ended: float | None = None
    while True:
        attempt += 1
        started = time.time()
        # A relaunch waits (bounded) for the old attempt's ranks: one may still be writing
        # the checkpoint the new attempt resumes from.
        handle = launcher.submit(job if attempt == 1 else replace(job, wait_previous_s=job.grace_seconds + 30,
                                                                  previous_attempt_ended=ended))
        state = launcher.wait(handle, timeout=timeout, on_log=on_log)
        ended = time.time()
        if not state.done:  # our own timeout: stop it, it is a failure of the time budget
            state = launcher.cancel(handle)
        status = read_result_status(job.run_dir, not_before=started)
        decision = classify(state.exit_code, status, cancelled=cancel_requested(job.run_dir), phase=state.phase,
                            failure=state.failure)
        decisions.append(decision)
        if decision.verdict is not Verdict.RETRY or attempt > limit:
            if decision.verdict is Verdict.RETRY:
                say(f"[launcher] giving up after {attempt} attempts: {decision.reason}")
            return RetryOutcome(state, attempt, tuple(decisions))
        say(f"[launcher] attempt {attempt} {decision.reason}; restart {attempt}/{job.max_restarts} "
            "resumes from the last valid checkpoint")
