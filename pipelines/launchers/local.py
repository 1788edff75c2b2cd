"""`local`: `accelerate launch` with N processes on this host (gloo on CPU, GPUs on a runner).

The launch runs in its own process group (session), so `cancel` reaches the accelerate
launcher and every rank at once: SIGTERM first (the trainer checkpoints and exits),
SIGKILL after `job.grace_seconds`. Output goes to `RUN/logs/launcher.log`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from pipelines.launchers.commands import Rendezvous, accelerate_command, free_port, launch_env
from pipelines.launchers.interface import (
    JobState,
    LaunchHandle,
    LaunchJob,
    LogSink,
    Phase,
    read_result_status,
)
from pipelines.launchers.logtail import LogTail
from pipelines.launchers.retry import CANCEL_MARKER, cancel_requested, describe_exit

POLL_SECONDS = 0.5


def preflight(job: LaunchJob) -> None:
    """Run the startup checklist in this process; raises `DoctorFailed` with every problem."""
    if not job.run_doctor:
        return
    from pipelines.doctor import DoctorFailed, run_doctor_on_file

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


class LocalLauncher:
    """All processes of the job on this machine."""

    name = "local"

    def __init__(self) -> None:
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._jobs: dict[str, LaunchJob] = {}

    # -- what differs between local and static
    def _rendezvous(self, job: LaunchJob) -> Rendezvous:
        return Rendezvous(num_machines=1, machine_rank=0, main_ip="127.0.0.1", main_port=free_port())

    def _prelaunch(self, job: LaunchJob) -> None:
        preflight(job)

    def _log_name(self, job: LaunchJob) -> str:
        return "launcher.log"

    # -- the protocol
    def submit(self, job: LaunchJob) -> LaunchHandle:
        logs = job.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        (job.run_dir / CANCEL_MARKER).unlink(missing_ok=True)
        self._prelaunch(job)
        cmd = accelerate_command(job, self._rendezvous(job))
        log_path = logs / self._log_name(job)
        with log_path.open("ab") as log:
            log.write(f"[launcher] {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=launch_env(job), cwd=Path.cwd(), start_new_session=True)
        handle = LaunchHandle(launcher=self.name, job_id=str(proc.pid), run_dir=job.run_dir,
                              extra={"log": str(log_path), "log_offset": log_path.stat().st_size,
                                     "command": cmd, "grace_seconds": job.grace_seconds,
                                     "time_limit_s": job.time_limit_minutes * 60})
        handle.save()
        self._procs[handle.job_id] = proc
        self._jobs[handle.job_id] = job
        return handle

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
        if cancel_requested(handle.run_dir):
            return JobState(Phase.CANCELLED, code, status, "cancelled by request")
        if code == 0:
            return JobState(Phase.SUCCEEDED, 0, status)
        return JobState(Phase.FAILED if code is not None else Phase.UNKNOWN, code, status,
                        describe_exit(code) if code is not None else "process gone, no result.json")

    def wait(self, handle: LaunchHandle, timeout: float | None = None, on_log: LogSink | None = None) -> JobState:
        tail = LogTail([Path(handle.extra.get("log", handle.run_dir / "logs" / "launcher.log"))],
                       start_offset=int(handle.extra.get("log_offset", 0)))
        limit = float(handle.extra.get("time_limit_s", 0)) or None
        start = time.monotonic()
        while True:
            state = self.poll(handle)
            tail.pump(on_log)
            if state.done:
                tail.pump(on_log, final=True)
                return state
            if limit is not None and time.time() - handle.submitted_at > limit:
                self._stop(handle)
                tail.pump(on_log, final=True)
                return JobState(Phase.TIMEOUT, self.poll(handle).exit_code, detail="time limit reached")
            if timeout is not None and time.monotonic() - start > timeout:
                return state
            time.sleep(POLL_SECONDS)

    def cancel(self, handle: LaunchHandle) -> JobState:
        (handle.run_dir / CANCEL_MARKER).write_text(f"{time.time()}\n")
        self._stop(handle)
        return self.poll(handle)

    def _stop(self, handle: LaunchHandle) -> None:
        pgid = int(handle.job_id)  # start_new_session: the leader's pid is the group id
        grace = float(handle.extra.get("grace_seconds", 60.0))
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not self._group_alive(handle, pgid):
                return
            time.sleep(0.2)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc = self._procs.get(handle.job_id)
        if proc is not None:
            proc.wait()

    def _group_alive(self, handle: LaunchHandle, pgid: int) -> bool:
        proc = self._procs.get(handle.job_id)
        if proc is not None:
            proc.poll()  # reap the leader so it does not linger as a zombie
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
