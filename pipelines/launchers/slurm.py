"""`slurm`: an sbatch script from the job; `srun` starts `accelerate launch` on every node.

The batch script (`RUN/slurm/job.sbatch`, kept for people to read and resubmit):

1. finds the main address: the first host of `scontrol show hostnames $SLURM_JOB_NODELIST`,
   translated to its `NodeAddr` (the address Slurm itself uses to reach the node; on the
   one-host test cluster the node names n1/n2 do not resolve, their NodeAddr 127.0.0.1 does),
   and a port derived from the job id, so concurrent jobs do not collide;
2. runs the startup checklist on every node (`srun python -m pipelines.doctor`), exit 11 if
   any node refuses;
3. `exec`s the in-job retry loop (`pipelines.launchers.supervise`) around
   `srun --ntasks-per-node=1 bash -c '... --machine_rank "$SLURM_NODEID" ...'`. The per-node
   command is single-quoted, so `$SLURM_NODEID` is expanded by each task's shell, not by
   the batch shell (which would give every node rank 0).

State is followed by polling `scontrol show job` (then `squeue`), never `sbatch --wait`
(which polls at 2, 8, 32 s). After the in-job restarts are used up, a retryable failure
is requeued as a whole job (`scontrol requeue`, up to `max_requeues`), possibly onto
other nodes; the trainer resumes from the checkpoint either way.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pipelines
from basics.errors import LaunchError
from pipelines.launchers.commands import Rendezvous, accelerate_command, launch_env
from pipelines.launchers.follow import follow
from pipelines.launchers.interface import (
    JobState,
    LaunchHandle,
    LaunchJob,
    LogSink,
    Phase,
    read_result_status,
)
from pipelines.launchers.logtail import LogTail
from pipelines.launchers.retry import CANCEL_MARKER, Verdict, cancel_requested, classify

POLL_SECONDS = 1.0
DOCTOR_EXIT_CODE = 11
REPO_ROOT = Path(pipelines.__file__).resolve().parent.parent

# Slurm job states -> our phases. COMPLETING is still running: processes are being cleaned up.
SLURM_PHASES = {
    "PENDING": Phase.PENDING, "CONFIGURING": Phase.PENDING, "REQUEUED": Phase.PENDING,
    "REQUEUE_HOLD": Phase.PENDING, "REQUEUE_FED": Phase.PENDING, "RESV_DEL_HOLD": Phase.PENDING,
    "RUNNING": Phase.RUNNING, "COMPLETING": Phase.RUNNING, "SUSPENDED": Phase.RUNNING,
    "STAGE_OUT": Phase.RUNNING, "SIGNALING": Phase.RUNNING, "RESIZING": Phase.RUNNING,
    "COMPLETED": Phase.SUCCEEDED,
    "FAILED": Phase.FAILED, "OUT_OF_MEMORY": Phase.FAILED, "BOOT_FAIL": Phase.LOST,
    "SPECIAL_EXIT": Phase.FAILED, "STOPPED": Phase.FAILED,
    "CANCELLED": Phase.CANCELLED, "DEADLINE": Phase.TIMEOUT, "TIMEOUT": Phase.TIMEOUT,
    "NODE_FAIL": Phase.LOST, "PREEMPTED": Phase.LOST,
}

# First line of every node's output: which node took which machine rank.
NODE_BANNER = 'echo "[node $SLURM_NODEID] $(hostname -s) machine_rank=$SLURM_NODEID of $SLURM_NNODES, main $MAIN_ADDR:$MAIN_PORT"; '

_SHELL_VARS = {"@NODEID@": '"$SLURM_NODEID"', "@NNODES@": '"$SLURM_NNODES"',
               "@MAIN_ADDR@": '"$MAIN_ADDR"', "@MAIN_PORT@": '"$MAIN_PORT"'}


def _shell_join(words: list[str]) -> str:
    """Quote words for bash, leaving the placeholders as double-quoted variable expansions."""
    return " ".join(_SHELL_VARS.get(w, shlex.quote(w)) for w in words)


def cpus_per_node(job: LaunchJob) -> int:
    # One core per CPU rank; a few data-loading cores per GPU rank.
    return job.procs_per_node * (4 if job.use_gpu else 1)


def render_sbatch(job: LaunchJob, python: str | None = None) -> str:
    """The batch script for `job` (pure: same job, same text)."""
    py = python or sys.executable
    run, logs = job.run_dir, job.run_dir / "logs"
    directives = [
        f"--job-name={job.run_dir.name[:64]}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={cpus_per_node(job)}",
        f"--time={job.time_limit_minutes}",
        f"--output={logs}/slurm-%j.out",
        f"--error={logs}/slurm-%j.err",
        "--open-mode=append",
        "--requeue",
        # SIGTERM to the steps ahead of the time limit: the trainer checkpoints, a requeue resumes.
        f"--signal=TERM@{max(30, min(300, int(job.grace_seconds)))}",
        f"--chdir={REPO_ROOT}",
    ]
    if job.use_gpu:
        directives.append(f"--gres=gpu:{job.procs_per_node}")
    elif job.world_size == 1:
        # One CPU process: accelerate sets its torch threads to every core of the node, while the
        # job asks for 1 CPU, so Slurm packed two such jobs (two sweep trials) onto one node,
        # oversubscribing it, while the other node stayed idle. The node is taken whole, so
        # each trial lands on a free node (multi-process CPU jobs run 1 thread per process).
        directives.append("--exclusive")
    if job.partition:
        directives.append(f"--partition={job.partition}")
    node_cmd = accelerate_command(
        job, Rendezvous(num_machines=job.nodes, machine_rank="@NODEID@", main_ip="@MAIN_ADDR@",
                        main_port="@MAIN_PORT@", num_machines_text="@NNODES@"), python=py)
    # Every task starts from the job's environment; the env of the job goes in explicitly so the
    # script is complete when read or resubmitted by hand.
    env = launch_env(job, base={})
    env["PYTHONPATH"] = f"{REPO_ROOT}"
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    doctor = [py, "-m", "pipelines.doctor", "--spec", str(job.spec_path), "--world-size", str(job.world_size),
              "--data-dir", str(job.data_dir), "--procs-per-node", str(job.procs_per_node)]
    if job.use_gpu:
        doctor.append("--gpu")
    srun = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {d}" for d in directives),
        "# Written by pipelines.launchers.slurm; resubmit with: sbatch " + shlex.quote(str(run / "slurm/job.sbatch")),
        "set -uo pipefail",
        exports,
        "MAIN_HOST=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)",
        "# NodeAddr: how Slurm reaches the node (a node name need not resolve in DNS).",
        "MAIN_ADDR=$(scontrol show node \"$MAIN_HOST\" -o 2>/dev/null | sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')",
        "export MAIN_ADDR=${MAIN_ADDR:-$MAIN_HOST}",
        "export MAIN_PORT=$((20000 + SLURM_JOB_ID % 20000))",
        "echo \"[sbatch] job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0} nodes $SLURM_JOB_NODELIST"
        " main $MAIN_ADDR:$MAIN_PORT\"",
    ]
    if job.run_doctor:
        lines += [
            "# Startup checklist on every node before anything trains.",
            f"{_shell_join(srun + ['--label'] + doctor)} || exit {DOCTOR_EXIT_CODE}",
        ]
    # One process: `accelerate launch` is a plain parent (simple_launcher) that dies on the SIGTERM
    # of a cancel or the time limit, which Slurm sends to every process of the step; srun
    # (--kill-on-bad-exit) then SIGKILLed the trainer before it saved its checkpoint (a pruned
    # sweep trial ended with no result.json). Ignored signals stay ignored across exec, so
    # accelerate survives and waits; the trainer installs its own SIGTERM handler when its loop
    # starts, checkpoints and exits 143 (a TERM during its start-up is ignored; the hard
    # `scancel` after the grace period still ends it). Several processes: torch's elastic agent
    # handles SIGTERM itself and waits for its ranks.
    ignore_term = 'trap "" TERM; ' if job.world_size == 1 else ""
    lines += [
        "# In-job retry loop: a crashed step is relaunched and resumes from the last checkpoint.",
        f"exec {_shell_join([py, '-m', 'pipelines.launchers.supervise', '--run-dir', str(run), '--max-restarts', str(job.max_restarts), '--'])} \\",
        f"  {_shell_join(srun + ['--label', 'bash', '-c'])} {shlex.quote(NODE_BANNER + ignore_term + 'exec ' + _shell_join(node_cmd))}",
    ]
    return "\n".join(lines) + "\n"


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"{cmd[0]} failed: {exc}") from exc
    if check and proc.returncode != 0:
        raise LaunchError(f"{' '.join(cmd[:2])} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


def _requeue(job_id: str, attempts: int = 5) -> None:
    """`scontrol requeue`, retried briefly: right after a job ends the controller can answer
    "Unexpected message received" or "Job is in completing state" while its nodes finish the
    epilogue (seen under load); the requeue succeeds a moment later."""
    for attempt in range(attempts):
        proc = _run(["scontrol", "requeue", job_id], check=False)
        if proc.returncode == 0:
            return
        if attempt + 1 < attempts:
            time.sleep(2)
    raise LaunchError(f"scontrol requeue failed (exit {proc.returncode}) after {attempts} tries: "
                      f"{proc.stderr.strip()}")


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o` output -> its key=value fields (values have no spaces except Command)."""
    return {m[1]: m[2] for m in re.finditer(r"(\w+)=(\S*)", text)}


def state_from_fields(fields: dict[str, str], result_status: str | None, cancelled: bool) -> JobState:
    raw = fields.get("JobState", "UNKNOWN")
    phase = SLURM_PHASES.get(raw, Phase.UNKNOWN)
    code, _, sig = fields.get("ExitCode", "0:0").partition(":")
    exit_code: int | None = int(code) if code.isdigit() else None
    if sig.isdigit() and int(sig) and not exit_code:
        exit_code = -int(sig)
    if phase.terminal and cancelled:
        phase = Phase.CANCELLED
    detail = f"slurm {raw}" + (f" ({fields['Reason']})" if fields.get("Reason", "None") != "None" else "")
    detail += f" restarts={fields.get('Restarts', '0')} nodes={fields.get('NodeList', '')}"
    if not phase.terminal:
        exit_code = None
    return JobState(phase, exit_code, result_status if phase.terminal else None, detail)


class SlurmLauncher:
    """sbatch + srun; the job keeps running without us (detach = just don't wait)."""

    name = "slurm"
    retries_inside = True  # the batch script's loop and `wait`'s requeue; run_with_retries submits once

    def __init__(self, max_requeues: int = 1, requeue_hold_s: int | None = None):
        self.max_requeues = max_requeues
        # Slurm holds a requeued job ~2 minutes (BeginTime) so a sick node can drain; tests shorten it.
        # Not to 0: a relaunch within the second of the requeue is refused ("Job credential revoked").
        self.requeue_hold_s = requeue_hold_s

    def submit(self, job: LaunchJob) -> LaunchHandle:
        for what, path in (("run directory", job.run_dir), ("repository", REPO_ROOT)):
            # sbatch splits an #SBATCH line at whitespace (quotes are not parsed there): the
            # job's --output/--chdir would name another path. Refused before anything is written.
            if any(ch.isspace() for ch in str(path)):
                raise LaunchError(f"slurm launcher: the {what} {str(path)!r} contains whitespace, which #SBATCH "
                                  "directives cannot hold; use a path without spaces (PIPELINE_RUNS_DIR for runs)")
        if shutil.which("sbatch") is None:
            raise LaunchError("slurm launcher: sbatch not found on PATH (is this a Slurm login node?)")
        (job.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (job.run_dir / "slurm").mkdir(parents=True, exist_ok=True)
        (job.run_dir / CANCEL_MARKER).unlink(missing_ok=True)
        script = job.run_dir / "slurm" / "job.sbatch"
        script.write_text(render_sbatch(job))
        out = _run(["sbatch", "--parsable", str(script)]).stdout.strip()
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise LaunchError(f"sbatch answered {out!r} instead of a job id")
        logs = job.run_dir / "logs"
        handle = LaunchHandle(launcher=self.name, job_id=job_id, run_dir=job.run_dir,
                              extra={"script": str(script), "grace_seconds": job.grace_seconds,
                                     "logs": [str(logs / f"slurm-{job_id}.out"), str(logs / f"slurm-{job_id}.err")],
                                     "max_requeues": self.max_requeues})
        handle.save()
        with (logs / "launcher.log").open("a") as fh:
            fh.write(f"[launcher] {time.strftime('%Y-%m-%dT%H:%M:%S')} sbatch {script} -> job {job_id}\n")
        return handle

    def _fields(self, handle: LaunchHandle) -> dict[str, str] | None:
        proc = _run(["scontrol", "show", "job", "-o", handle.job_id], check=False)
        if proc.returncode == 0 and "JobState=" in proc.stdout:
            return parse_scontrol(proc.stdout)
        proc = _run(["squeue", "-h", "-j", handle.job_id, "-o", "%T"], check=False)
        if proc.returncode == 0 and proc.stdout.strip():
            return {"JobState": proc.stdout.split()[0]}
        return None  # purged from the controller (MinJobAge) and no accounting

    def poll(self, handle: LaunchHandle) -> JobState:
        fields = self._fields(handle)
        status = read_result_status(handle.run_dir, not_before=handle.submitted_at)
        if fields is None:
            if status == "finished":
                return JobState(Phase.SUCCEEDED, 0, status, "job no longer known to slurm")
            return JobState(Phase.UNKNOWN, None, status, "job no longer known to slurm; no result.json")
        return state_from_fields(fields, status, cancel_requested(handle.run_dir))

    def wait(self, handle: LaunchHandle, timeout: float | None = None, on_log: LogSink | None = None) -> JobState:
        tail = LogTail([Path(p) for p in handle.extra.get("logs", [])])
        requeues = 0
        last_detail = ""

        def announce(state: JobState) -> None:
            # Slurm's state and reason (pending on resources, requeued, ...) say more than the logs.
            nonlocal last_detail
            if on_log and state.detail.split(" restarts=")[0] != last_detail:
                last_detail = state.detail.split(" restarts=")[0]
                on_log(f"[launcher] job {handle.job_id}: {state.detail}")

        def requeue(state: JobState) -> bool:
            nonlocal requeues
            decision = classify(state.exit_code, state.result_status, cancel_requested(handle.run_dir), state.phase)
            if decision.verdict is not Verdict.RETRY or requeues >= int(handle.extra.get("max_requeues", 0)):
                return False
            requeues += 1
            if on_log:
                on_log(f"[launcher] job {handle.job_id} {decision.reason}; requeue {requeues}")
            _requeue(handle.job_id)
            if self.requeue_hold_s is not None:
                # After the hold the update itself triggers a scheduling pass (none is due soon).
                time.sleep(max(2, self.requeue_hold_s))
                _run(["scontrol", "update", f"JobId={handle.job_id}", "StartTime=now"], check=False)
            # The controller can still report the old end state for a moment: wait it out.
            deadline = time.monotonic() + 60
            while self.poll(handle).done and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS / 4)
            return True

        return follow(lambda: self.poll(handle), tail, interval=POLL_SECONDS, timeout=timeout, on_log=on_log,
                      seen=announce, relaunched=requeue)

    def cancel(self, handle: LaunchHandle) -> JobState:
        (handle.run_dir / CANCEL_MARKER).write_text(f"{time.time()}\n")
        state = self.poll(handle)
        if state.phase is Phase.RUNNING:
            # SIGTERM to the job steps only (the trainer checkpoints), then the hard cancel. Not
            # `--full`: that also signals srun in the batch step, which then SIGKILLs its tasks.
            _run(["scancel", "--signal=TERM", handle.job_id], check=False)
            deadline = time.monotonic() + float(handle.extra.get("grace_seconds", 60.0))
            while time.monotonic() < deadline and not self.poll(handle).done:
                time.sleep(POLL_SECONDS)
        if not self.poll(handle).done:
            _run(["scancel", handle.job_id], check=False)
            while not (state := self.poll(handle)).done:
                time.sleep(POLL_SECONDS)
        return self.poll(handle)
