"""`pipeline data demo | prepare | check`: build the demo corpus, prepare a data version,
run the distribution checks.

Cheap to import: `pipelines.dataprep` (numpy + tokenizers), the spec loader and
great-expectations are imported inside the commands.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from basics.errors import PipelineError, UsageError
from pipelines.exits import fail

if TYPE_CHECKING:
    from validation.resolved import ResolvedExperiment

data_app = typer.Typer(
    name="data",
    help="Demo corpus, versioned data preparation and distribution checks.",
    no_args_is_help=True,
)


def _load(spec_file: Path) -> tuple[ResolvedExperiment, Path]:
    from basics.paths import find_repo_root
    from validation.resolved import resolve

    if not spec_file.is_file():
        raise UsageError(f"{spec_file}: no such experiment file")
    repo = find_repo_root(spec_file)
    return resolve(spec_file, repo), repo


def _baseline_file(value: str | None, resolved: ResolvedExperiment, repo: Path) -> Path | None:
    """A baseline given as an experiment name or a file; default: the resolved hypothesis baseline."""
    from basics.paths import experiment_file

    if value is None:
        return Path(resolved.baseline.file) if resolved.baseline.file else None
    as_path = Path(value)
    if as_path.suffix in (".yaml", ".yml") or as_path.is_file():
        if not as_path.is_file():
            raise UsageError(f"--baseline {value}: no such file")
        return as_path
    found = experiment_file(repo, value)
    if found is None:
        raise UsageError(f"--baseline {value}: no experiment file {value}.yaml or {value}.yml in {repo / 'experiments'}")
    return found


@data_app.command("demo")
def demo(
    out: Annotated[Path, typer.Option(help="Output directory for code/docs/reference .jsonl.")] = Path("data/demo"),
    max_mb: Annotated[float | None, typer.Option(help="Cap every source at this many MB (default: 4 MB code, 1.5 MB docs, 1 MB reference).")] = None,
) -> None:
    """Build the demo corpus from this interpreter's standard library (no download)."""
    from pipelines.dataprep.demo_corpus import build_demo_corpus

    started = time.perf_counter()
    corpus = build_demo_corpus(out, int(max_mb * 1e6) if max_mb else None)
    for name, path in corpus.paths.items():
        typer.echo(f"{name:<10} {corpus.documents[name]:>7} documents  {corpus.bytes[name] / 1e6:6.2f} MB  {path}")
    from pipelines.dataprep.demo_eval_task import build_demo_task

    task = build_demo_task(out)  # the demo's downstream task data (data/tasks/demo_next_line.yaml)
    typer.echo(f"{'task':<10} {sum(1 for _ in open(task, encoding='utf-8')):>7} examples   {task}")
    typer.echo(f"built in {time.perf_counter() - started:.1f} s")


@data_app.command("plan")
def plan(
    spec_file: Annotated[Path, typer.Argument(help="Experiment YAML whose data section to size up.")],
    workers: Annotated[int | None, typer.Option(min=1, help="Workers to estimate for (default: every core).")] = None,
) -> None:
    """Input size, preparation tasks and the estimated preparation time, from file sizes only."""
    from pipelines.dataprep.inputs import estimate_preparation

    try:
        resolved, repo = _load(spec_file)
        est = estimate_preparation(resolved.spec.data, repo, workers)
    except PipelineError as exc:
        raise fail(exc) from None
    minutes = est["estimated_seconds"] / 60
    typer.echo(f"input        {est['input_bytes'] / 1e6:,.1f} MB in {est['tasks']} tasks")
    typer.echo(f"estimate     {minutes:,.1f} min on {est['workers']} worker(s) (measured rate, bench/RESULTS.md)")


@data_app.command("prepare")
def prepare(
    spec_file: Annotated[Path, typer.Argument(help="Experiment YAML whose data section to prepare.")],
    cache: Annotated[Path | None, typer.Option(help="Cache root (default: <repo>/data/cache).")] = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    workers: Annotated[int | None, typer.Option(min=1, help="Local worker processes (default: every core; one for small inputs).")] = None,
    launcher: Annotated[str, typer.Option(help="local (worker processes here) or slurm (an array job per stage, waited for).")] = "local",
    slurm_partition: Annotated[str | None, typer.Option(help="Slurm partition (default: the cluster's default).")] = None,
    slurm_time: Annotated[str, typer.Option(help="Slurm time limit per array task.")] = "4:00:00",
) -> None:
    """Clean, de-duplicate, tokenize and shard the sources; a second run is a cache hit, and a run
    after a crash resumes (finished tasks are not redone). The result is the same for any
    --workers and for --launcher slurm."""
    from pipelines.dataprep.executors import SlurmOptions
    from pipelines.dataprep.prepare import prepare_data

    try:
        if launcher not in ("local", "slurm"):
            raise UsageError(f"--launcher {launcher}: expected local or slurm")
        resolved, repo = _load(spec_file)
        spec = resolved.spec
        started = time.perf_counter()
        prepared = prepare_data(spec.data, repo, cache_root=cache, progress=progress, workers=workers,
                                launcher=launcher, slurm=SlurmOptions(partition=slurm_partition, time=slurm_time))
        elapsed = time.perf_counter() - started
    except PipelineError as exc:
        raise fail(exc) from None
    if as_json:
        typer.echo(json.dumps({"version": prepared.version, "path": str(prepared.path), "cache_hit": prepared.cache_hit,
                               "seconds": round(elapsed, 3), "vocab_size": prepared.vocab_size,
                               "sources": {s: _summary(prepared.stats[s]) for s in prepared.sources}}, indent=1))
        return
    typer.echo(f"data version {prepared.version} ({'cache hit' if prepared.cache_hit else 'prepared'} in {elapsed:.2f} s)")
    typer.echo(f"path         {prepared.path}")
    typer.echo(f"vocabulary   {prepared.vocab_size} tokens")
    typer.echo(f"{'source':<12}{'docs':>8}{'tokens':>11}{'held out':>10}{'dup':>8}{'empty':>8}{'p50 len':>9}{'bytes/tok':>10}")
    for name in prepared.sources:
        st = prepared.stats[name]
        typer.echo(f"{name:<12}{st['documents']:>8}{st['tokens']:>11}{st['eval_documents']:>10}"
                   f"{st['duplicate_rate']:>8.1%}{st['empty_rate']:>8.1%}{st['doc_tokens']['p50']:>9.0f}"
                   f"{st['bytes_per_token']:>10.2f}")


def _summary(st: dict) -> dict:
    keys = ("documents", "train_documents", "eval_documents", "tokens", "duplicate_rate", "empty_rate",
            "bytes_per_token", "non_ascii_ratio")
    return {k: st[k] for k in keys} | {"doc_tokens": st["doc_tokens"]}


@data_app.command("check")
def check(
    spec_file: Annotated[Path, typer.Argument(help="Experiment YAML to check.")],
    baseline: Annotated[str | None, typer.Option(help="Baseline experiment name or YAML file (default: the hypothesis baseline).")] = None,
    out: Annotated[Path | None, typer.Option(help="Directory for data_check.{json,md,html} (default: data/checks/<name>).")] = None,
) -> None:
    """Validate the prepared data with great-expectations: absolute rules and drift vs the baseline."""
    from basics.errors import DataCheckFailed
    from pipelines.dataprep.prepare import prepare_data
    from validation.data.checks import run_data_checks
    from validation.loader import load_spec

    try:
        resolved, repo = _load(spec_file)
        spec = resolved.spec
        base_file = _baseline_file(baseline, resolved, repo)
        prepared = prepare_data(spec.data, repo, progress=False)
        base_spec = load_spec(base_file) if base_file else None
        base_prepared = prepare_data(base_spec.data, repo, progress=False) if base_spec else None
        out_dir = out or repo / "data" / "checks" / spec.name
        result = run_data_checks(spec, prepared, baseline=base_prepared, out_dir=out_dir,
                                 baseline_name=base_spec.name if base_spec else None)
    except PipelineError as exc:
        raise fail(exc) from None
    typer.echo(result.markdown)
    typer.echo(f"written: {out_dir / 'data_check.json'}, {out_dir / 'data_check.md'}, {out_dir / 'data_check.html'}")
    if not result.success:
        raise fail(DataCheckFailed(f"data checks failed for {spec.name}: {result.failed} of {result.total} "
                                    f"expectations not met (see {out_dir / 'data_check.md'})"))


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.add_typer(data_app, name="data")
