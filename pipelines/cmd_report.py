"""`pipeline report`: compare candidate runs with baseline runs and write the report.

Thin: parse, `reports.build_report`, print where it went. Everything heavy (scipy,
matplotlib, mlflow) is imported inside the command, so this module imports fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from basics.errors import PipelineError
from pipelines.exits import fail


def report(
    candidate: Annotated[list[Path], typer.Option(help="Candidate run directory (repeat per seed).")],
    baseline: Annotated[list[Path] | None, typer.Option(help="Baseline run directory (repeat per seed).")] = None,
    spec: Annotated[Path | None, typer.Option(help="Experiment YAML or resolved JSON with the hypothesis "
                                                   "(default: the candidate's spec.resolved.json).")] = None,
    out: Annotated[Path | None, typer.Option(help="Output directory (default: <first candidate>/report).")] = None,
    mlflow_url: Annotated[str | None, typer.Option(help="Public MLflow UI URL for run links.",
                                                   envvar="PIPELINE_MLFLOW_PUBLIC_URL")] = None,
    print_markdown: Annotated[bool, typer.Option("--print", help="Also print the markdown to stdout.")] = False,
) -> None:
    """Compare candidate runs with baseline runs (paired by seed) and write report.md, result.json and plots.

    The verdict is supported, refuted or inconclusive, with its reason. The report is also
    appended to $GITHUB_STEP_SUMMARY when that is set.
    """
    from reports import build_report
    from reports.verdict import headline

    try:
        built = build_report(candidate, baseline or [], spec=spec, out_dir=out, mlflow_url=mlflow_url)
    except PipelineError as exc:
        raise fail(exc) from None
    if print_markdown:
        typer.echo(built.markdown)
    else:  # the comment's first screen and the test, as a terminal shows them (report/summary.txt)
        from reports.publish import SUMMARY_NAME

        summary = built.out_dir / SUMMARY_NAME
        if summary.is_file():
            typer.echo(summary.read_text(encoding="utf-8"))
    v = built.verdict
    typer.echo(f"verdict: {headline(v.outcome, v.reason)}")
    typer.echo(f"report: {built.out_dir / 'report.md'}")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command()(report)
