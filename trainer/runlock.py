"""One writer per run directory, and ranks that die with their launcher.

Two kernel mechanisms, no polling:

- **A lock per rank** (`RUN/locks/rank<N>.lock`, `flock` exclusive). Every rank takes its
  global rank's lock before it touches the run directory and holds it until it exits; the
  kernel releases it when the process dies, however it dies. A second job on the same run
  directory finds the lock held and refuses (`RunDirBusy`) instead of writing a second copy
  of every metric and checkpoint. The lock file carries the holder's pid and host, so the
  launcher can tell which ranks of a job are alive (`live_ranks`) without guessing from
  process trees: torch elastic starts every rank in its own session (pgid == sid == pid),
  out of reach of the launcher's process group.
- **Parent-death signal** (`prctl(PR_SET_PDEATHSIG)`). A rank asks the kernel to SIGKILL it
  when its parent, the `accelerate launch` process, dies. A SIGKILL to the launcher's
  process group then ends the whole job at once, instead of leaving the ranks training
  unowned (they would finish and race the relaunch for the run directory). A graceful stop
  (SIGTERM to the launcher) is unaffected: accelerate stays alive while its ranks save a
  checkpoint.

Why flock and not a pid file: a pid file survives a crash and needs a liveness guess; a
flock is released by the kernel when its holder dies, and works on NFSv4 (emulated with
POSIX locks) for run directories shared between nodes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["RunDirBusy", "acquire_rank_lock", "holding_run_dir", "join_job", "live_ranks", "signal_ranks"]
from basics.errors import RunDirBusy

LOCK_DIR = "locks"
JOB_TOKEN_ENV = "PIPELINE_JOB_TOKEN"
"""Set by the launchers for every process of a job; a rank checks its parent carries it too."""
ACQUIRE_WAIT_S = 5.0
"""How long a rank retries a held lock: covers a launcher's momentary liveness probe."""
PR_SET_PDEATHSIG = 1


@dataclass
class RankLock:
    """A held rank lock; released when closed or when the process exits."""

    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


_held: list[RankLock] = []  # keeps the descriptors open for the life of the process


def lock_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / LOCK_DIR / f"rank{rank}.lock"


def _holder_info(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text() or "{}"))
    except (OSError, ValueError):
        return {}


def _describe(info: dict[str, Any]) -> str:
    parts = [f"pid {info.get('pid', '?')} on {info.get('host', '?')}"]
    if info.get("started"):
        parts.append("since " + time.strftime("%H:%M:%S", time.localtime(float(info["started"]))))
    return ", ".join(parts)


def acquire_rank_lock(run_dir: Path, rank: int, wait_s: float = ACQUIRE_WAIT_S) -> RankLock:
    """Take rank `rank`'s lock of `run_dir` or raise `RunDirBusy` naming the holder."""
    path = lock_path(run_dir, rank)
    for held in _held:
        # Already ours (a test or a notebook running the trainer twice in one process): a
        # second flock on a new descriptor would conflict with our own first one.
        if held.fd >= 0 and held.path == path.resolve():
            return held
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise
            if time.monotonic() >= deadline:
                os.close(fd)
                info = _holder_info(path)
                raise RunDirBusy(
                    f"run directory {run_dir} is in use: rank {rank} of another job is alive ({_describe(info)}); "
                    f"stop it first (`pipeline cancel {run_dir}`) or wait for it to end") from None
            time.sleep(0.05)
    info = {"pid": os.getpid(), "host": socket.gethostname(), "rank": rank, "started": time.time(),
            "job": os.environ.get(JOB_TOKEN_ENV, "")}
    data = json.dumps(info).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    lock = RankLock(path.resolve(), fd)
    _held.append(lock)
    return lock


def live_ranks(run_dir: Path, ranks: range | None = None) -> list[dict[str, Any]]:
    """The ranks of whatever job is running in `run_dir`: the info of every held rank lock
    (only of the global ranks in `ranks` when given: one node's share of a multi-node job).

    The probe takes a shared lock for an instant; a rank starting at that very moment
    retries (`ACQUIRE_WAIT_S`), so probing never refuses a job.
    """
    out: list[dict[str, Any]] = []
    folder = Path(run_dir) / LOCK_DIR
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("rank*.lock")):
        if ranks is not None and not (path.stem[4:].isdigit() and int(path.stem[4:]) in ranks):
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            out.append(_holder_info(path) | {"lock": str(path)})
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    return out


def describe_ranks(ranks: list[dict[str, Any]]) -> str:
    return ", ".join(f"rank {r.get('rank', '?')} ({_describe(r)})" for r in ranks)


def signal_ranks(ranks: list[dict[str, Any]], sig: int) -> int:
    """Send `sig` to the ranks that run on this host; how many were signalled."""
    host = socket.gethostname()
    sent = 0
    for r in ranks:
        pid = r.get("pid")
        if r.get("host") == host and isinstance(pid, int) and pid > 1:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                sent += 1
    return sent


def _parent_carries_token(ppid: int, token: str) -> bool:
    try:
        environ = Path(f"/proc/{ppid}/environ").read_bytes()
    except OSError:
        return ppid != 1
    return f"{JOB_TOKEN_ENV}={token}".encode() in environ.split(b"\0")


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux only).

    Returns False where unsupported. If the parent already died before the request (the
    window between fork and this call), exits at once: a rank without its launcher is not
    part of any job.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    token = os.environ.get(JOB_TOKEN_ENV)
    if token and not _parent_carries_token(os.getppid(), token):
        os.write(2, b"error: the launcher of this rank is gone; exiting\n")
        os._exit(1)
    return True


def rank_from_env() -> int:
    """This process's global rank as set by torch elastic / accelerate (0 for a plain process)."""
    return int(os.environ.get("RANK", "0") or 0)


@contextlib.contextmanager
def holding_run_dir(run_dir: Path, rank: int = 0) -> Iterator[RankLock]:
    """Rank `rank`'s lock of `run_dir` for an in-process run (the smoke): the lock a trainer
    job takes first (`join_job`), so a job and an in-process run, or two in-process runs,
    never write one run directory at once.

    Unlike `join_job` it asks for no parent-death signal (the process is the orchestrator,
    not a rank of a launched job) and lets go on exit, unless this process held the lock
    already: then it is re-entrant and leaves the outer holder's lock alone."""
    path = lock_path(run_dir, rank).resolve()
    ours_already = any(held.fd >= 0 and held.path == path for held in _held)
    lock = acquire_rank_lock(run_dir, rank, wait_s=ACQUIRE_WAIT_S)  # read now: tests shorten the window
    try:
        yield lock
    finally:
        if not ours_already:
            lock.release()
            with contextlib.suppress(ValueError):
                _held.remove(lock)


def join_job(run_dir: Path) -> RankLock:
    """At a rank's start, before it writes anything: die with the launcher, own the rank's lock."""
    die_with_parent()
    return acquire_rank_lock(Path(run_dir), rank_from_env())
