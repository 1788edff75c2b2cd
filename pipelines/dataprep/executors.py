"""Running preparation tasks: datatrove's executors, locally or as a Slurm array job.

datatrove (Hugging Face) is the field's engine for this: `LocalPipelineExecutor` runs a
fixed number of tasks on a pool of local workers, `SlurmPipelineExecutor` submits the
same tasks as a Slurm job array, and both write a completion marker per finished task
(`<stage>/logs/completions/<rank>`) and skip marked tasks when run again, which is what
makes a killed preparation resumable. The tasks themselves are ours
(`pipelines.dataprep.tasks`): datatrove's `DocumentTokenizer` writes its own shard format,
shuffles and has no notion of our cleaning, train/eval split, cross-shard de-duplication
keyed by source or statistics, so we use datatrove for what it is best at (scheduling,
completion, Slurm) and keep the byte format that the trainer and the checks read.

The number of tasks never depends on the number of workers, so the output does not either.
"""

from __future__ import annotations

import copy
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from basics.errors import DataError


@dataclass(frozen=True)
class SlurmOptions:
    """How the preparation's array jobs are submitted (`pipeline data prepare --launcher slurm`)."""

    partition: str | None = None  # None: the cluster's default partition
    time: str = "4:00:00"
    cpus_per_task: int = 1
    mem_per_task: str = "900M"
    max_parallel: int | None = None  # array throttle (%N); None: as many as the cluster runs
    poll_s: float = 0.5


def _completions(logs: Path) -> int:
    folder = logs / "completions"
    return len(os.listdir(folder)) if folder.is_dir() else 0


def _errors(stage_dir: Path) -> list[str]:
    folder = stage_dir / "errors"
    return [p.read_text() for p in sorted(folder.glob("*.txt"))] if folder.is_dir() else []


def run_stage(
    stage: str,
    step: Callable[..., Any],
    tasks: int,
    build: Path,
    workers: int,
    launcher: str = "local",
    slurm: SlurmOptions | None = None,
    on_tick: Callable[[int], None] | None = None,
) -> None:
    """Run `tasks` ranks of `step` (skipping ranks marked complete); raise DataError when any fails."""
    from pipelines.dataprep.tasks import _quiet_datatrove

    _quiet_datatrove()
    stage_dir = build / stage
    logs = stage_dir / "logs"
    shutil.rmtree(stage_dir / "errors", ignore_errors=True)
    if _completions(logs) >= tasks:
        return
    if launcher == "slurm":
        _run_slurm(stage, step, tasks, logs, slurm or SlurmOptions(), on_tick)
    else:
        _run_local(step, tasks, logs, workers, on_tick)
    done = _completions(logs)
    if done < tasks:
        errors = _errors(stage_dir)
        if errors:
            raise DataError(errors[0])
        raise DataError(f"data preparation: {tasks - done} of {tasks} {stage} tasks did not finish "
                        f"(logs in {logs}); run the same command again to resume")


def _local_executor_class() -> Any:
    from datatrove.executor import LocalPipelineExecutor  # type: ignore[import-untyped]

    class PreparationLocalExecutor(LocalPipelineExecutor):  # type: ignore[misc]
        """Quiet in every worker process too (the patch must precede datatrove's task logger); one
        worker runs its tasks in this process without starting any."""

        def run(self) -> Any:
            if self.workers != 1 or self.depends:
                return super().run()
            # datatrove runs one worker's tasks here, in order, but first starts a multiprocess
            # Manager (a server process) only to hold its queue of local ranks: a plain queue does
            # that job, so a one-worker preparation starts no process (same tasks, same bytes).
            from datatrove.utils.stats import PipelineStats  # type: ignore[import-untyped]

            self._launched = True
            ranks = range(self.local_rank_offset, self.local_rank_offset + self.local_tasks)
            if all(map(self.is_rank_completed, ranks)):
                return None
            self.save_executor_as_json()
            local_ranks: queue.Queue[int] = queue.Queue()
            local_ranks.put(0)
            pipeline: list[Any] = getattr(self, "pipeline")  # noqa: B009 - datatrove's attribute is untyped
            stats: list[Any] = []
            for rank in self.get_incomplete_ranks(ranks):
                self.pipeline = copy.deepcopy(pipeline)
                stats.append(self._launch_run_for_rank(rank, local_ranks))
            merged = sum(stats, start=PipelineStats())
            with self.logging_dir.open("stats.json", "wt") as handle:
                merged.save_to_disk(handle)
            return merged

        def _run_for_rank(self, rank: int, local_rank: int = 0, node_rank: int = -1) -> Any:
            from pipelines.dataprep.tasks import _quiet_datatrove

            _quiet_datatrove()
            return super()._run_for_rank(rank, local_rank, node_rank)

    return PreparationLocalExecutor


def _run_local(step: Callable[..., Any], tasks: int, logs: Path, workers: int,
               on_tick: Callable[[int], None] | None) -> None:
    executor = _local_executor_class()(pipeline=[step], tasks=tasks, workers=max(1, min(workers, tasks)),
                                     logging_dir=str(logs), start_method="forkserver")
    failure: list[BaseException] = []

    def target() -> None:
        try:
            executor.run()
        except BaseException as exc:  # re-raised below, in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=target, name="datatrove-executor", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.25)
        if on_tick:
            on_tick(_completions(logs))
    if failure and not _errors(logs.parent):
        exc = failure[0]
        if isinstance(exc, DataError):
            raise exc
        raise DataError(f"data preparation task failed: {type(exc).__name__}: {exc} (logs in {logs})") from exc


def _slurm_executor_class() -> Any:
    from datatrove.executor.slurm import SlurmPipelineExecutor  # type: ignore[import-untyped]

    class PreparationSlurmExecutor(SlurmPipelineExecutor):  # type: ignore[misc]
        """No separate stats-merging job: the driver merges what it needs itself."""

        def launch_merge_stats(self) -> None:
            return None

        def _run_for_rank(self, rank: int, local_rank: int = 0, node_rank: int = -1) -> Any:
            from pipelines.dataprep.tasks import _quiet_datatrove

            _quiet_datatrove()
            return super()._run_for_rank(rank, local_rank, node_rank)

        def get_sbatch_args(self, max_array: int = 1) -> dict[str, Any]:
            args: dict[str, Any] = super().get_sbatch_args(max_array)
            if not args.get("partition"):  # datatrove always writes one; none means the default
                args.pop("partition", None)
            if "mem" in args:  # a memory limit per task, not datatrove's per-CPU default (sbatch takes one)
                args.pop("mem-per-cpu", None)
            return args

    return PreparationSlurmExecutor


def _run_slurm(stage: str, step: Callable[..., Any], tasks: int, logs: Path, options: SlurmOptions,
               on_tick: Callable[[int], None] | None) -> None:
    if shutil.which("sbatch") is None:
        raise DataError("--launcher slurm: sbatch is not on PATH (is this a Slurm login node?)")
    executor_cls = _slurm_executor_class()
    sbatch_args: dict[str, Any] = {"mem": options.mem_per_task}
    executor = executor_cls(
        pipeline=[step], tasks=tasks, time=options.time, partition=options.partition or "",
        cpus_per_task=options.cpus_per_task, workers=options.max_parallel or -1,
        job_name=f"prepare-{stage}", qos="", logging_dir=str(logs), sbatch_args=sbatch_args,
        env_command=f"source {Path(sys.prefix) / 'bin' / 'activate'}", requeue=False, mail_type="NONE",
    )
    try:
        executor.run()
    except subprocess.CalledProcessError as exc:
        raise DataError(f"--launcher slurm: sbatch failed ({exc})") from exc
    job = str(executor.job_id)
    if job in ("-1", "None"):
        return
    while True:
        if on_tick:
            on_tick(_completions(logs))
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], capture_output=True, text=True)
        if out.returncode == 0 and not out.stdout.strip():
            break
        if out.returncode != 0 and "Invalid job id" in out.stderr:
            break
        time.sleep(options.poll_s)
