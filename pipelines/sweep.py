"""Sweeps: a small search over a few fields; each trial is a normal run with its own identity.

Pure functions: `expand_trials(spec)` makes the trial specs, `select_winner(...)` picks by
the selection metric (ties go to the cheaper trial), `render_trials_markdown(...)` makes
the table the report shows, `sweep_cost(...)` what the whole sweep costs. Failed, pruned
or early-stopped trials stay in the table.

Selection and judgement use different seeds: trials train on `sweep.selection_seeds`
seeds from SELECTION_SEED_OFFSET on, the winner is then trained on the hypothesis seeds
and judged on those only (a winner judged on the seed it was picked on carries the
selection's luck into the verdict). `SuccessiveHalving` wraps Optuna's pruner: a trial
reports the selection metric at each eval step (a rung) and stops when it falls in the
bottom of its rung, freeing its slot for the next trial (asynchronous successive halving,
Li et al. 2020, as `optuna.pruners.SuccessiveHalvingPruner` implements it).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from validation.resolved import ResolvedExperiment, rebuild, resolve_spec
from validation.spec import ExperimentSpec

SELECTION_SEED_OFFSET = 10_000
"""Selection seeds start here above `train.seed`; hypothesis seeds are train.seed + 0..15."""


def selection_seeds(spec: ExperimentSpec) -> list[int]:
    assert spec.sweep is not None
    return [spec.train.seed + SELECTION_SEED_OFFSET + i for i in range(spec.sweep.selection_seeds)]


@dataclass(frozen=True)
class Trial:
    index: int
    name: str
    overrides: dict[str, Any]
    resolved: ResolvedExperiment
    """The trial resolved like any experiment (its own layout, seeds, FLOPs)."""

    @property
    def spec(self) -> ExperimentSpec:
        return self.resolved.spec

    @property
    def cost(self) -> float:
        """Training FLOPs (`validation.flops`, from the resolved trial): what a tie is broken by."""
        return self.resolved.compute.training_flops


@dataclass(frozen=True)
class TrialOutcome:
    trial: Trial
    status: str
    """finished, stopped (early stop, divergence) or failed (crash)."""
    value: float | None
    """Mean of the selection metric over seeds (None unless finished)."""
    detail: str = ""
    pruned_at: int | None = None
    """The step a pruned trial stopped at (its last rung)."""
    steps_done: int | None = None
    """Optimizer steps it trained (per seed); the planned steps when it finished."""


def expand_trials(resolved: ResolvedExperiment) -> list[Trial]:
    """Trials of the sweep: the grid (or a seeded random sample of it), bounded by max_trials,
    each built through validation and resolved on the selection seeds (never the hypothesis'')."""
    spec = resolved.spec
    sweep = spec.sweep
    assert sweep is not None
    paths = list(sweep.parameters)
    combos = list(itertools.product(*(sweep.parameters[p] for p in paths)))
    if sweep.method == "random" and len(combos) > sweep.max_trials:
        combos = random.Random(sweep.seed).sample(combos, sweep.max_trials)
    combos = combos[: sweep.max_trials]
    trials = []
    for i, combo in enumerate(combos, 1):
        overrides = dict(zip(paths, combo, strict=True))
        name = f"{spec.name[:56]}-t{i}"
        trial_spec = rebuild(spec, {**overrides, "sweep": None, "name": name})
        trial = resolve_spec(trial_spec, resolved.repo_root, seeds=selection_seeds(spec))
        trials.append(Trial(i, name, overrides, trial))
    return trials


def winner_experiment(resolved: ResolvedExperiment, winner: Trial) -> ResolvedExperiment:
    """The winning configuration under the sweep's own name, on the hypothesis seeds: the
    candidate the verdict judges (fresh seeds: none of them picked the winner)."""
    spec = rebuild(resolved.spec, {**winner.overrides, "sweep": None})
    return resolve_spec(spec, resolved.repo_root, spec_file=resolved.spec_file, seeds=list(resolved.seeds))


@dataclass(frozen=True)
class SweepCost:
    """What a sweep costs, in the plan's units (device-hours; GPU-hours on GPUs)."""

    trials: int
    selection_seeds: int
    per_trial_device_hours: float
    """The largest trial's estimate for one seed (trials differ only in swept fields)."""
    confirm_seeds: int
    baseline_device_hours: float
    """The baseline on the hypothesis seeds (0 when it is reused or the champion)."""
    on_gpu: bool

    @property
    def selection_device_hours(self) -> float:
        return self.trials * self.selection_seeds * self.per_trial_device_hours

    @property
    def total_device_hours(self) -> float:
        """Every trial on every selection seed, the winner on the hypothesis seeds, the baseline."""
        return self.selection_device_hours + self.confirm_seeds * self.per_trial_device_hours + self.baseline_device_hours

    def describe(self) -> str:
        return (f"{self.trials} trials x {self.selection_seeds} selection seed(s) x "
                f"{self.per_trial_device_hours:.3g} + winner x {self.confirm_seeds} hypothesis seed(s) + baseline "
                f"{self.baseline_device_hours:.3g} = {self.total_device_hours:.3g} device-hours")


def sweep_cost(trials: list[Trial], resolved: ResolvedExperiment, baseline: ResolvedExperiment | None,
               measured_cpu: Sequence[Any] = ()) -> SweepCost:
    """Trials x selection seeds, the winner's confirmation and the baseline, from the plan's
    per-run estimates (`validation.preflight.make_plan` prices one seed; `measured_cpu`: this
    machine's speed, `validation.plan.cpu_speed`)."""
    from validation.plan import make_plan

    plans = [make_plan(t.spec, measured_cpu=measured_cpu) for t in trials]
    per_trial = max(p.compute.device_hours for p in plans)
    base = (make_plan(baseline.spec, measured_cpu=measured_cpu).compute.device_hours * len(baseline.seeds)
            if baseline is not None else 0.0)
    sweep = resolved.spec.sweep
    assert sweep is not None
    return SweepCost(trials=len(trials), selection_seeds=sweep.selection_seeds, per_trial_device_hours=per_trial,
                     confirm_seeds=len(resolved.seeds), baseline_device_hours=base,
                     on_gpu=any(p.compute.on_gpu for p in plans))


def sweep_tier(cost: SweepCost, resolved: ResolvedExperiment, measured_cpu: Sequence[Any] = ()) -> Any:
    """The approval tier of the whole sweep (`validation.preflight.approval_tier` on its total)."""
    from dataclasses import replace

    from validation.plan import approval_tier, make_plan

    compute = make_plan(resolved.spec, measured_cpu=measured_cpu).compute
    total = replace(compute, wall_seconds=cost.total_device_hours * 3600.0 / max(1, compute.world_size),
                    on_gpu=cost.on_gpu)
    return approval_tier(total, resolved.spec.resource)


class SuccessiveHalving:
    """Optuna's successive-halving pruner over the trials of one sweep (thread-safe: trials run
    concurrently and report as their evals land). `report` says whether a trial should stop."""

    def __init__(self, mode: str, reduction_factor: int, min_resource: int):
        import threading

        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._lock = threading.Lock()
        self._study = optuna.create_study(
            direction="minimize" if mode == "min" else "maximize",
            pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=min_resource, reduction_factor=reduction_factor,
                                                          min_early_stopping_rate=0),
            sampler=optuna.samplers.RandomSampler(seed=0))  # the grid is ours; the sampler is unused
        self._trials: dict[int, Any] = {}
        self._reported: dict[int, set[int]] = {}

    def start(self, index: int) -> None:
        with self._lock:
            self._trials[index] = self._study.ask()
            self._reported[index] = set()

    def report(self, index: int, step: int, value: float) -> bool:
        with self._lock:
            trial = self._trials.get(index)
            if trial is None or step in self._reported[index] or not math.isfinite(value):
                return False
            self._reported[index].add(step)
            trial.report(value, step)
            return bool(trial.should_prune())

    def finish(self, index: int, value: float | None, pruned: bool) -> None:
        import optuna

        with self._lock:
            trial = self._trials.pop(index, None)
            if trial is None:
                return
            state = (optuna.trial.TrialState.PRUNED if pruned else
                     optuna.trial.TrialState.COMPLETE if value is not None and math.isfinite(value) else
                     optuna.trial.TrialState.FAIL)
            self._study.tell(trial, value if state == optuna.trial.TrialState.COMPLETE else None, state=state)


def selection(spec: ExperimentSpec) -> tuple[str, str]:
    """(metric, 'min'|'max') used to pick the winner."""
    sweep = spec.sweep
    assert sweep is not None
    from validation.eval_tasks import better_direction

    metric = sweep.metric or spec.hypothesis.metric
    # A selection metric other than the hypothesis's: a task metric's own better direction.
    direction = (better_direction(metric) if metric != spec.hypothesis.metric else None) or spec.hypothesis.direction
    mode = sweep.mode or ("min" if direction == "decrease" else "max")
    return metric, mode


def select_winner(outcomes: list[TrialOutcome], mode: str) -> TrialOutcome | None:
    """Best finished trial by value; equal values go to the cheaper trial, then the first."""
    done = [o for o in outcomes if o.status == "finished" and o.value is not None and math.isfinite(o.value)]
    if not done:
        return None
    sign = 1.0 if mode == "min" else -1.0
    return min(done, key=lambda o: (sign * float(o.value), o.trial.cost, o.trial.index))  # type: ignore[arg-type]


def render_trials_markdown(outcomes: list[TrialOutcome], winner: TrialOutcome | None, metric: str, mode: str,
                           *, total_steps: int | None = None, selection: list[int] | None = None,
                           decided: list[int] | None = None, cost: SweepCost | None = None) -> str:
    paths = list(outcomes[0].trial.overrides) if outcomes else []
    head = ("| trial | " + " | ".join(f"`{p}`" for p in paths)
            + f" | status | `{metric}` ({mode}) | steps | cost (FLOPs) |")
    pruned = [o for o in outcomes if o.pruned_at is not None]
    lines = [
        "<details open><summary><b>Sweep</b>: "
        f"{len(outcomes)} trials, {len(pruned)} pruned, winner {'`' + winner.trial.name + '`' if winner else 'none'}"
        "</summary>",
        "",
        head,
        "|" + "---|" * (len(paths) + 5),
    ]
    for o in outcomes:
        mark = " **winner**" if winner is not None and o.trial.index == winner.trial.index else ""
        value = f"{o.value:.4f}" if o.value is not None else "-"
        status = ("pruned at step " + str(o.pruned_at) if o.pruned_at is not None else o.status) + (
            f": {o.detail}" if o.detail else "")
        cells = " | ".join(str(o.trial.overrides[p]) for p in paths)
        steps = f"{o.steps_done}" if o.steps_done is not None else "-"
        lines.append(f"| {o.trial.name}{mark} | {cells} | {status} | {value} | {steps} | {o.trial.cost:.3g} |")
    lines.append("")
    if total_steps:
        spent = sum(o.steps_done or 0 for o in outcomes)
        full = total_steps * len(outcomes)
        lines.append(f"Compute: {spent:,} of {full:,} trial steps per selection seed ({100 * spent / full:.0f} % of "
                     "the full grid); pruned trials stopped at their rung and freed their slot.")
    if cost is not None:
        lines.append(f"Planned cost: {cost.describe()}.")
    if selection is not None or decided is not None:
        lines.append(f"Seeds: the winner was picked on selection seed(s) {selection or []}; the verdict above is "
                     f"decided on hypothesis seed(s) {decided or []} only, trained again for it.")
    lines += ["", "</details>", ""]
    return "\n".join(lines)
