"""Follow log files as they grow, line by line (for `wait(on_log=...)`), and read from a
launcher log which training process ended a job, and how (`process_failure`).

Every launcher writes its processes' output to files under `RUN/logs/` and `wait`
tails them, so streaming works the same for a local process, a Slurm job on another
node (shared file system) and a job followed again after a detach.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipelines.launchers.interface import LogSink

_ALERT = re.compile(r"ALERT (P0|P1) (\S+) step=(\d+): (.*)")
_RELAUNCH = ("restart", "giving up", "requeue", "waiting up to")


class LogTail:
    """Reads the complete new lines of some files since the last call."""

    def __init__(self, paths: list[Path], prefix_names: bool = False, start_offset: int = 0):
        # start_offset skips what earlier attempts appended to the same file.
        self._offsets: dict[Path, int] = {Path(p): start_offset for p in paths}
        self._prefix = prefix_names

    def pump(self, sink: LogSink | None, final: bool = False) -> int:
        """Send new lines to `sink`; with `final`, also a last line without a newline."""
        count = 0
        for path, offset in self._offsets.items():
            try:
                with path.open("rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read()
            except FileNotFoundError:
                continue
            end = len(chunk) if final else chunk.rfind(b"\n") + 1
            if end <= 0:
                continue
            self._offsets[path] = offset + end
            for raw in chunk[:end].splitlines():
                line = raw.decode("utf-8", "replace")
                if sink is not None:
                    sink(f"[{path.name}] {line}" if self._prefix else line)
                count += 1
        return count


def story_lines(say: Callable[[str, str], None]) -> LogSink:
    """A log sink that keeps what a person at the console must see as it happens, one line each:
    P0/P1 alerts of the trainer (`say("alert", ...)`) and relaunches, requeues and waits of the
    launchers (`say("relaunch", ...)`). Everything else stays in the log files."""

    def sink(line: str) -> None:
        match = _ALERT.search(line)
        if match:
            say("alert", f"{match[1]} {match[2]} at step {match[3]}: {match[4]}")
        elif line.startswith(("[launcher]", "[retry]")) and any(word in line for word in _RELAUNCH):
            say("relaunch", line.split("] ", 1)[1])

    return sink


_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):\s*\[\d+\]:(?P<body>.*?)(?:\n=|\Z)", re.S)
_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)", re.M)
_ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)", re.M)
_SINGLE = re.compile(r"CalledProcessError: Command .* (?:died with <Signals\.\w+: (\d+)>|returned non-zero exit "
                     r"status (\d+))")
TAIL_BYTES = 256 * 1024
"""How much of the end of a launcher log `process_failure` reads."""


@dataclass(frozen=True)
class ProcessFailure:
    """The training process that ended a job, as the launch tool logged it (the job's own exit
    code is the tool's: torch elastic and accelerate exit 1 whatever happened to the rank)."""

    exit_code: int
    """The process's: negative for a signal, as `subprocess` reports it."""
    rank: int | None = None
    pid: int | None = None

    def describe(self) -> str:
        import signal

        who = f"rank {self.rank} " if self.rank is not None else ""
        pid = f" (pid {self.pid})" if self.pid is not None else ""
        if self.exit_code < 0:
            try:
                name = signal.Signals(-self.exit_code).name
            except ValueError:
                name = f"signal {-self.exit_code}"
            return f"{who}killed by {name}{pid}"
        return f"{who}exited {self.exit_code}{pid}".strip()


def process_failure(log: Path, start_offset: int = 0) -> ProcessFailure | None:
    """The failed process that torch elastic ("Root Cause (first observed failure)") or
    accelerate's single-process launch (`CalledProcessError`) names in `log` after
    `start_offset` (this attempt's part), the last one logged; None when neither is there."""
    try:
        with log.open("rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(start_offset, size - TAIL_BYTES))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    roots = list(_ROOT_CAUSE.finditer(text))
    if roots:
        body = roots[-1]["body"]
        rank, code = _ROOT_RANK.search(body), _ROOT_EXIT.search(body)
        if code:
            return ProcessFailure(int(code[1]), int(rank[1]) if rank else None, int(code[2]))
    singles = list(_SINGLE.finditer(text))
    if singles:
        last = singles[-1]
        return ProcessFailure(-int(last[1]) if last[1] else int(last[2]))
    return None
