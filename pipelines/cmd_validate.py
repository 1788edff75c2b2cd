"""`pipeline validate | plan | schema`: the configuration layer on the command line.

`validate` is the first check a pull request gets, on a GitHub-hosted runner, so it
imports only pydantic, PyYAML and the spec modules (a test holds it to that). Every
problem in every file is printed as one line (`path:line:col: field: message`), as a
GitHub annotation (`--format github`) or as JSON; exit code 2 when there is any.
`plan` adds what the run will look like: the resolved spec, what changed against the
baseline (or the base it extends), the parallel layout, memory, compute and approval
tier from `validation.preflight`. `plan --dry-run` adds the full-scale dry run (trainer/dry_run.py:
the real model on fake tensors, sharded over a fake process group, one tracked step).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from basics.errors import Issue, PipelineError, SpecError
from pipelines.exits import fail_issues

if TYPE_CHECKING:
    from validation.loader import LoadedSpec
    from validation.resolved import ResolvedExperiment
    from validation.spec import ExperimentSpec

# Fields that say who and why, not what is trained: left out of the "changes" diff.
_NOT_A_CHANGE = ("$schema", "schema_ref", "name", "owner", "description", "extends", "hypothesis")


class ValidateFormat(StrEnum):
    text = "text"
    json = "json"
    github = "github"


class PlanFormat(StrEnum):
    text = "text"
    json = "json"


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command("validate")(validate)
    app.command("plan")(plan)
    app.command("schema")(schema)


# --------------------------------------------------------------------------- validate


def validate(
    files: Annotated[
        list[Path],
        typer.Argument(help="Experiment YAML files (a directory means its *.yaml and *.yml).", show_default=False),
    ],
    output_format: Annotated[
        ValidateFormat, typer.Option("--format", "-f", help="text, json, or github (workflow annotations).")
    ] = ValidateFormat.text,
) -> None:
    """Check experiment files: every problem, each with file:line:col and what to change. Exit 2 on any."""
    from basics.paths import experiment_files
    from validation.loader import check_spec
    from validation.yaml_source import display_path

    expanded = [p for f in files for p in ((experiment_files(f) or [f]) if f.is_dir() else [f])]
    results: list[dict[str, Any]] = []
    for path in expanded:
        spec, issues = check_spec(path)
        results.append(
            {
                "file": display_path(path),
                "ok": not issues,
                "name": spec.name if spec else None,
                "spec_hash": spec.spec_hash() if spec else None,
                "issues": issues,
            }
        )
    all_issues = [issue for result in results for issue in result["issues"]]

    if output_format is ValidateFormat.json:
        payload = {
            "ok": not all_issues,
            "files": [{**result, "issues": [_issue_dict(i) for i in result["issues"]]} for result in results],
        }
        typer.echo(json.dumps(payload, indent=2))
    elif output_format is ValidateFormat.github:
        for issue in all_issues:
            typer.echo(issue.github())
    else:
        _print_text(results)

    bad_files = sum(1 for r in results if not r["ok"])
    if output_format is not ValidateFormat.json:
        summary = f"{len(results)} file(s): {len(results) - bad_files} ok, {bad_files} with {len(all_issues)} issue(s)"
        typer.echo(summary, err=True)
    if all_issues:
        raise typer.Exit(SpecError.exit_code)


def _issue_dict(issue: Issue) -> dict[str, Any]:
    return {
        "file": issue.file,
        "line": issue.line,
        "col": issue.col,
        "field": issue.field,
        "message": issue.message,
    }


def _print_text(results: list[dict[str, Any]]) -> None:
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.markup import escape

        console = Console(highlight=False, soft_wrap=True)  # one issue = one line, never wrapped
        for result in results:
            if result["ok"]:
                console.print(
                    f"[green]ok[/] {escape(result['file'])} [dim]({result['name']}, spec {result['spec_hash']})[/]"
                )
            for issue in result["issues"]:
                console.print(
                    f"[bold]{escape(issue.file)}:{issue.line}:{issue.col}[/]: [cyan]{escape(issue.field)}[/]: "
                    f"{escape(issue.message)}"
                )
        return
    for result in results:
        if result["ok"]:
            typer.echo(f"ok {result['file']} ({result['name']}, spec {result['spec_hash']})")
        for issue in result["issues"]:
            typer.echo(issue.text())


# --------------------------------------------------------------------------- plan


def plan(
    file: Annotated[Path, typer.Argument(help="One experiment YAML file.", show_default=False)],
    output_format: Annotated[
        PlanFormat, typer.Option("--format", "-f", help="text or json.")
    ] = PlanFormat.text,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Also build the real model at full size on fake tensors, shard it "
                           "over a fake process group of the planned world size and track one training step's "
                           "memory (trainer/dry_run.py); exit non-zero when it fails or disagrees with the plan.")
    ] = False,
    show_resolved: Annotated[
        bool, typer.Option("--resolved", help="Also print the resolved spec (every field with its default, "
                           "about 140 lines); `--format json` always has it.")
    ] = False,
    measure: Annotated[
        bool, typer.Option("--measure", help="Price a CPU run from this machine's speed, measured now (a few "
                           "training steps of the model; a few seconds for small ones): what `pipeline demo` and `pipeline run "
                           "--measure-cpu` record. Without it a CPU run is priced at the recorded utilisation.")
    ] = False,
) -> None:
    """The decision first: layout, memory, time for every run, cost, the effect the seeds can detect,
    reuse, passes over the data, evaluation points; then changes vs the baseline and the estimate."""
    from basics.paths import find_repo_root
    from validation.loader import load_located
    from validation.resolved import resolve_spec

    loaded = load_located(file)
    if loaded.issues:
        raise fail_issues(loaded.issues)
    spec = loaded.spec
    assert spec is not None
    try:
        resolved = resolve_spec(spec, find_repo_root(file), spec_file=file, locate=loaded.locate)
    except SpecError as exc:
        raise fail_issues(exc.issues) from None

    reference, reference_note = _reference_for(resolved, loaded)
    changes = diff_specs(reference.resolved_dict(), spec.resolved_dict()) if reference else []
    baseline_spec = reference if reference is not None and reference.name == resolved.baseline.name else None
    measured = _measured_for(spec, resolved, baseline_spec) if measure else ()
    preflight, preflight_text, preflight_note, plan_obj = _preflight(spec, loaded, baseline_spec, measured)
    decision = _decision(spec, resolved, plan_obj, baseline_spec, Path(resolved.repo_root), measured) \
        if plan_obj is not None else None
    sweep = _sweep_cost(resolved, reference, measured) if spec.sweep is not None and preflight is not None else None
    tier = sweep["tier"] if sweep else (preflight or {}).get("tier")
    preparation = _preparation(spec, Path(resolved.repo_root))
    dry, dry_text, dry_problems = _dry_run(spec) if dry_run else (None, None, [])

    if output_format is PlanFormat.json:
        payload = {
            "experiment": spec.name,
            "file": str(file),
            "spec_hash": spec.spec_hash(),
            "hypothesis": spec.hypothesis.model_dump(mode="json"),
            "compared_with": reference_note,
            "changes": [{"field": f, "from": a, "to": b} for f, a, b in changes],
            "preflight": preflight,
            "preflight_note": preflight_note,
            "decision": decision.to_dict() if decision is not None else None,
            "sweep": sweep,
            "tier": tier,
            "data_preparation": preparation,
            "resolved": spec.resolved_dict(),
            "resolution": {k: v for k, v in resolved.model_dump(mode="json").items() if k not in ("spec", "runs")},
        }
        if dry_run:
            payload["dry_run"] = dry
        typer.echo(json.dumps(payload, indent=2))
        _fail_dry_run(dry_problems)
        return

    h = spec.hypothesis
    lines = [
        f"experiment: {spec.name} (spec {spec.spec_hash()}, {spec.model.parameter_count():,} parameters)",
    ]
    headline = (f"hypothesis: {h.metric} should {h.direction} by >= {h.min_effect:.1%} vs {h.baseline}, "
                f"on {h.seeds} {'paired seeds' if h.seeds > 1 else 'seed'}")
    if decision is not None:
        from validation.plan.decision import render_decision_text

        lines.append(render_decision_text(plan_obj, decision, headline=headline, min_effect=h.min_effect).rstrip())
    else:
        lines += [headline, f"  preflight: {preflight_note}"]
    lines += ["", f"changes vs {reference_note}:" if reference else f"changes: none shown ({reference_note})"]
    if reference and not changes:
        lines.append("  (no training-relevant field differs)")
    lines += [f"  {field}: {_show(before)} -> {_show(after)}" for field, before, after in changes]
    if preflight_text is not None:
        lines += ["", preflight_text.rstrip()]
    if sweep is not None:
        approvals = "refused" if sweep["tier"]["required_approvals"] is None else \
            f"{sweep['tier']['required_approvals']} approval(s)"
        hours = f"{sweep['gpu_hours']:.2f} GPU-hours" if sweep["on_gpu"] else "0 GPU-hours (CPU)"
        lines += [
            "",
            "sweep (the plan above prices one configuration on its seeds):",
            f"  cost                 {sweep['describe']}",
            f"  budget               {hours} of resource.max_gpu_hours {spec.resource.max_gpu_hours:g}",
            f"  tier (whole sweep)   {sweep['tier']['name']}: {approvals} -- {sweep['tier']['reason']}",
            f"  baseline             {sweep['baseline_note']}",
        ]
    lines += ["", _preparation_line(preparation)]
    if not show_resolved:
        lines += ["", "(`--resolved` adds the resolved spec, every field with its default; `--format json` "
                      "has every figure)"]
    if dry_text is not None:  # last but for the resolved spec: the PR workflow cuts it out from here
        lines += ["", dry_text]
    if show_resolved:
        lines += ["", "resolved spec:"]
        lines += ["  " + line for line in _yaml_text(spec.resolved_dict()).splitlines()]
    typer.echo("\n".join(lines))
    _fail_dry_run(dry_problems)


def _dry_run(spec: ExperimentSpec) -> tuple[dict[str, Any], str | None, list[str]]:
    """`trainer.dry_run` on `spec`: its JSON (or `{"error": ...}`), its text, and the failed checks."""
    from basics.errors import DryRunFailed
    from trainer.dry_run import DryRunUnavailable, dry_run

    try:
        result = dry_run(spec)
    except SpecError as exc:
        raise fail_issues(exc.issues) from None
    except DryRunUnavailable as exc:
        return {"skipped": str(exc)}, f"dry run: skipped: {exc}", []
    except DryRunFailed as exc:
        return {"error": str(exc)}, f"dry run: FAILED: {exc}", [str(exc)]
    return result.to_dict(), result.render_text(), result.problems()


def _fail_dry_run(problems: list[str]) -> None:
    """One line per failed dry-run check on stderr, then the trainer's exit code."""
    if not problems:
        return
    from basics.errors import DryRunFailed

    for problem in problems:
        typer.echo(f"error: {problem}", err=True)
    raise typer.Exit(DryRunFailed.exit_code)


def _reference_for(resolved: ResolvedExperiment, loaded: LoadedSpec) -> tuple[ExperimentSpec | None, str]:
    """The baseline experiment's file when there is one, else the base this file extends."""
    from validation.loader import check_spec
    from validation.yaml_source import display_path

    top = loaded.files[0] if loaded.files else None
    candidates: list[Path] = []
    if resolved.baseline.file is not None:
        candidates.append(Path(resolved.baseline.file))
    if len(loaded.files) > 1:
        candidates.append(loaded.files[1])
    for candidate in candidates:
        if not candidate.is_file() or (top is not None and candidate.resolve() == top.resolve()):
            continue
        reference, issues = check_spec(candidate)
        if reference is not None:
            return reference, f"{reference.name} ({display_path(candidate)})"
        return None, f"{display_path(candidate)} does not validate ({len(issues)} issue(s))"
    return None, "no baseline experiment file and no extends base to compare with"


def _measured_for(spec: ExperimentSpec, resolved: ResolvedExperiment, baseline: ExperimentSpec | None) -> tuple[Any, ...]:
    """`--measure`: this machine's speed on the spec, its baseline and a sweep's trials, said on stderr."""
    from pipelines import machine_speed

    def warn(line: str) -> None:
        typer.echo(f"warning: {line}", err=True)

    measured = machine_speed.for_experiment(spec, resolved, baseline, warn)
    typer.echo(f"measured this machine: {machine_speed.describe(measured)}", err=True)
    return measured


def _preflight(spec: ExperimentSpec, loaded: LoadedSpec, baseline: ExperimentSpec | None = None,
               measured: tuple[Any, ...] = ()) -> tuple[dict[str, Any] | None, str | None, str, Any]:
    """Run `validation.plan` if it is available; its SpecError (nothing fits) fails the plan.
    `baseline`: the baseline experiment's spec, priced on the same seeds. Returns the plan as
    JSON, its estimate table (the warnings are in the decision above it), a note and the plan."""
    try:
        from validation.plan import make_plan, render_plan_text
    except ImportError as exc:
        return None, None, f"not available ({exc})", None
    try:
        result = make_plan(spec, locate=loaded.locate, baseline=baseline, measured_cpu=measured)
    except SpecError as exc:
        raise fail_issues(exc.issues) from None
    text = render_plan_text(result, title="estimate (how the figures above are made)", warnings=False)
    return result.to_dict(), text, "ok", result


def _sweep_cost(resolved: ResolvedExperiment, reference: ExperimentSpec | None,
                measured: tuple[Any, ...] = ()) -> dict[str, Any]:
    """The whole sweep priced (`pipelines.sweep.sweep_cost`): trials x selection seeds, the winner
    on the hypothesis seeds and the baseline on the same seeds; its tier is the one that applies.
    `reference` is the spec `_reference_for` loaded: the baseline's file when it has one."""
    from pipelines import sweep as sw
    from validation.resolved import resolve_spec

    try:
        trials = sw.expand_trials(resolved)
        baseline, note = None, "not priced: no baseline experiment file"
        if reference is not None and reference.name == resolved.baseline.name:
            baseline = resolve_spec(reference, resolved.repo_root, seeds=list(resolved.seeds))
            note = (f"{reference.name} on {len(resolved.seeds)} seed(s), counted (nothing is spent "
                    "when its runs already exist)")
        cost = sw.sweep_cost(trials, resolved, baseline, measured)
        tier = sw.sweep_tier(cost, resolved, measured)
    except SpecError as exc:
        raise fail_issues(exc.issues) from None
    return {
        "trials": cost.trials,
        "selection_seeds": cost.selection_seeds,
        "per_trial_device_hours": cost.per_trial_device_hours,
        "confirm_seeds": cost.confirm_seeds,
        "baseline_device_hours": cost.baseline_device_hours,
        "total_device_hours": cost.total_device_hours,
        "on_gpu": cost.on_gpu,
        "gpu_hours": cost.total_device_hours if cost.on_gpu else 0.0,
        "describe": cost.describe(),
        "baseline_note": note,
        "tier": tier.to_dict(),
    }


def _preparation(spec: ExperimentSpec, repo_root: Path) -> dict[str, Any]:
    """Input size, preparation tasks and estimated time (`estimate_preparation`: file sizes only,
    nothing read); a missing input is reported, not fatal (`pipeline validate` names it)."""
    from basics.errors import DataError
    from pipelines.dataprep.inputs import estimate_preparation

    try:
        return estimate_preparation(spec.data, repo_root)
    except (DataError, OSError) as exc:
        return {"error": str(exc)}


def _preparation_line(prep: dict[str, Any]) -> str:
    from validation.plan import format_duration

    if "error" in prep:
        return f"data: not estimated ({prep['error']})"
    return (f"data: {prep['input_bytes'] / 1e6:,.1f} MB in {prep['tasks']} task(s); about "
            f"{format_duration(prep['estimated_seconds'])} to prepare on {prep['workers']} worker(s) "
            "(nothing when this data version is already in the cache; `pipeline data plan` for other worker counts)")


def diff_specs(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Changed leaf fields as (dotted path, before, after); lists of mappings compared per item."""
    flat_before, flat_after = _flatten(before), _flatten(after)
    changes = []
    for key in sorted(set(flat_before) | set(flat_after), key=_field_order(flat_before, flat_after)):
        if key.split(".", 1)[0].split("[", 1)[0] in _NOT_A_CHANGE:
            continue
        old, new = flat_before.get(key, "<unset>"), flat_after.get(key, "<unset>")
        if _section_placeholder(key, old, new, flat_before, flat_after):
            continue  # `sweep: null` on one side, its fields on the other: the fields say it
        if old != new:
            changes.append((key, old, new))
    return changes


def _section_placeholder(key: str, old: Any, new: Any, before: dict[str, Any], after: dict[str, Any]) -> bool:
    other = after if old is None and new == "<unset>" else before if new is None and old == "<unset>" else None
    return other is not None and any(k.startswith(key + ".") for k in other)


def _field_order(*flats: dict[str, Any]) -> Callable[[str], int]:
    order: dict[str, int] = {}
    for flat in flats:
        for key in flat:
            order.setdefault(key, len(order))
    return lambda key: order[key]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        out = {}
        for index, item in enumerate(value):
            out.update(_flatten(item, f"{prefix}[{index}]"))
        return out
    return {prefix: value}


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) or value == "<unset>" else value


def _yaml_text(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)


# --------------------------------------------------------------------------- schema


def schema(
    check: Annotated[
        bool, typer.Option("--check", help="Fail (exit 1) if experiments/schema.json is stale.")
    ] = False,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Where to write (default: <repo>/experiments/schema.json)."),
    ] = None,
) -> None:
    """Generate experiments/schema.json (editor completion) from the spec models."""
    from basics.paths import repo_root_from_cwd
    from validation.schema import is_current, schema_path, write_schema
    from validation.yaml_source import display_path

    target = output or schema_path(repo_root_from_cwd())
    if check:
        if not is_current(target):
            typer.echo(
                f"{display_path(target)} is stale or missing; run `pipeline schema` and commit it", err=True
            )
            raise typer.Exit(1)
        typer.echo(f"{display_path(target)} is up to date")
        return
    written = write_schema(target)
    typer.echo(f"{'wrote' if written else 'unchanged'} {display_path(target)}")


# --------------------------------------------------------------------------- the decision


def _decision(spec: ExperimentSpec, resolved: ResolvedExperiment, plan_obj: Any,
              baseline: ExperimentSpec | None, repo: Path, measured: tuple[Any, ...] = ()) -> Any:
    """`validation.plan.decision.Decision` for `plan_obj`: the figures the spec alone gives, plus
    what the disk knows (finished runs, the prepared data) and `reports.verdict`'s power."""
    from validation.plan import make_plan
    from validation.plan.decision import Decision, data_passes, decision_warnings, eval_points, eval_steps

    compute, cost = plan_obj.compute, plan_obj.cost
    seeds = list(resolved.seeds)
    base_runs = cost.baseline_runs if cost is not None else 0
    base_wall = 0.0
    if base_runs and baseline is not None:
        base_wall = make_plan(baseline, measured_cpu=measured).compute.wall_seconds
    total = len(seeds) * compute.wall_seconds + base_runs * base_wall
    steps = eval_steps(compute.steps, spec.train.eval_interval)
    reuse, reused = _reuse(spec, seeds, baseline if base_runs else None, repo)
    train_wall = None
    if reuse.candidate is not None:
        train_wall = total - reused[0] * compute.wall_seconds - reused[1] * base_wall
    detectable = _detectable(spec, baseline, repo)
    tokens, counted, note = _corpus_tokens(spec, repo)
    passes = data_passes(spec, compute.tokens, tokens, counted, note)
    return Decision(
        experiment=spec.name, runs=len(seeds) + base_runs, total_wall_seconds=total,
        train_wall_seconds=train_wall, eval_points=eval_points(compute.steps, spec.train.eval_interval),
        eval_steps=steps, detectable=detectable, reuse=reuse, data=passes,
        warnings=decision_warnings(spec, steps, passes, detectable), sweep=spec.sweep is not None,
    )


def _finished_runs(repo: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(identity.json, result.json) of every finished training run under runs/, newest first."""
    from pipelines.rundir import read_json, runs_root

    found = []
    for ident_file in sorted(runs_root(repo).glob("*/*/*/train/seed-*/identity.json"), reverse=True):
        result = read_json(ident_file.parent / "result.json")
        ident = read_json(ident_file)
        if isinstance(result, dict) and isinstance(ident, dict) and result.get("status") == "finished":
            found.append((ident, result))
    return found


def _reuse(spec: ExperimentSpec, seeds: list[int], baseline: ExperimentSpec | None,
           repo: Path) -> tuple[Any, tuple[int, int]]:
    """How many planned runs already finished under runs/ with the same spec, data version and
    seed: those `pipeline run` reuses instead of training when the code version matches too.
    The code version needs git (processes); the plan stays process-free and says so. The
    tracking server may hold more (another checkout's runs); the plan reads only this disk."""
    from pipelines.rundir import data_cache_root
    from validation.plan.decision import Reuse

    runs = _finished_runs(repo)
    if not runs:
        return Reuse(0, 0 if baseline is not None else None, "no finished run under runs/"), (0, 0)
    cache = data_cache_root(repo)
    if not cache.is_dir():
        return Reuse(None, None, "no prepared data yet, so no data version to match"), (0, 0)
    try:
        from pipelines.dataprep.inputs import compute_version

        counts = []
        for who in (spec, baseline):
            if who is None:
                counts.append(0)
                continue
            data = compute_version(who.data, repo, cache).version
            done = {ident.get("seed") for ident, _ in runs
                    if ident.get("spec_hash") == who.spec_hash() and ident.get("data_version") == data}
            counts.append(sum(seed in done for seed in seeds))
    except (OSError, PipelineError) as exc:
        return Reuse(None, None, f"the data version is not known yet: {str(exc).splitlines()[0]}"), (0, 0)
    note = ("same spec and data under runs/; reused unless trainer/, validation/ or the model's files "
            "changed since, and the tracking server may hold more")
    return Reuse(counts[0], counts[1] if baseline is not None else None, note), (counts[0], counts[1])


def _seed_values(runs: list[tuple[dict[str, Any], dict[str, Any]]], spec_hash: str, metric: str) -> dict[int, float]:
    """seed -> final `metric` of the newest finished run of `spec_hash` (any code version)."""
    values: dict[int, float] = {}
    for ident, result in runs:
        value = (result.get("final_metrics") or {}).get(metric)
        seed = ident.get("seed")
        if ident.get("spec_hash") == spec_hash and isinstance(seed, int) and isinstance(value, int | float) \
                and value > 0 and seed not in values:
            values[seed] = float(value)
    return values


def _detectable(spec: ExperimentSpec, baseline: ExperimentSpec | None, repo: Path) -> Any:
    """The effect the planned paired seeds detect with `reports.verdict.POWER`, from the verdict's
    own power function. The seed noise (sd of the per-seed log ratios) comes from finished runs
    of this spec and its baseline on shared seeds, else from the baseline's seed spread (x sqrt 2,
    the verdict's seeds hint), at the verdict's upper confidence bound; without runs the line
    gives the effect as a multiple of the noise and at two reference noise levels."""
    from statistics import stdev

    from reports.verdict import POWER, SD_CONFIDENCE, planning_sd
    from validation.plan.decision import Detectable

    h = spec.hypothesis
    n = h.seeds
    multiple = _noise_multiple(n, h.alpha) if n >= 2 else None
    noise, source, measured = None, "", None
    if baseline is not None and n >= 2:
        runs = _finished_runs(repo)
        mine = _seed_values(runs, spec.spec_hash(), h.metric)
        theirs = _seed_values(runs, baseline.spec_hash(), h.metric)
        shared = sorted(set(mine) & set(theirs))
        if len(shared) >= 2:
            measured = stdev(math.log(mine[s] / theirs[s]) for s in shared)
            noise, source = planning_sd(measured, len(shared)), f"{len(shared)} finished paired seeds under runs/"
        elif len(theirs) >= 2:
            measured = math.sqrt(2) * stdev(math.log(v) for v in theirs.values())
            noise, source = planning_sd(measured, len(theirs)), \
                f"the baseline's spread over {len(theirs)} finished seeds x sqrt 2"
        if noise is not None:
            source = f"its {100 * SD_CONFIDENCE:.0f} % upper bound, from {source}, as the verdict sizes seeds"
            if noise <= 0:
                noise, source = None, ""
    if n < 2:
        return Detectable(n, POWER, h.alpha, None)
    if noise is not None:
        return Detectable(n, POWER, h.alpha, multiple, _effect_at(n, noise, h.min_effect, h.alpha, h.direction),
                          noise, source, measured)
    examples = tuple((level, _effect_at(n, level, h.min_effect, h.alpha, h.direction)) for level in (0.005, 0.02))
    return Detectable(n, POWER, h.alpha, multiple, noise_source="no finished runs to measure the seed noise yet",
                      examples=examples)


def _noise_multiple(n: int, alpha: float) -> float | None:
    """k with: detectable log effect = margin + k x sd (`reports.verdict.power` is a function of
    (log effect - margin) sqrt(n) / sd): bisection on the verdict's own power at sd 1."""
    from reports.verdict import POWER, power

    def reaches(k: float) -> bool:
        # "increase" with min_effect 1 puts the margin at log 2 on the log scale; k above it.
        return power(n, 1.0, 1.0, alpha, effect=math.expm1(math.log(2.0) + k), direction="increase") >= POWER

    low, high = 0.0, 1.0
    while not reaches(high):
        low, high = high, high * 2
        if high > 1e6:  # not reached for n >= 2
            return None
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (low, mid) if reaches(mid) else (mid, high)
    return high


def _effect_at(n: int, sd: float, min_effect: float, alpha: float, direction: str) -> float | None:
    """The smallest true relative effect `reports.verdict.power` calls supported with POWER at
    seed noise `sd`; None when not even an effect next to the largest possible is."""
    from reports.verdict import POWER, power

    upper = 0.999999 if direction == "decrease" else 1e6
    if power(n, sd, min_effect, alpha, effect=upper, direction=direction) < POWER:
        return None
    low, high = min_effect, upper
    for _ in range(80):
        mid = (low + high) / 2
        low, high = (low, mid) if power(n, sd, min_effect, alpha, effect=mid, direction=direction) >= POWER \
            else (mid, high)
    return high


BYTES_PER_TOKEN_ESTIMATE = 3.2
"""Input bytes per token when the data is not prepared yet: the demo corpus's byte-level BPE
at vocabulary 2,048 measured 2.98-3.31 (`pipeline data prepare`, per-source bytes/tok); larger
vocabularies pack more bytes into a token, so the passes shown are then a lower bound."""


def _corpus_tokens(spec: ExperimentSpec, repo: Path) -> tuple[dict[str, int] | None, bool, str]:
    """Training tokens per source: the prepared version's counts when it is in the cache, else
    input bytes / BYTES_PER_TOKEN_ESTIMATE (minus the held-out fraction)."""
    from basics.files import read_json
    from pipelines.dataprep.inputs import compute_version
    from pipelines.dataprep.sources import resolve_files
    from pipelines.rundir import data_cache_root

    cache = data_cache_root(repo)
    try:
        if cache.is_dir():
            version = compute_version(spec.data, repo, cache).version
            stats = read_json(cache / version / "stats.json")
            sources = (stats or {}).get("sources") if isinstance(stats, dict) else None
            if isinstance(sources, dict):
                counted = {s.name: int(sources[s.name].get("train_tokens") or 0) for s in spec.data.sources
                           if isinstance(sources.get(s.name), dict)}
                if counted and all(counted.values()):
                    return counted, True, ""
        sizes = {s.name: sum(p.stat().st_size for p in resolve_files(s, repo)) for s in spec.data.sources}
    except (OSError, PipelineError) as exc:
        return None, False, f"the data is not there yet: {str(exc).splitlines()[0]}"
    keep = 1.0 - spec.data.eval_fraction
    estimate = {name: max(1, int(size * keep / BYTES_PER_TOKEN_ESTIMATE)) for name, size in sizes.items()}
    return estimate, False, f"at {BYTES_PER_TOKEN_ESTIMATE:g} bytes/token; `pipeline data prepare` counts them"
