"""`pipeline smoke FILE` and `pipeline replay-metrics RUN_DIR`: the train area's commands.

`smoke` runs the real trainer code path with the model shrunk and a few dozen steps, in
this process (no launcher): the loss is finite and falls when overfitting one batch, a
checkpoint saves, validates and resumes to the same losses, throughput is recorded. It
writes a JSON result (the PR check uploads it) and exits 5 when a check fails.

`replay-metrics` sends a run's spooled MLflow points (the server was down while it
trained) once the server is back; each (key, step) ends up recorded once.

Cheap to import: torch, transformers and mlflow are imported inside the commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from basics.environment import apply_offline_env
from basics.errors import PipelineError, UsageError
from pipelines.exits import fail


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command("smoke")(smoke)
    app.command("replay-metrics")(replay_metrics)


def smoke(
    spec_file: Annotated[Path, typer.Argument(help="Experiment YAML to smoke-train.", show_default=False)],
    out: Annotated[Path | None, typer.Option(help="Smoke result JSON (default: RUN_DIR/smoke.json).")] = None,
    run_dir: Annotated[Path | None, typer.Option(help="Scratch run directory (default: runs/smoke/<name>).")] = None,
    cache: Annotated[Path | None, typer.Option(help="Data cache root (default: <repo>/data/cache).")] = None,
    tracking_uri: Annotated[str, typer.Option(help="MLflow URI for the smoke run; 'none' (default) logs nothing.")] = "none",
) -> None:
    """Train a shrunk copy of the experiment for a few dozen steps: loss falls, checkpoint resumes equal."""
    apply_offline_env()
    try:
        from basics.paths import find_repo_root
        from validation.resolved import resolve

        if not spec_file.is_file():
            raise UsageError(f"{spec_file}: no such experiment file")
        repo = find_repo_root(spec_file)
        resolved = resolve(spec_file, repo)
        spec = resolved.spec
        from pipelines.dataprep.prepare import prepare_data
        from trainer.smoke import run_smoke

        prepared = prepare_data(spec.data, repo, cache, progress=False)
        target = run_dir or repo / "runs" / "smoke" / spec.name
        result = run_smoke(resolved, prepared, target, tracking_uri=tracking_uri)
        if result["status"] == "passed":
            from pipelines.layout_probe import run_layout_probe

            sharded = run_layout_probe(resolved, prepared, Path(target) / "sharded")
            if sharded is not None:  # the layout is sharded: 2 CPU processes of its kind ran too
                result["sharded"] = sharded
                result["checks"] |= sharded["checks"]
                result["status"] = sharded["status"]
    except PipelineError as exc:
        raise fail(exc) from None
    result["experiment"] = spec.name
    result["data_version"] = prepared.version
    out_path = out or Path(target) / "smoke.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    if result.get("error"):  # a plug-in raised (or the trainer refused it): one line, its traceback in a file
        typer.echo(f"error: smoke {spec.name} failed: {result['error']} (wrote {out_path}; traceback in "
                   f"{result.get('traceback')})", err=True)
        raise typer.Exit(5)
    checks = " ".join(f"{k}={'ok' if v else 'FAIL'}" for k, v in result["checks"].items())
    losses = result["losses"]
    typer.echo(
        f"smoke {spec.name}: {result['status']} in {result['wall_s']:.1f}s; loss {losses[0]:.3f} -> {losses[-1]:.3f}; "
        f"{result['tokens_per_s'] or 0:.0f} tokens/s; {checks}; wrote {out_path}"
    )
    if result.get("sharded") and result["sharded"]["error"]:
        typer.echo(f"sharded smoke ({result['sharded']['layout']}) failed: {result['sharded']['error']}", err=True)
    if result["status"] != "passed":
        from trainer.smoke import failure_line

        typer.echo(f"error: {failure_line(spec.name, result)}", err=True)  # the last line says why
        raise typer.Exit(5)


def replay_metrics(
    run_dir: Annotated[Path, typer.Argument(help="Run directory holding mlflow_spool.jsonl.", show_default=False)],
    tracking_uri: Annotated[str | None, typer.Option(help="MLflow URI (default: the one the run used).")] = None,
) -> None:
    """Send spooled MLflow metrics of a run whose server was unreachable; each point once."""
    apply_offline_env()
    from trainer.spool_replay import replay_spool

    try:
        out = replay_spool(run_dir, tracking_uri)
    except PipelineError as exc:
        raise fail(exc) from None
    typer.echo(f"replayed {out['records']} records into MLflow run {out['run_id']}")
