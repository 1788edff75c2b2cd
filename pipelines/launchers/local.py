"""`local`: `accelerate launch` with N processes on this host (gloo on CPU, GPUs on a runner);
one process starts under `solo`, which does what `accelerate launch` does for one process
without importing torch a second time.

One owner per job. The accelerate launcher runs in its own process group, but torch
elastic starts every rank in a session of its own (pgid == sid == pid), out of reach of a
signal to that group. So the job is tied together by two kernel mechanisms (see
`trainer.runlock`): every rank holds `RUN/locks/rank<N>.lock` (pid and host inside) while it
lives, and dies with its parent launcher (`PR_SET_PDEATHSIG`). The launcher therefore

- reports a job running until the leader *and* every rank lock are gone (`poll`);
- stops it by SIGTERM to the group and to every live rank (the trainer checkpoints and
  exits), then SIGKILL to both after `job.grace_seconds`, and returns only when no rank
  is alive, saying so (`cancel`, the time limit);
- refuses to start a job on a run directory whose ranks are alive, and a relaunch waits
  (bounded) for the previous attempt's ranks to exit (`submit`).

A SIGKILL to the launcher's group kills the ranks with it (parent-death signal): nothing
keeps writing into the run directory unowned. Output goes to `RUN/logs/launcher.log`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from pipelines.launchers.commands import Rendezvous, accelerate_command, free_port, launch_env
from pipelines.launchers.follow import follow
from pipelines.launchers.interface import (
    JobState,
    LaunchHandle,
    LaunchJob,
    LogSink,
    Phase,
    read_result_status,
)
from pipelines.launchers.logtail import LogTail, process_failure
from pipelines.launchers.retry import CANCEL_MARKER, cancel_requested, describe_exit
from pipelines.launchers.solo import one_process_env
from trainer.runlock import JOB_TOKEN_ENV, RunDirBusy, describe_ranks, live_ranks, signal_ranks

POLL_SECONDS = 0.5
SOLO = Path(__file__).resolve().parent / "solo.py"
"""The parent of a one-process job, started by path (imports nothing of the repository)."""
KILL_WAIT_S = 15.0
"""After SIGKILL: how long to wait for the kernel to tear every rank down (normally < 1 s)."""


def node_ranks(job: LaunchJob, node_rank: int) -> range:
    """The global ranks that machine `node_rank` of `job` runs."""
    return range(node_rank * job.procs_per_node, (node_rank + 1) * job.procs_per_node)


def await_previous_attempt(job: LaunchJob, wait_s: float, say: LogSink | None = None,
                           own: range | None = None) -> None:
    """Return once no rank of an earlier job holds a lock of `job.run_dir`; `RunDirBusy` when
    `wait_s` passes first (0: refuse at once). A relaunch must not overlap the old attempt:
    its trainer may still be writing the SIGTERM checkpoint that the new one resumes from."""
    ranks = live_ranks(job.run_dir, own)
    if not ranks:
        return
    if wait_s <= 0:
        raise RunDirBusy(f"run directory {job.run_dir} is in use by a live job: {describe_ranks(ranks)}; "
                         f"stop it first (`pipeline cancel {job.run_dir}`) or wait for it to end")
    if say:
        say(f"[launcher] waiting up to {wait_s:.0f}s for the previous attempt to exit: {describe_ranks(ranks)}")
    deadline = time.monotonic() + wait_s
    while (ranks := live_ranks(job.run_dir, own)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if ranks:
        raise RunDirBusy(f"the previous attempt in {job.run_dir} did not exit within {wait_s:.0f}s: "
                         f"{describe_ranks(ranks)}; not relaunching over it")


def preflight(job: LaunchJob) -> None:
    """Run the startup checklist in this process; raises `DoctorFailed` with every problem."""
    if not job.run_doctor:
        return
    from basics.errors import DoctorFailed
    from pipelines.doctor import run_doctor_on_file

    report = run_doctor_on_file(job.spec_path, data_dir=job.data_dir, expect_world_size=job.world_size,
                                use_gpu=job.use_gpu, procs_per_node=job.procs_per_node)
    (job.run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (job.run_dir / "logs" / "doctor.txt").write_text(report.render_text() + "\n")
    if not report.ok:
        raise DoctorFailed(report)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by a parent that forgot it) answers signal 0 too.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _ranks_of(handle: LaunchHandle) -> range | None:
    bounds = handle.extra.get("ranks")
    return range(int(bounds[0]), int(bounds[1])) if bounds else None


class LocalLauncher:
    """All processes of the job on this machine."""

    name = "local"

    def __init__(self) -> None:
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._jobs: dict[str, LaunchJob] = {}

    # -- what differs between local and static
    def _rendezvous(self, job: LaunchJob) -> Rendezvous:
        return Rendezvous(num_machines=1, machine_rank=0, main_ip="127.0.0.1", main_port=free_port())

    def _await_peers(self, job: LaunchJob, say: LogSink) -> None:
        """Before a relaunch, what the other nodes of the job must have done first (static)."""

    def _prelaunch(self, job: LaunchJob) -> None:
        preflight(job)

    def _log_name(self, job: LaunchJob) -> str:
        return "launcher.log"

    def _own_ranks(self, job: LaunchJob) -> range:
        return node_ranks(job, 0)

    # -- the protocol
    def submit(self, job: LaunchJob) -> LaunchHandle:
        logs = job.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / self._log_name(job)
        own = self._own_ranks(job)
        await_previous_attempt(job, job.wait_previous_s, self._say(log_path), own)
        self._await_peers(job, self._say(log_path))
        (job.run_dir / CANCEL_MARKER).unlink(missing_ok=True)
        self._prelaunch(job)
        token = uuid.uuid4().hex
        env = launch_env(job) | {JOB_TOKEN_ENV: token}
        if job.world_size == 1:
            # One process: `accelerate launch` would only be a plain parent (see `solo`).
            cmd = [sys.executable, str(SOLO), sys.executable, *job.trainer_args()]
            env = one_process_env(env, job.use_gpu)
        else:
            cmd = accelerate_command(job, self._rendezvous(job))
        with log_path.open("ab") as log:
            log.write(f"[launcher] {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, cwd=Path.cwd(), start_new_session=True)
        handle = LaunchHandle(launcher=self.name, job_id=str(proc.pid), run_dir=job.run_dir,
                              extra={"log": str(log_path), "log_offset": log_path.stat().st_size,
                                     "command": cmd, "grace_seconds": job.grace_seconds, "job_token": token,
                                     "ranks": [own.start, own.stop],
                                     "time_limit_s": job.time_limit_minutes * 60})
        handle.save()
        self._procs[handle.job_id] = proc
        self._jobs[handle.job_id] = job
        return handle

    @staticmethod
    def _say(log_path: Path) -> LogSink:
        def say(line: str) -> None:
            with log_path.open("a") as fh:
                fh.write(line + "\n")
        return say

    def poll(self, handle: LaunchHandle) -> JobState:
        proc = self._procs.get(handle.job_id)
        status = read_result_status(handle.run_dir, not_before=handle.submitted_at)
        if proc is not None:
            code = proc.poll()
            if code is None:
                return JobState(Phase.RUNNING, detail=f"pid {proc.pid}")
        elif _pid_alive(int(handle.job_id)):
            return JobState(Phase.RUNNING, detail=f"pid {handle.job_id}")
        else:
            # Not our child: the exit code is gone; the trainer's result marker tells the outcome.
            code = 0 if status == "finished" else None
        # The leader is gone; the job is not over while any rank still holds its lock.
        ranks = live_ranks(handle.run_dir, _ranks_of(handle))
        if ranks:
            return JobState(Phase.RUNNING, detail=f"launcher exited ({code}); still alive: {describe_ranks(ranks)}")
        if cancel_requested(handle.run_dir):
            return JobState(Phase.CANCELLED, code, status, "cancelled by request")
        if code == 0:
            return JobState(Phase.SUCCEEDED, 0, status)
        if code is None:
            return JobState(Phase.UNKNOWN, None, status, "process gone, no result.json")
        # accelerate / torch elastic exit 1 whatever ended a rank; their log names the rank and its code.
        log = Path(handle.extra.get("log", handle.run_dir / "logs" / "launcher.log"))
        failed = process_failure(log, int(handle.extra.get("log_offset", 0)))
        if failed is not None:
            return JobState(Phase.FAILED, failed.exit_code, status, failed.describe(), failure=failed.describe())
        return JobState(Phase.FAILED, code, status, describe_exit(code))

    def wait(self, handle: LaunchHandle, timeout: float | None = None, on_log: LogSink | None = None) -> JobState:
        tail = LogTail([Path(handle.extra.get("log", handle.run_dir / "logs" / "launcher.log"))],
                       start_offset=int(handle.extra.get("log_offset", 0)))
        limit = float(handle.extra.get("time_limit_s", 0)) or None

        def over_time() -> JobState | None:
            # Nothing else enforces the job's time limit on this machine.
            if limit is None or time.time() - handle.submitted_at <= limit:
                return None
            gone = self._stop(handle)
            return JobState(Phase.TIMEOUT, self.poll(handle).exit_code, detail=f"time limit reached; {gone}")

        return follow(lambda: self.poll(handle), tail, interval=POLL_SECONDS, timeout=timeout, on_log=on_log,
                      over_time=over_time)

    def cancel(self, handle: LaunchHandle) -> JobState:
        (handle.run_dir / CANCEL_MARKER).write_text(f"{time.time()}\n")
        gone = self._stop(handle)
        state = self.poll(handle)
        return JobState(state.phase, state.exit_code, state.result_status,
                        f"{state.detail}; {gone}" if state.detail else gone)

    def _stop(self, handle: LaunchHandle) -> str:
        """SIGTERM to the launcher's group and every live rank, SIGKILL after the grace period;
        returns once no rank is alive (bounded), with a sentence saying whether any is left."""
        pgid = int(handle.job_id)  # start_new_session: the leader's pid is the group id
        grace = float(handle.extra.get("grace_seconds", 60.0))
        started = time.monotonic()
        self._signal_job(handle, pgid, signal.SIGTERM)
        if self._wait_gone(handle, pgid, grace):
            return f"stopped after SIGTERM in {time.monotonic() - started:.1f}s; no rank alive"
        self._signal_job(handle, pgid, signal.SIGKILL)
        if self._wait_gone(handle, pgid, KILL_WAIT_S):
            return f"killed after the {grace:.0f}s grace period; no rank alive"
        return f"STILL ALIVE after SIGKILL: {describe_ranks(live_ranks(handle.run_dir, _ranks_of(handle)))}"

    def _signal_job(self, handle: LaunchHandle, pgid: int, sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        # Ranks live in sessions of their own: signal each one directly (pids from their locks).
        signal_ranks(live_ranks(handle.run_dir, _ranks_of(handle)), sig)

    def _wait_gone(self, handle: LaunchHandle, pgid: int, limit: float) -> bool:
        deadline = time.monotonic() + limit
        while True:
            if not self._group_alive(handle, pgid) and not live_ranks(handle.run_dir, _ranks_of(handle)):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def _group_alive(self, handle: LaunchHandle, pgid: int) -> bool:
        proc = self._procs.get(handle.job_id)
        if proc is not None:
            return proc.poll() is None  # also reaps the leader so it does not linger as a zombie
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return _pid_alive(pgid)
