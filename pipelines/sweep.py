"""Sweeps: a small search over a few fields; each trial is a normal run with its own identity.

Pure functions: `expand_trials(spec)` makes the trial specs, `select_winner(...)` picks by
the selection metric (ties go to the cheaper trial), `render_trials_markdown(...)` makes
the table the report shows. Failed or early-stopped trials stay in the table.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any

from validation.resolved import ResolvedExperiment, rebuild, resolve_spec
from validation.spec import ExperimentSpec


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


def expand_trials(resolved: ResolvedExperiment) -> list[Trial]:
    """Trials of the sweep: the grid (or a seeded random sample of it), bounded by max_trials,
    each built through validation and resolved (on the experiment's seeds)."""
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
        trial = resolve_spec(trial_spec, resolved.repo_root, seeds=resolved.seeds)
        trials.append(Trial(i, name, overrides, trial))
    return trials


def selection(spec: ExperimentSpec) -> tuple[str, str]:
    """(metric, 'min'|'max') used to pick the winner."""
    sweep = spec.sweep
    assert sweep is not None
    metric = sweep.metric or spec.hypothesis.metric
    mode = sweep.mode or ("min" if spec.hypothesis.direction == "decrease" else "max")
    return metric, mode


def select_winner(outcomes: list[TrialOutcome], mode: str) -> TrialOutcome | None:
    """Best finished trial by value; equal values go to the cheaper trial, then the first."""
    done = [o for o in outcomes if o.status == "finished" and o.value is not None and math.isfinite(o.value)]
    if not done:
        return None
    sign = 1.0 if mode == "min" else -1.0
    return min(done, key=lambda o: (sign * float(o.value), o.trial.cost, o.trial.index))  # type: ignore[arg-type]


def render_trials_markdown(outcomes: list[TrialOutcome], winner: TrialOutcome | None, metric: str, mode: str) -> str:
    paths = list(outcomes[0].trial.overrides) if outcomes else []
    head = "| trial | " + " | ".join(f"`{p}`" for p in paths) + f" | status | `{metric}` ({mode}) | cost (FLOPs) |"
    lines = [
        "<details open><summary><b>Sweep</b>: "
        f"{len(outcomes)} trials, winner {'`' + winner.trial.name + '`' if winner else 'none'}</summary>",
        "",
        head,
        "|" + "---|" * (len(paths) + 4),
    ]
    for o in outcomes:
        mark = " **winner**" if winner is not None and o.trial.index == winner.trial.index else ""
        value = f"{o.value:.4f}" if o.value is not None else "-"
        status = o.status + (f": {o.detail}" if o.detail else "")
        cells = " | ".join(str(o.trial.overrides[p]) for p in paths)
        lines.append(f"| {o.trial.name}{mark} | {cells} | {status} | {value} | {o.trial.cost:.3g} |")
    lines += ["", "</details>", ""]
    return "\n".join(lines)
