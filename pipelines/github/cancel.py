"""`/cancel` through the Actions API, from a trusted job (default-branch code, `actions: write`).

A concurrency group's name is public: any workflow run of the repository (a workflow a pull
request adds, too) can join `experiment-train-<pr>-<experiment>` with `cancel-in-progress` and
stop that training, or queue in a report or promotion job's group so that GitHub drops the
pending one. So the privileged jobs use no concurrency group, and `/cancel` finds the training
itself: runs of `experiment-train.yml` on the default branch, started by a comment or a manual
dispatch (the trusted copy), not completed, with an unfinished job named `train_job_name(pr,
experiment)` (the train job's `name:`), and cancels those runs (`POST /actions/runs/{id}/cancel`).
GitHub then signals the training's processes, which checkpoint before they stop.

The API cancels a whole run: every experiment that run trains stops (one `/train` launches
all the PR's experiments, or the one it names); the job summary lists them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pipelines.github.client import RunJob, WorkflowRunInfo

TRAIN_WORKFLOW_FILE = "experiment-train.yml"
TRUSTED_EVENTS = frozenset({"issue_comment", "workflow_dispatch"})
_JOB = re.compile(r"^train #(\d+) ([a-z0-9][a-z0-9_-]{2,63})$")


def train_job_name(pr: int, experiment: str) -> str:
    """The train job's name in experiment-train.yml: `train #<pr> <experiment>`."""
    return f"train #{pr} {experiment}"


class CancelHost(Protocol):
    def unfinished_runs(self, workflow_file: str) -> list[WorkflowRunInfo]: ...

    def run_jobs(self, run_id: int) -> list[RunJob]: ...

    def cancel_run(self, run_id: int) -> bool: ...


@dataclass(frozen=True)
class Target:
    run_id: int
    experiments: tuple[str, ...]  # every experiment of this PR the run is still training


def targets(runs: Iterable[tuple[WorkflowRunInfo, Sequence[RunJob]]], *, pr: int, experiments: Sequence[str],
            default_branch: str) -> list[Target]:
    """The runs `/cancel` of `experiments` on PR `pr` stops (pure): trusted runs of the train
    workflow with an unfinished train job of this PR for one of those experiments."""
    wanted = set(experiments)
    out = []
    for run, jobs in runs:
        if run.status == "completed" or run.event not in TRUSTED_EVENTS or run.head_branch != default_branch \
                or run.path.rsplit("/", 1)[-1] != TRAIN_WORKFLOW_FILE:
            continue
        training = []
        for job in jobs:
            m = _JOB.match(job.name)
            if m and int(m.group(1)) == pr and job.status != "completed":
                training.append(m.group(2))
        if wanted & set(training):
            out.append(Target(run.id, tuple(sorted(set(training)))))
    return out


def cancel_trainings(host: CancelHost, *, pr: int, experiments: Sequence[str], default_branch: str,
                     skip_run: int | None = None) -> list[Target]:
    """Cancel the runs `targets` finds (never `skip_run`: the run doing the cancelling)."""
    runs = [(run, host.run_jobs(run.id)) for run in host.unfinished_runs(TRAIN_WORKFLOW_FILE) if run.id != skip_run]
    found = targets(runs, pr=pr, experiments=experiments, default_branch=default_branch)
    return [t for t in found if host.cancel_run(t.run_id)]
