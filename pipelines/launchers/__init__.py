"""Launchers: run `accelerate launch ... -m trainer` on this host, on Slurm, or at a fixed rendezvous.

```python
from pipelines.launchers import get_launcher, job_from_spec, run_with_retries
job = job_from_spec(spec, spec_path=run / "spec.resolved.json", run_dir=run, data_dir=cache)
launcher = get_launcher(spec.resource.launcher)          # "local" | "slurm" | "static"
handle = launcher.submit(job)                             # doctor first, then start; returns at once
state = launcher.wait(handle, on_log=print)               # or poll(handle) / cancel(handle)
outcome = run_with_retries(launcher, job, on_log=print)   # relaunch after crashes (local/static)
```
A handle is saved to `RUN/launch.json`; `handle_for_run(run_dir)` finds it again from another
process (`pipeline status RUN`, `pipeline cancel RUN`, a detached Slurm job), `running_job(run_dir)`
only while that job has not ended, and `cancel_quietly(run_dir)` stops it as best it can.

  interface  what every launcher speaks: `LaunchJob`, `LaunchHandle` (`RUN/launch.json`), `JobState`,
             the `Launcher` protocol
  local      `local`: `accelerate launch` with N processes on this host; rank locks, grace, cancel
  solo       one process started directly (no `accelerate launch`), in the environment accelerate would give it
  static     `static`: one node of a multi-node job meeting at a fixed rendezvous endpoint
  slurm      `slurm`: the sbatch script, `srun` on every node, polling `scontrol`, requeue
  commands   the `accelerate launch` command line for one machine of a job (pure)
  follow     the loop behind every launcher's `wait`: poll, tail the logs, time limits
  logtail    `LogTail`: follow log files under `RUN/logs/` line by line as they grow
  retry      process-level retry: which endings are relaunched (`classify`, `run_with_retries`)
  supervise  the in-job retry loop of a Slurm batch script (`python -m pipelines.launchers.supervise`)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from basics.errors import LaunchError, PipelineError
from pipelines.launchers.interface import (
    HANDLE_FILE,
    RESULT_FILE,
    JobState,
    Launcher,
    LaunchHandle,
    LaunchJob,
    LogSink,
    Phase,
)
from pipelines.launchers.retry import RetryOutcome, Verdict, classify, run_with_retries

if TYPE_CHECKING:
    from validation.spec import ExperimentSpec

__all__ = [
    "JobState", "LaunchHandle", "LaunchJob", "Launcher", "LogSink", "Phase", "RetryOutcome", "Verdict",
    "cancel_quietly", "classify", "get_launcher", "handle_for_run", "job_from_spec", "run_with_retries", "running_job",
]

LAUNCHER_NAMES = ("local", "slurm", "static")


def get_launcher(name: str) -> Launcher:
    """The launcher called `name` (`local`, `slurm` or `static`)."""
    if name == "local":
        from pipelines.launchers.local import LocalLauncher

        return LocalLauncher()
    if name == "slurm":
        from pipelines.launchers.slurm import SlurmLauncher

        return SlurmLauncher()
    if name == "static":
        from pipelines.launchers.static import StaticLauncher

        return StaticLauncher()
    raise LaunchError(f"unknown launcher '{name}'; choose one of {', '.join(LAUNCHER_NAMES)}")


def job_from_spec(spec: ExperimentSpec, *, spec_path: Path, run_dir: Path, data_dir: Path,
                  tracking_uri: str | None = None, env: Mapping[str, str] | None = None,
                  **overrides: object) -> LaunchJob:
    """A `LaunchJob` with the resources of `spec.resource` (keyword overrides win)."""
    res = spec.resource
    fields: dict[str, object] = dict(
        spec_path=Path(spec_path).resolve(), run_dir=Path(run_dir).resolve(), data_dir=Path(data_dir).resolve(),
        nodes=res.nodes, procs_per_node=res.gpus_per_node or res.cpu_processes, use_gpu=res.gpus_per_node > 0,
        env=dict(env or {}), tracking_uri=tracking_uri, time_limit_minutes=res.time_limit_minutes,
        partition=res.partition, rendezvous=res.rendezvous, max_restarts=spec.train.max_restarts,
    )
    fields.update(overrides)
    return LaunchJob(**fields)  # type: ignore[arg-type]


def handle_for_run(run_dir: Path) -> LaunchHandle:
    """The handle saved by `submit` in `RUN/launch.json`."""
    try:
        return LaunchHandle.load(Path(run_dir))
    except FileNotFoundError as exc:
        raise LaunchError(f"{run_dir}: no launch.json (was this run launched?)") from exc


def running_job(run_dir: Path) -> LaunchHandle | None:
    """The handle of a job launched earlier for `run_dir` that has not ended, else None."""
    if not (run_dir / HANDLE_FILE).exists() or (run_dir / RESULT_FILE).exists():
        return None
    try:
        handle = handle_for_run(run_dir)
        state = get_launcher(handle.launcher).poll(handle)
    except PipelineError:
        return None
    return None if state.done else handle


def cancel_quietly(run_dir: Path) -> None:
    """Cancel the job launched for `run_dir` unless it has written its result; never raises."""
    if not (run_dir / HANDLE_FILE).exists() or (run_dir / RESULT_FILE).exists():
        return
    try:
        handle = handle_for_run(run_dir)
        get_launcher(handle.launcher).cancel(handle)
    except Exception:  # best effort while already failing (or pruning); the caller's error is what is raised
        pass
