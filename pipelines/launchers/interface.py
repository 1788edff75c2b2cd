"""What every launcher speaks: a job to run, a handle to follow it, its state.

A launcher turns a `LaunchJob` (a resolved spec plus where to run it) into running
`accelerate launch ... -m trainer` processes on one or more machines. The pipeline only
ever talks to the `Launcher` protocol; `local`, `slurm` and `static` are interchangeable.

A handle is also written to `RUN/launch.json`, so `pipeline status RUN` and
`pipeline cancel RUN` work from another process (or after the submitting CI job ended,
for a detached Slurm job).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

LogSink = Callable[[str], None]
"""Receives every log line of a job as it appears (without the trailing newline)."""

HANDLE_FILE = "launch.json"
RESULT_FILE = "result.json"


@dataclass(frozen=True, kw_only=True)
class LaunchJob:
    """One training job: which spec, where its files go, and how many processes where."""

    spec_path: Path
    """`RUN/spec.resolved.json`: the only input the trainer reads."""
    run_dir: Path
    """The run directory (absolute); logs go to `RUN/logs/`, the handle to `RUN/launch.json`."""
    data_dir: Path
    """The prepared data cache (`data/cache/<data-version>`)."""
    nodes: int = 1
    """Machines; the static launcher runs one of them per call."""
    procs_per_node: int = 1
    """Processes per machine (GPUs per node, or CPU processes)."""
    use_gpu: bool = False
    """Train on accelerators; False runs gloo CPU processes."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for every process (added to the launcher's own environment)."""
    tracking_uri: str | None = None
    """MLflow tracking URI passed to the trainer (`--tracking-uri`)."""
    time_limit_minutes: int = 60
    """Wall-clock limit: Slurm `--time`; local/static cancel the job when it is exceeded."""
    partition: str | None = None
    """Slurm partition (the cluster's default when None)."""
    rendezvous: str | None = None
    """`host:port` of node 0 for the static launcher."""
    node_rank: int | None = None
    """This machine's rank for the static launcher (default: env NODE_RANK)."""
    max_restarts: int = 3
    """Automatic relaunches after a crash (from `spec.train.max_restarts`)."""
    program: tuple[str, ...] = ("-m", "trainer")
    """What accelerate runs on every rank: `-m module` or a script path."""
    program_args: tuple[str, ...] = ()
    """Extra trainer arguments (e.g. `--smoke`), after the standard ones."""
    run_doctor: bool = True
    """Run the startup checklist (`pipelines.doctor`) before launching, on every node."""
    grace_seconds: float = 60.0
    """Time between SIGTERM (the trainer checkpoints) and SIGKILL on cancel."""
    wait_previous_s: float = 0.0
    """Local/static: how long `submit` waits for ranks of an earlier job still holding the run
    directory (0: refuse at once; relaunches after a crash wait, see `run_with_retries`)."""
    previous_attempt_ended: float | None = None
    """A relaunch: when this node saw its previous attempt end (`time.time()`); static nodes wait
    for the other nodes' ranks started before it (`StaticLauncher._await_peers`)."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def trainer_args(self) -> list[str]:
        """Arguments after `accelerate launch [options]`: the trainer contract."""
        args = [*self.program, "--spec", str(self.spec_path), "--run-dir", str(self.run_dir),
                "--data-dir", str(self.data_dir)]
        if self.tracking_uri:
            args += ["--tracking-uri", self.tracking_uri]
        return args + list(self.program_args)


class Phase(StrEnum):
    """Life cycle of a job, the same words for every launcher."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    LOST = "lost"
    """Node failure or preemption: the machine went away, not the training."""
    UNKNOWN = "unknown"

    @property
    def terminal(self) -> bool:
        return self not in (Phase.PENDING, Phase.RUNNING)


@dataclass(frozen=True)
class JobState:
    """Where a job is; `exit_code` and `result_status` once it has ended."""

    phase: Phase
    exit_code: int | None = None
    """Exit status of the training process that failed when the launch tool names it (torch
    elastic's root cause, accelerate's child), else of the launch (negative: killed by that signal)."""
    result_status: str | None = None
    """`status` from the trainer's `result.json` (`finished`, `failed`, `stopped`) when written."""
    detail: str = ""
    """Launcher-specific words: Slurm state and reason, signal name, restarts."""
    failure: str = ""
    """Which process ended the job and how, when known: "rank 1 killed by SIGKILL (pid 4242)"."""

    @property
    def done(self) -> bool:
        return self.phase.terminal

    @property
    def ok(self) -> bool:
        return self.phase is Phase.SUCCEEDED


@dataclass(frozen=True)
class LaunchHandle:
    """Enough to find a submitted job again, also from another process."""

    launcher: str
    job_id: str
    """Slurm job id, or the process-group id of the local/static launch."""
    run_dir: Path
    submitted_at: float = field(default_factory=time.time)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def save(self) -> Path:
        path = self.run_dir / HANDLE_FILE
        data = asdict(self) | {"run_dir": str(self.run_dir), "extra": dict(self.extra)}
        # A temporary name of this writer's own: the nodes of a static job share the run
        # directory and save their handles at the same moment (a fixed `launch.tmp` lost the race).
        fd, tmp = tempfile.mkstemp(prefix=f".{HANDLE_FILE}.", suffix=".tmp", dir=self.run_dir)
        os.fchmod(fd, 0o644)  # as readable as the plain file it replaces (mkstemp makes it 0600)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(data, indent=2))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, run_dir: Path) -> LaunchHandle:
        data = json.loads((Path(run_dir) / HANDLE_FILE).read_text())
        return cls(launcher=data["launcher"], job_id=str(data["job_id"]), run_dir=Path(data["run_dir"]),
                   submitted_at=float(data["submitted_at"]), extra=data.get("extra", {}))


@runtime_checkable
class Launcher(Protocol):
    """Start, follow and stop a training job on some machines."""

    name: str

    def submit(self, job: LaunchJob) -> LaunchHandle:
        """Start the job (after the doctor passed) and return at once."""
        ...

    def poll(self, handle: LaunchHandle) -> JobState:
        """The job's state now, without blocking."""
        ...

    def wait(self, handle: LaunchHandle, timeout: float | None = None, on_log: LogSink | None = None) -> JobState:
        """Block until the job ends (or `timeout` seconds pass), streaming its log lines."""
        ...

    def cancel(self, handle: LaunchHandle) -> JobState:
        """Stop gracefully: SIGTERM (the trainer checkpoints), SIGKILL after the grace period."""
        ...


def read_result_status(run_dir: Path, not_before: float = 0.0) -> str | None:
    """`status` of `RUN/result.json` if written at or after `not_before` (stale files ignored)."""
    path = Path(run_dir) / RESULT_FILE
    try:
        if path.stat().st_mtime + 1.0 < not_before:
            return None
        return str(json.loads(path.read_text()).get("status"))
    except (OSError, ValueError):
        return None
