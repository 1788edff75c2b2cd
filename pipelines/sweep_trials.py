"""Running a sweep: its trials at once, pruned at their evals, then the winner on the hypothesis seeds.

`run_sweep(flow, resolved, baseline)` is what `ExperimentFlow.run` does for a spec with a
`sweep:` section. The plan, the cost, the pruner and the choice of the winner are
`pipelines.sweep`'s (pure); this module runs them: each trial is a normal run of the flow
(its own identity, its own job on the launcher), up to `sweep.parallel` at once, and a
watcher thread per trial reports its selection metric at each eval to the pruner and
cancels the trial's job when the pruner says so (the launcher does not retry a cancel).
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from basics.errors import PipelineError, TrainingError
from basics.files import atomic_write_json, read_json
from pipelines import sweep as sw
from pipelines.identity import experiment_key
from pipelines.launchers import cancel_quietly
from pipelines.rundir import new_run_dir
from trainer.checkpoint import format as ckpt

if TYPE_CHECKING:
    from pipelines.orchestrate import ExperimentFlow, ExperimentResult
    from validation.resolved import ResolvedExperiment


def run_sweep(flow: ExperimentFlow, resolved: ResolvedExperiment,
              baseline: ExperimentResult | None) -> ExperimentResult:
    """Trials on the selection seeds, up to `sweep.parallel` at once, each a normal run (own
    identity, own job on the launcher), pruned by successive halving at their evals; the
    winner is then trained on the hypothesis seeds and judged on those only."""
    spec = resolved.spec
    config = spec.sweep
    assert config is not None
    metric, mode = sw.selection(spec)
    trials = sw.expand_trials(resolved)
    measured = flow.options.measured_cpu
    cost = sw.sweep_cost(trials, resolved, baseline.resolved if baseline is not None else None, measured)
    tier = sw.sweep_tier(cost, resolved, measured)
    flow.reporter.stage(spec.name, "plan", "finished", f"sweep: {cost.describe()}; tier {tier.name}")
    if tier.name == "refused":
        raise PipelineError(f"sweep {spec.name}: {cost.describe()}: {tier.reason}")
    for trial in trials:  # data once, before trials race for it
        flow.prepare(trial.spec)
    total_steps = trials[0].resolved.compute.steps
    pruner = (sw.SuccessiveHalving(mode, config.reduction_factor, min(spec.train.eval_interval, total_steps))
              if config.prune else None)

    def run_trial(trial: sw.Trial) -> sw.TrialOutcome:
        return _run_trial(flow, trial, metric, pruner, baseline, total_steps)

    with ThreadPoolExecutor(max_workers=config.parallel, thread_name_prefix="trial") as pool:
        outcomes = list(pool.map(run_trial, trials))
    winner = sw.select_winner(outcomes, mode)
    if winner is None:
        table = sw.render_trials_markdown(outcomes, None, metric, mode, total_steps=total_steps, cost=cost)
        raise TrainingError(f"sweep of {spec.name}: no trial finished\n{table}")
    # The winner, on fresh seeds: none of the hypothesis seeds took part in picking it.
    confirm = sw.winner_experiment(resolved, winner.trial)
    table = sw.render_trials_markdown(outcomes, winner, metric, mode, total_steps=total_steps,
                                      selection=sw.selection_seeds(spec), decided=list(confirm.seeds), cost=cost)
    flow.sweep_tables[confirm.spec.name] = table  # the winner's report stage appends it
    chosen = flow.run_one(confirm, role="candidate", baseline=baseline)
    chosen.extra.update(sweep_markdown=table, sweep_winner=winner.trial.name, sweep_outcomes=outcomes)
    return chosen


def _run_trial(flow: ExperimentFlow, trial: sw.Trial, metric: str, pruner: sw.SuccessiveHalving | None,
               baseline: ExperimentResult | None, total_steps: int) -> sw.TrialOutcome:
    """One trial as a normal run; a watcher reports its selection metric at each eval to the
    pruner and cancels the job when the pruner says so (the launcher does not retry a cancel)."""
    spec = trial.spec
    prepared = flow.prepare_quietly(spec)
    run_dir = new_run_dir(flow.repo, spec.name, experiment_key(flow.code_for(spec), spec.spec_hash(), prepared.version,
                                                               list(trial.resolved.seeds)))
    first = run_dir / "train" / f"seed-{trial.resolved.seeds[0]}"
    stop = threading.Event()
    pruned_at: list[int] = []
    if pruner is not None:
        pruner.start(trial.index)

        def watch() -> None:
            while not stop.wait(0.5):
                for row in _metric_rows(first / "metrics.jsonl", metric):
                    if pruner.report(trial.index, *row):
                        pruned_at.append(row[0])
                        atomic_write_json(first / "pruned.json", {"step": row[0], "metric": metric})
                        flow.reporter.stage(spec.name, "train", "pruned", f"at step {row[0]} ({metric} {row[1]:.4g})")
                        cancel_quietly(first)
                        return

        threading.Thread(target=watch, name=f"prune-{trial.name}", daemon=True).start()
    try:
        res = flow.run_one(trial.resolved, role="trial", baseline=baseline)
    except TrainingError as exc:  # a failed or pruned trial is reported, not hidden
        stop.set()
        if pruned_at:
            if pruner is not None:
                pruner.finish(trial.index, None, pruned=True)
            # Steps it really trained: a trainer stopped gracefully (SIGTERM) finishes the
            # step under way and checkpoints it, e.g. pruned at 4, checkpoint step 5 on Slurm.
            saved = ckpt.list_checkpoints(first / "checkpoints")
            steps = max(pruned_at[0], saved[0][0] if saved else 0)
            return sw.TrialOutcome(trial, "pruned", None, pruned_at=pruned_at[0], steps_done=steps)
        if pruner is not None:
            pruner.finish(trial.index, None, pruned=False)
        return sw.TrialOutcome(trial, "failed", None, str(exc).splitlines()[0][:200])
    stop.set()
    values: list[float] = []
    status, detail, steps = "finished", "", total_steps
    for d in res.seed_dirs:
        result = read_json(d / "result.json") or {}
        if result.get("status") != "finished":
            status, detail = str(result.get("status")), str(result.get("stop_reason") or "")
        if isinstance(result.get("steps"), int):
            steps = min(steps, int(result["steps"]))
        value = (result.get("final_metrics") or {}).get(metric)
        if value is not None:
            values.append(float(value))
    mean = sum(values) / len(values) if values and status == "finished" else None
    if pruner is not None:
        pruner.finish(trial.index, mean, pruned=False)
    return sw.TrialOutcome(trial, status, mean, detail, steps_done=steps)


def _metric_rows(path: Path, metric: str) -> list[tuple[int, float]]:
    """(step, value) of `metric` logged so far in a metrics.jsonl (a torn last line is skipped)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("key") == metric and isinstance(row.get("value"), int | float):
            rows.append((int(row.get("step", 0)), float(row["value"])))
    return sorted(rows)
