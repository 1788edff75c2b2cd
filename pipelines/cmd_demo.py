"""`pipeline demo` (`make demo`): the experiment PR flow on one laptop, with real data and a local MLflow.

0. what it will cost: the plan's wall time for every training (the experiment's seeds and its
   baseline's), printed before any work starts;
1. build the demo corpus from this interpreter's standard library (no download);
2. what CI does on the PR: validate every experiment, plan the chosen one (its baseline priced,
   as `pipeline plan` prices it);
3. what `/train` does: run the experiment end to end, its baseline first on the same seeds
   (data checks, smoke, training, evaluation), then the comparison report;
4. the comment's first screen as a terminal shows it (the full comment is written to the run
   directory, no token needed), then the next steps.

Only the pipeline's own lines reach the terminal: what libraries print on their own (MLflow
creating its tables, lm-eval's notices, their progress bars, warnings) goes to the demo's log
(`runs/logs/demo-<time>.log`), named at the start and the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated, Any

import typer

from basics.errors import PipelineError, UsageError
from pipelines.exits import fail

DEFAULT_EXPERIMENT = "next-line-lr"
"""What `make demo` runs (the Makefile's EXPERIMENT; a test holds the two equal)."""
OVERHEAD_S = 35
"""What a demo spends beside its runs' own wall time (what the plan prices): the speed measurement,
corpus, data preparation and checks, smoke run, report, and each training's process start-up.
Measured from a fresh clone on an idle 2-core machine: 37 s of a 111 s `make demo` whose six
runs took 74 s (README)."""


def demo(
    experiment: Annotated[str, typer.Option(help="Example experiment to run end to end (experiments/<name>.yaml).")]
    = DEFAULT_EXPERIMENT,
) -> None:
    """The whole PR flow on this machine: build the demo corpus, validate and plan every example,
    then run one experiment end to end (baseline included) with local MLflow."""
    from basics.paths import repo_root_from_cwd

    try:
        run_demo(repo_root_from_cwd(), experiment)
    except PipelineError as exc:
        raise fail(exc) from None


def register(app: typer.Typer) -> None:
    app.command()(demo)


@contextlib.contextmanager
def captured(log_path: Path) -> Iterator[IO[str]]:
    """File descriptors 1 and 2 go to `log_path` (this process's and every child's output: MLflow's
    and lm-eval's logging, tqdm bars, warnings); yields a text stream on the real terminal."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    streams = sys.stdout, sys.stderr
    with log_path.open("ab") as log, log_path.open("a", buffering=1, encoding="utf-8", errors="replace") as text:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = text  # Python-level writers that no longer go through fd 2 too
        try:
            yield terminal
        finally:
            sys.stdout, sys.stderr = streams
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            terminal.flush()
            terminal.close()


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def expected_time(plan: Any, baseline_plan: Any) -> tuple[float, str]:
    """(seconds, how they add up) from the plan: every seed of the experiment and of its baseline
    trained one after another at the plan's wall time, plus OVERHEAD_S."""
    runs = plan.seeds
    base_runs = plan.cost.baseline_runs if plan.cost is not None else 0
    total = runs * plan.compute.wall_seconds + OVERHEAD_S
    parts = f"{runs} training{'s' if runs != 1 else ''} x {minutes(plan.compute.wall_seconds)}"
    if base_runs and baseline_plan is not None:
        total += base_runs * baseline_plan.compute.wall_seconds
        parts += f" + baseline {base_runs} x {minutes(baseline_plan.compute.wall_seconds)}"
    how = (f"{parts} (the plan, at {plan.compute.assumed_mfu:.2g} of the peak: {plan.compute.mfu_source}) + about "
           f"{minutes(OVERHEAD_S)} of corpus, checks, smoke run and report; runs already finished are reused")
    return total, how


def run_demo(repo: Path, experiment: str) -> None:
    from rich.console import Console

    from basics.paths import experiment_file, experiment_names
    from pipelines import machine_speed
    from pipelines.rundir import runs_root
    from validation.loader import load_spec
    from validation.plan import make_plan
    from validation.resolved import resolve

    started = time.time()
    found = experiment_file(repo, experiment)
    if found is None:
        choices = experiment_names(repo)
        raise UsageError(f"no experiment '{experiment}' in {repo / 'experiments'}; choose one of {', '.join(choices)}")
    spec_path = found
    spec = load_spec(spec_path)
    resolved = resolve(spec_path, repo)
    baseline_spec = load_spec(Path(resolved.baseline.file)) if resolved.baseline.file else None
    log_path = runs_root(repo) / "logs" / f"demo-{time.strftime('%Y%m%dT%H%M%S')}.log"

    out = Console(stderr=True, highlight=False)
    out.rule(f"pipeline demo: {experiment}")
    # A CPU's speed is this machine's now, not a catalogue's: the plan, the expected time and the
    # cost each run records at launch are priced from one measurement (validation.plan.cpu_speed).
    out.print("measuring    this machine's CPU speed: a few training steps of the experiment's model ...")
    warnings: list[str] = []
    with captured(log_path) as _:
        measured = machine_speed.for_experiment(spec, resolved, baseline_spec, warnings.append)
    for line in warnings:
        out.print(f"[yellow]warning[/]      {line}")
    out.print(f"measured     {machine_speed.describe(measured)}")
    plan = make_plan(spec, baseline=baseline_spec, measured_cpu=measured)
    baseline_plan = make_plan(baseline_spec, measured_cpu=measured) if baseline_spec is not None else None
    expected, how = expected_time(plan, baseline_plan)
    out.print(f"expected     about {minutes(expected)}: {how}")
    out.print(f"library output (MLflow, lm-eval, progress bars, warnings) goes to {_shown(log_path, repo)}")
    report_dir: Path | None = None
    tracking_uri = ""
    try:
        with captured(log_path) as terminal:
            console = Console(file=terminal, highlight=False)
            report_dir, tracking_uri = _run(repo, experiment, spec_path, plan, console, measured)
    except BaseException:
        out.print(f"[red]stopped[/] after {minutes(time.time() - started)}; what the libraries printed is in "
                  f"{_shown(log_path, repo)}")
        raise
    summary = report_dir / "summary.txt" if report_dir is not None else None  # reports.publish.SUMMARY_NAME
    out.rule("4. the pull request comment: its first screen")
    if summary is not None and summary.is_file():
        out.print(summary.read_text(encoding="utf-8").rstrip(), markup=False)
    took = time.time() - started
    out.rule("next steps")
    for line in next_steps(repo, experiment, report_dir, log_path, tracking_uri):
        out.print(line, markup=False)
    out.print(f"\ndemo took {minutes(took)} (expected about {minutes(expected)}, from this machine's speed when it "
              "started; other work on the machine changes it)")


def _shown(path: Path, repo: Path) -> str:
    try:
        return str(path.relative_to(repo))
    except ValueError:
        return str(path)


def _run(repo: Path, experiment: str, spec_path: Path, plan: Any, console: Any,
         measured: tuple[Any, ...]) -> tuple[Path | None, str]:
    """Steps 1-3 (their output on `console`, everything else in the log): the report directory
    and the tracking URI."""
    from basics.paths import experiment_files
    from pipelines.dataprep.demo_corpus import build_demo_corpus
    from pipelines.dataprep.demo_eval_task import build_demo_task
    from pipelines.orchestrate import ExperimentFlow, RunOptions
    from pipelines.progress import RichReporter
    from validation.loader import load_spec
    from validation.plan import render_plan_text

    console.rule("1. demo corpus (standard library of this interpreter)")
    demo_dir = repo / "data" / "demo"
    build_demo_corpus(demo_dir)
    build_demo_task(demo_dir)  # the downstream task's examples (data/tasks/demo_next_line.yaml)
    for f in sorted(demo_dir.glob("*.jsonl")):
        console.print(f"  {f.relative_to(repo)}  {f.stat().st_size / 1e6:.2f} MB")

    console.rule("2. pull request checks: validate and plan")
    for f in experiment_files(repo / "experiments"):
        spec = load_spec(f)
        console.print(f"  [green]valid[/] {f.relative_to(repo)}  hypothesis: {spec.hypothesis.metric} "
                      f"{spec.hypothesis.direction} >= {spec.hypothesis.min_effect:.0%} vs {spec.hypothesis.baseline}")
    console.print(render_plan_text(plan), markup=False)

    console.rule(f"3. /train {experiment}: baseline and candidate, then the report")
    trainings = plan.seeds + (plan.cost.baseline_runs if plan.cost is not None else 0)
    flow = ExperimentFlow(repo, RunOptions(measured_cpu=measured), RichReporter(console, trainings=trainings))
    candidate, _ = flow.run(spec_path)
    return candidate.report_dir, flow.tracking_uri


def next_steps(repo: Path, experiment: str, report_dir: Path | None, log_path: Path, tracking_uri: str) -> list[str]:
    """What to do after the demo: read the comment, compare the runs in MLflow, write an experiment."""
    lines = []
    if report_dir is not None:
        comment = report_dir / "comment.md"
        lines.append(f"read the comment      {_shown(comment if comment.is_file() else report_dir / 'report.md', repo)}"
                     "  (markdown, as the pull request shows it; the curves as PNG beside it)")
        context = _context(report_dir)
        if tracking_uri.startswith("sqlite:///"):
            lines.append(f"compare the runs      mlflow ui --backend-store-uri {tracking_uri}")
        elif tracking_uri and tracking_uri != "none":
            lines.append(f"compare the runs      MLflow at {tracking_uri}")
        if context.get("compare_url"):
            lines.append(f"                      then open {context['compare_url']}")
    lines += [
        f"try your own change   cp experiments/{experiment}.yaml experiments/mine.yaml, change `name` and one "
        "setting, then `pipeline plan experiments/mine.yaml` and `pipeline run experiments/mine.yaml`",
        "another example       make demo EXPERIMENT=more-code  (a data-mixture change; finished runs are reused)",
        f"library output        {_shown(log_path, repo)}",
    ]
    return lines


def _context(report_dir: Path) -> dict[str, Any]:
    try:
        result = json.loads((report_dir / "result.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    context = result.get("context") if isinstance(result, dict) else None
    return context if isinstance(context, dict) else {}
