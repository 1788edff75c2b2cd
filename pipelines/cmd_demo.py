"""`pipeline demo` (`make demo`): the experiment PR flow on one laptop, with real data and a local MLflow.

1. build the demo corpus from this interpreter's standard library (no download);
2. what CI does on the PR: validate every experiment, plan the chosen one;
3. what `/train` does: run the experiment end to end, its baseline first on the same seeds
   (data checks, smoke, training, evaluation), then the comparison report;
4. the sticky comment is written to the run directory (no token needed).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from pipelines.exits import fail
from validation.errors import PipelineError, UsageError


def demo(
    experiment: Annotated[str, typer.Option(help="Example experiment to run end to end.")] = "higher-lr",
) -> None:
    """The whole PR flow on this machine: build the demo corpus, validate and plan every example,
    then run one experiment end to end (baseline included) with local MLflow."""
    from validation.paths import repo_root_from_cwd

    try:
        run_demo(repo_root_from_cwd(), experiment)
    except PipelineError as exc:
        raise fail(exc) from None


def register(app: typer.Typer) -> None:
    app.command()(demo)


def run_demo(repo: Path, experiment: str) -> None:
    from rich.console import Console

    from pipelines.dataprep.demo_corpus import build_demo_corpus
    from pipelines.dataprep.demo_eval_task import build_demo_task
    from pipelines.orchestrate import ExperimentFlow, RunOptions, summary_lines
    from pipelines.progress import RichReporter
    from validation.loader import load_spec
    from validation.paths import experiment_file, experiment_files, experiment_names
    from validation.plan import make_plan, render_plan_text

    console = Console(stderr=True)
    started = time.time()
    found = experiment_file(repo, experiment)
    if found is None:
        choices = experiment_names(repo)
        raise UsageError(f"no experiment '{experiment}' in {repo / 'experiments'}; choose one of {', '.join(choices)}")
    spec_path = found

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
    spec = load_spec(spec_path)
    console.print(render_plan_text(make_plan(spec)))

    console.rule(f"3. /train {experiment}: baseline and candidate, then the report")
    reporter = RichReporter()
    flow = ExperimentFlow(repo, RunOptions(), reporter)
    candidate, baseline = flow.run(spec_path)

    console.rule("4. the pull request comment")
    assert candidate.report_dir is not None
    shown = candidate.report_dir / "comment.md"
    text = shown.read_text(encoding="utf-8")
    console.print(text[:3000] + ("\n..." if len(text) > 3000 else ""), markup=False, highlight=False)
    console.rule("summary")
    for line in summary_lines(candidate, baseline, flow.tracking_uri):
        print(line)
    print(f"comment      {shown}")
    print(f"demo took    {time.time() - started:.0f} s")
