"""How a command ends on an error: one line on stderr, the error's exit code, no traceback.

The one `fail` every command module uses (`raise fail(exc) from None`); the exit codes
themselves are the error registry in `basics.errors`. `training_failure` turns how a
training job ended into the error `pipeline train` / `run` exits with, so its code agrees
with the trainer's (a startup failure is 14, not the retryable 5).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import typer

from basics.errors import Issue, PipelineError, SpecError, StartupFailed, TrainingError


def fail(exc: PipelineError) -> typer.Exit:
    """Print `error: <one line>` and return the `typer.Exit` to raise (its code from the registry)."""
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(exc.exit_code)


def fail_issues(issues: Iterable[Issue]) -> typer.Exit:
    """Print every spec issue as `file:line:col: field: message` and return the exit to raise."""
    for issue in issues:
        typer.echo(issue.text())
    return typer.Exit(SpecError.exit_code)


def training_failure(experiment: str, seed: int, seed_dir: Path, state: Any) -> PipelineError:
    """The error of a training run that did not finish: from its `result.json` (a failure before
    the first step is `StartupFailed`, exit 14 like the trainer's), else from how the launcher
    saw the job end (`state.detail`: "rank 1 killed by SIGKILL (pid 4242)")."""
    from basics.files import read_json

    result = read_json(seed_dir / "result.json") or {}
    status = result.get("status") or "no result.json"
    reason = result.get("reason") or result.get("message") or getattr(state, "detail", "") or "no reason recorded"
    where = f"(logs: {seed_dir / 'logs'})"
    if result.get("stop_reason") == "startup_failure":
        return StartupFailed(f"training {experiment} seed {seed} failed before its first step: {reason} {where}")
    return TrainingError(f"training {experiment} seed {seed} ended '{status}': {reason} {where}")
