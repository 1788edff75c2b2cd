"""Follow log files as they grow, line by line (for `wait(on_log=...)`).

Every launcher writes its processes' output to files under `RUN/logs/` and `wait`
tails them, so streaming works the same for a local process, a Slurm job on another
node (shared file system) and a job followed again after a detach.
"""

from __future__ import annotations

import re
from collections.abc import Callable
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
