"""How a command ends on an error: one line on stderr, the error's exit code, no traceback.

The one `fail` every command module uses (`raise fail(exc) from None`); the exit codes
themselves are the error registry in `validation.errors`.
"""

from __future__ import annotations

from collections.abc import Iterable

import typer

from validation.errors import Issue, PipelineError, SpecError


def fail(exc: PipelineError) -> typer.Exit:
    """Print `error: <one line>` and return the `typer.Exit` to raise (its code from the registry)."""
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(exc.exit_code)


def fail_issues(issues: Iterable[Issue]) -> typer.Exit:
    """Print every spec issue as `file:line:col: field: message` and return the exit to raise."""
    for issue in issues:
        typer.echo(issue.text())
    return typer.Exit(SpecError.exit_code)
