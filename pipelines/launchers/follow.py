"""Following a launched job until it ends: the loop behind every launcher's `wait`.

Each turn polls the job, sends the new lines of its log files on (`LogTail`), and decides:
an ended job is returned after its last, unterminated log line, unless the launcher started
it again in place (Slurm's requeue); a job past its own time limit is stopped by the launcher
and returned as it ended (local and static; Slurm enforces `--time` itself); past the
caller's `timeout` the running state is returned and the job goes on.

The turn, the tail and the timeout are the same for every launcher; what differs is passed
in as callables, each doing nothing by default.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pipelines.launchers.interface import JobState, LogSink
from pipelines.launchers.logtail import LogTail


def _ignore(state: JobState) -> None:
    return None


def _not_relaunched(state: JobState) -> bool:
    return False


def _no_time_limit() -> JobState | None:
    return None


def follow(poll: Callable[[], JobState], tail: LogTail, *, interval: float, timeout: float | None = None,
           on_log: LogSink | None = None, seen: Callable[[JobState], None] = _ignore,
           relaunched: Callable[[JobState], bool] = _not_relaunched,
           over_time: Callable[[], JobState | None] = _no_time_limit) -> JobState:
    """Poll every `interval` seconds, streaming `tail` to `on_log`, until the job ends.

    `seen(state)` runs after each poll, once the log lines up to it are out; `relaunched(state)`
    gets an ended job and says whether it was started again in place (then it is followed on);
    `over_time()` is None while the job is within its own time limit, else it stops the job and
    returns the state it ended in."""
    start = time.monotonic()
    while True:
        state = poll()
        tail.pump(on_log)
        seen(state)
        if state.done:
            if relaunched(state):
                continue
            tail.pump(on_log, final=True)
            return state
        stopped = over_time()
        if stopped is not None:
            tail.pump(on_log, final=True)
            return stopped
        if timeout is not None and time.monotonic() - start > timeout:
            return state
        time.sleep(interval)
