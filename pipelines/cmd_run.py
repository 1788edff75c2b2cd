"""`pipeline run | train | status | cancel | runs | doctor`: orchestration commands.

Every import of the flow, the launchers, MLflow or torch happens inside the command, so
this module stays cheap to import (it is loaded for every `pipeline` invocation).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from basics.errors import PipelineError, UsageError
from pipelines.exits import fail
from pipelines.progress import RichReporter


def _sigterm_as_interrupt() -> None:
    """SIGTERM (a CI cancel, `kill`) unwinds like Ctrl-C, so launched jobs are cancelled cleanly."""
    import signal

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def _rerun_command() -> str:
    """The command the user actually ran (the hint to rerun must name it, not another one)."""
    import shlex
    import sys

    return "pipeline " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _repo(path: Path | None = None) -> Path:
    """The repository of the spec file `path`, else of the working directory (one rule: `basics.paths`)."""
    from basics.paths import find_repo_root, repo_root_from_cwd

    return find_repo_root(path) if path is not None else repo_root_from_cwd()


def _run_dir(path: Path | None) -> Path | None:
    """--continue-from: a run directory (or `<experiment>/<run-id>`, a run id) that exists."""
    if path is None:
        return None
    from pipelines.rundir import resolve_run

    found = resolve_run(_repo(), str(path))
    if found is None:
        raise fail(UsageError(f"--continue-from {path}: no such run directory"))
    return found


def run(
    file: Annotated[Path, typer.Argument(help="Experiment YAML, e.g. experiments/higher-lr.yaml.")],
    launcher: Annotated[str | None, typer.Option(help="Override resource.launcher: local, slurm or static.")] = None,
    pr: Annotated[int | None, typer.Option(help="Pull request number (tags the runs, targets the comment).")] = None,
    sha: Annotated[str | None, typer.Option(help="Head SHA the run is bound to.")] = None,
    no_smoke: Annotated[bool, typer.Option("--no-smoke", help="Skip the smoke stage.")] = False,
    no_baseline: Annotated[bool, typer.Option("--no-baseline", help="Do not train the baseline first.")] = False,
    force: Annotated[bool, typer.Option(help="Re-run stages and trainings even when a result exists.")] = False,
    tracking_uri: Annotated[str | None, typer.Option(help="MLflow tracking URI (default: sqlite file mlflow.db).")] = None,
    continue_from: Annotated[Path | None, typer.Option(
        "--continue-from", help="Continue this run directory's latest valid checkpoint under FILE's layout "
        "(only parallel, resource and the batch split may differ; same global batch, data and code).")] = None,
    measure_cpu: Annotated[bool, typer.Option(
        "--measure-cpu", help="Price CPU runs from this machine's speed measured first (a few training steps of "
        "the model; a few seconds for small ones), as `pipeline "
        "plan --measure` shows it and `pipeline demo` does: the cost each run records at launch, which the "
        "report compares with what the run used.")] = False,
) -> None:
    """Run every stage of an experiment locally: validate, prepare, check, smoke, train, evaluate, report.

    The hypothesis' baseline runs first (on the same seeds) unless a finished run with the
    current code and data exists; stages already done for the same identity are skipped.
    """
    from pipelines.orchestrate import ExperimentFlow, RunOptions, summary_lines

    if not file.is_file():
        raise fail(UsageError(f"{file}: no such experiment file"))
    measured = _measured(file, launcher) if measure_cpu else ()
    options = RunOptions(launcher=launcher, pr=pr, sha=sha, smoke=not no_smoke, force=force,
                         run_baseline=not no_baseline, tracking_uri=tracking_uri, continue_from=_run_dir(continue_from),
                         measured_cpu=measured)
    reporter = RichReporter()
    flow = ExperimentFlow(_repo(file), options, reporter)
    _sigterm_as_interrupt()
    try:
        candidate, baseline = flow.run(file)
    except PipelineError as exc:
        raise fail(exc) from None
    except KeyboardInterrupt:
        typer.echo("interrupted: running trainings were asked to checkpoint and stop; "
                   f"`{_rerun_command()}` again resumes them", err=True)
        raise typer.Exit(130) from None
    reporter.console.rule("summary")
    for line in summary_lines(candidate, baseline, flow.tracking_uri):
        typer.echo(line)


def _measured(file: Path, launcher: str | None) -> tuple[Any, ...]:
    """`--measure-cpu`: this machine's speed on `file`'s spec, its baseline's and a sweep's trials
    (what `pipeline plan --measure` shows), said on stderr."""
    from pipelines import machine_speed
    from validation.loader import load_spec
    from validation.resolved import resolve

    try:
        spec = load_spec(file)
        resolved = resolve(file, _repo(file))
        baseline = load_spec(Path(resolved.baseline.file)) if resolved.baseline.file else None
    except PipelineError as exc:
        raise fail(exc) from None
    where = launcher or spec.resource.launcher
    if where != "local":
        raise fail(UsageError(f"--measure-cpu measures this machine, but the runs go to the {where} launcher's "
                              "machines: drop --measure-cpu (or set resource.assumed_mfu)"))

    def warn(line: str) -> None:
        typer.echo(f"warning: {line}", err=True)

    measured = machine_speed.for_experiment(spec, resolved, baseline, warn)
    typer.echo(f"measured this machine: {machine_speed.describe(measured)}", err=True)
    return measured


def train(
    file: Annotated[Path, typer.Argument(help="Experiment YAML to train.")],
    launcher: Annotated[str | None, typer.Option(help="local, slurm or static (default: the spec's).")] = None,
    detach: Annotated[bool, typer.Option(help="Submit and return the job id (Slurm) instead of following it.")] = False,
    pr: Annotated[int | None, typer.Option(help="Pull request number.")] = None,
    sha: Annotated[str | None, typer.Option(help="Head SHA the launch is bound to.")] = None,
    tracking_uri: Annotated[str | None, typer.Option(help="MLflow tracking URI.")] = None,
    continue_from: Annotated[Path | None, typer.Option(
        "--continue-from", help="Continue this run directory's latest valid checkpoint under FILE's layout "
        "(only parallel, resource and the batch split may differ; same global batch, data and code).")] = None,
) -> None:
    """Train an experiment (and its baseline when missing) and report; what `/train` runs on a GPU runner."""
    from pipelines.orchestrate import Detached, ExperimentFlow, RunOptions, summary_lines

    if not file.is_file():
        raise fail(UsageError(f"{file}: no such experiment file"))
    options = RunOptions(launcher=launcher, detach=detach, pr=pr, sha=sha, smoke=False, tracking_uri=tracking_uri,
                         continue_from=_run_dir(continue_from))
    reporter = RichReporter()
    flow = ExperimentFlow(_repo(file), options, reporter)
    _sigterm_as_interrupt()
    try:
        candidate, baseline = flow.run(file)
    except Detached:
        for name, seed, run_dir, kind, job_id in flow.detached:
            typer.echo(f"submitted {name} seed {seed}: {kind} job {job_id}  (pipeline status {run_dir})")
        typer.echo(f"detached. Follow with `pipeline status RUN`; `pipeline train {file}` again follows the "
                   "running jobs and writes the report when they finish.")
        return
    except PipelineError as exc:
        raise fail(exc) from None
    except KeyboardInterrupt:
        typer.echo("interrupted: running trainings were asked to checkpoint and stop; "
                   f"`{_rerun_command()}` again resumes them", err=True)
        raise typer.Exit(130) from None
    for line in summary_lines(candidate, baseline, flow.tracking_uri):
        typer.echo(line)


def status(run_ref: Annotated[str, typer.Argument(help="Run directory, <experiment>/<run-id> or run id.")]) -> None:
    """Show the stages of a run and the state of its trainings."""
    from pipelines.rundir import read_json, resolve_run

    run_dir = resolve_run(_repo(), run_ref)
    if run_dir is None:
        raise fail(UsageError(f"{run_ref}: no such run under runs/"))
    typer.echo(f"run {run_dir}")
    for stage in ("validate", "prepare", "check", "smoke", "train", "evaluate", "report"):
        data = read_json(run_dir / "stages" / f"{stage}.json")
        state = "pending" if not data else data.get("status", "?")
        extra = f"  {data.get('message', '')}" if data and data.get("message") else ""
        typer.echo(f"  {stage:<9} {state}{extra}")
    for seed_dir in sorted((run_dir / "train").glob("seed-*")):
        result = read_json(seed_dir / "result.json")
        job = read_json(seed_dir / "launch.json") or {}
        if result:
            fm = result.get("final_metrics", {})
            typer.echo(f"  {seed_dir.name}: {result.get('status')} at step {result.get('steps')} "
                       f"eval/loss={fm.get('eval/loss', float('nan')):.4f}")
        else:
            ckpts = sorted((seed_dir / "checkpoints").glob("step_*"))
            typer.echo(f"  {seed_dir.name}: running or interrupted (job {job.get('job_id', '-')}, "
                       f"last checkpoint {ckpts[-1].name if ckpts else 'none'})")


def cancel(run_ref: Annotated[str, typer.Argument(help="Run directory, <experiment>/<run-id> or run id.")]) -> None:
    """Cancel a run's trainings gracefully: each saves a checkpoint, then stops."""
    from pipelines.launchers import get_launcher, handle_for_run
    from pipelines.rundir import resolve_run

    run_dir = resolve_run(_repo(), run_ref)
    if run_dir is None:
        raise fail(UsageError(f"{run_ref}: no such run under runs/"))
    # A run dir of an experiment holds one trainer run per seed; a seed dir is itself a run.
    candidates = [run_dir] if (run_dir / "launch.json").exists() else sorted((run_dir / "train").glob("seed-*"))
    stopped = 0
    try:
        for seed_dir in candidates:
            if not (seed_dir / "launch.json").exists() or (seed_dir / "result.json").exists():
                continue
            handle = handle_for_run(seed_dir)
            state = get_launcher(handle.launcher).cancel(handle)
            typer.echo(f"{seed_dir.name}: {handle.launcher} job {handle.job_id} -> {state.phase}"
                       + (f" ({state.detail})" if state.detail else ""))
            stopped += 1
    except PipelineError as exc:
        raise fail(exc) from None
    typer.echo(f"cancelled {stopped} running training job(s) of {run_dir}" if stopped
               else f"nothing running in {run_dir}")


def runs(
    experiment: Annotated[str | None, typer.Option(help="Only this experiment.")] = None,
    limit: Annotated[int, typer.Option(help="Rows to show.")] = 20,
    tracking_uri: Annotated[str | None, typer.Option(help="MLflow tracking URI.")] = None,
) -> None:
    """Recent training runs from MLflow: experiment, seed, status, metrics, identity."""
    from rich.console import Console
    from rich.table import Table

    from trainer.mlflow_endpoint import default_tracking_uri

    uri = tracking_uri or default_tracking_uri(_repo())
    try:
        import mlflow
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        exps = client.search_experiments()
        names = {e.experiment_id: e.name for e in exps if not experiment or e.name == experiment}
        found = mlflow.search_runs(experiment_ids=list(names), max_results=limit, order_by=["start_time DESC"],
                                   output_format="list", ) if names else []
    except Exception as exc:  # MLflow raises many types; the user needs one line.
        raise fail(PipelineError(f"cannot read runs from MLflow at {uri}: {exc}")) from None
    table = Table("experiment", "seed", "status", "eval/loss", "eval/bpb", "tokens/s", "identity", "started")
    for r in found:
        m, t = r.data.metrics, r.data.tags
        table.add_row(names.get(r.info.experiment_id, "?"), t.get("pipeline.seed", "-"), r.info.status,
                      f"{m['eval/loss']:.4f}" if "eval/loss" in m else "-", f"{m['eval/bpb']:.4f}" if "eval/bpb" in m else "-",
                      f"{m['perf/tokens_per_s']:.0f}" if "perf/tokens_per_s" in m else "-", t.get("pipeline.identity", "-"),
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(r.info.start_time / 1000)))
    Console().print(table)
    if not found:
        typer.echo(f"no runs yet in {uri}")


def doctor(
    file: Annotated[Path, typer.Argument(help="Experiment YAML that will be trained on this machine.")],
    world_size: Annotated[int | None, typer.Option(help="Expected number of processes (default: from the spec).")] = None,
) -> None:
    """Startup checklist on the machine that will train: config, environment, resources, data, layout."""
    from pipelines.doctor import run_doctor
    from validation.loader import load_spec

    try:
        spec = load_spec(file)
        report = run_doctor(spec, expect_world_size=world_size)
    except PipelineError as exc:
        raise fail(exc) from None
    typer.echo(report.render_text())
    raise typer.Exit(0 if report.ok else 1)


def register(app: typer.Typer) -> None:
    """Add the orchestration commands to the main app."""
    app.command()(run)
    app.command()(train)
    app.command()(status)
    app.command()(cancel)
    app.command()(runs)
    app.command()(doctor)
