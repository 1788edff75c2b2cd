"""The decision a researcher takes from a plan, first: layout, memory, time for every run, cost,
the effect the planned seeds can detect, reuse of finished runs, passes over the data and
evaluation points, each in one line, with a warning where the plan will waste the run.

Pure: the facts that need the disk or the statistics (finished runs under `runs/`, the
prepared data's token counts, `reports.verdict`'s power) are gathered by `pipeline plan`
(`pipelines.cmd_validate`) and passed in; what follows from the spec alone is computed here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from validation.plan.common import format_bytes, format_count, format_duration
from validation.plan.render import _why_layout

if TYPE_CHECKING:
    from validation.plan.assemble import Plan
    from validation.spec import ExperimentSpec

MAX_PASSES = 4.0
"""More passes over a source than this is warned about: repeating data up to about 4 epochs
trains almost as well as fresh data, beyond it the returns fall off quickly (Muennighoff et al.
2023, "Scaling Data-Constrained Language Models")."""
MIN_EVAL_POINTS = 3
"""Fewer evaluations per run than this draw no curve: two points are a line whatever happened."""


@dataclass(frozen=True)
class Detectable:
    """What `hypothesis.seeds` paired seeds can decide (`reports.verdict`'s power, computed by the caller)."""

    seeds: int
    power: float
    alpha: float
    noise_multiple: float | None
    """Detectable log effect = margin + noise_multiple x seed noise (sd of the per-seed log ratios)."""
    effect: float | None = None
    """The smallest true relative effect "supported" reaches with `power`, at `noise`; None when the
    noise is not known or no effect within reach is detected that often."""
    noise: float | None = None
    """Seed noise used: sd of the per-seed log ratios (relative, 0.005 = 0.5 %)."""
    noise_source: str = ""
    measured_noise: float | None = None
    """The sd the runs showed; `noise` is its upper confidence bound (`reports.verdict.planning_sd`)."""
    examples: tuple[tuple[float, float | None], ...] = ()
    """(noise, detectable effect) at reference noise levels, when no noise was measured."""


@dataclass(frozen=True)
class Reuse:
    """Finished runs of the same spec, data version and seed under `runs/` (the code version, the
    rest of a run's identity, needs git: `pipeline run` checks it)."""

    candidate: int | None
    baseline: int | None
    note: str = ""


@dataclass(frozen=True)
class DataPasses:
    """How many times a run reads each source's training split (mixture weight x run tokens / split)."""

    run_tokens: int
    corpus_tokens: int | None
    per_source: dict[str, float] = field(default_factory=dict)
    counted: bool = False
    """True when the token counts are the prepared data's; False when estimated from file sizes."""
    note: str = ""

    @property
    def most(self) -> float | None:
        return max(self.per_source.values()) if self.per_source else None


@dataclass(frozen=True)
class Decision:
    experiment: str
    runs: int
    """Training runs the plan counts: every seed and the baseline's on the same seeds."""
    total_wall_seconds: float
    """Those runs one after another (the local flow trains them in turn)."""
    train_wall_seconds: float | None
    """What is left once the finished runs are reused; None when reuse is unknown."""
    eval_points: int
    """Evaluations per run."""
    eval_steps: tuple[int, ...]
    """Their steps: all of them up to 6, else the first 5 and the last."""
    detectable: Detectable
    reuse: Reuse
    data: DataPasses
    warnings: tuple[str, ...] = ()
    sweep: bool = False
    """A sweep: the figures are one configuration's; the plan's sweep section prices every trial."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["data"]["most"] = self.data.most
        return out


def eval_points(total_steps: int, interval: int) -> int:
    """How many times a run evaluates (trainer/loop.py): every `interval` steps before the last,
    then once at the end."""
    return (total_steps - 1) // interval + 1


def eval_steps(total_steps: int, interval: int) -> tuple[int, ...]:
    """The steps a run evaluates at: all of them up to 6, else the first 5 and the last (a run of
    10 million steps evaluated every step is not listed)."""
    if eval_points(total_steps, interval) <= 6:
        return (*range(interval, total_steps, interval), total_steps)
    return (*range(interval, 6 * interval, interval), total_steps)


def data_passes(spec: ExperimentSpec, run_tokens: int, train_tokens: dict[str, int] | None,
                counted: bool, note: str = "") -> DataPasses:
    """Passes over each source: its mixture weight's share of the run's tokens over its training tokens."""
    if not train_tokens:
        return DataPasses(run_tokens, None, note=note)
    total_weight = sum(s.weight for s in spec.data.sources) or 1.0
    per_source = {s.name: s.weight / total_weight * run_tokens / train_tokens[s.name]
                  for s in spec.data.sources if s.weight > 0 and train_tokens.get(s.name)}
    return DataPasses(run_tokens, sum(train_tokens.values()), per_source, counted, note)


def decision_warnings(spec: ExperimentSpec, steps: tuple[int, ...], data: DataPasses,
                      detectable: Detectable) -> tuple[str, ...]:
    out: list[str] = []
    most = data.most
    if most is not None and most > MAX_PASSES:
        worst = max(data.per_source, key=lambda name: data.per_source[name])
        overall = data.run_tokens / data.corpus_tokens if data.corpus_tokens else 0.0
        out.append(
            f"the run passes over the data {overall:.0f} times ({format_count(data.run_tokens)} tokens over "
            f"{'a' if data.counted else 'an estimated'} {format_count(data.corpus_tokens or 0)}-token corpus), "
            f"over source {worst} {most:.0f} times: beyond about {MAX_PASSES:g} passes repeated data teaches "
            "little and the model memorises it; add data, or fewer steps (train.max_steps / train.token_budget)")
    if len(steps) < MIN_EVAL_POINTS and steps[-1] >= MIN_EVAL_POINTS:
        total = steps[-1]
        interval = max(1, total // 6)
        shown = " and ".join(str(s) for s in steps)
        out.append(
            f"evaluation gives {len(steps)} point{'s' if len(steps) > 1 else ''} per run (step{'s' if len(steps) > 1 else ''} "
            f"{shown}): the eval curves show no trend; set train.eval_interval: {interval} for "
            f"{eval_points(total, interval)} points")
    if spec.hypothesis.seeds >= 2 and detectable.effect is None and detectable.noise is not None:
        out.append(f"{spec.hypothesis.seeds} paired seeds do not reach {detectable.power:.0%} power for any effect "
                   f"at the measured noise; add seeds or reduce the noise")
    return tuple(out)


def _pct(x: float) -> str:
    return f"{100 * x:.3g} %"


def _detectable_line(d: Detectable, min_effect: float) -> str:
    if d.seeds < 2:
        return ("none: 1 seed cannot decide the hypothesis (the verdict needs 2 paired seeds, 3 or more "
                "for power)")
    head = f"{_pct(d.effect)} or more" if d.effect is not None else ""
    power = f"{d.power:.0%} power, {d.seeds} paired seeds, alpha {d.alpha:g}"
    if d.noise is not None:
        if d.effect is None:
            return f"none within reach at seed noise {_pct(d.noise)} ({d.noise_source}; {power})"
        measured = f"measured {_pct(d.measured_noise)}, sized at " if d.measured_noise is not None else ""
        return (f"{head} with {power} (seed noise {measured}{_pct(d.noise)}: {d.noise_source}); "
                f"min_effect {_pct(min_effect)}")
    multiple = f"{d.noise_multiple:.2g}" if d.noise_multiple is not None else "?"
    shown = ", ".join(f"{_pct(e)} at {_pct(n)} noise" for n, e in d.examples if e is not None)
    return (f"min_effect {_pct(min_effect)} + {multiple} x the seed noise ({power}): {shown}; "
            f"{d.noise_source or 'the noise is measured once the baseline has 2 finished seeds'}")


def _reuse_line(r: Reuse, seeds: int, baseline_runs: int) -> str:
    if r.candidate is None and r.baseline is None:
        return f"unknown ({r.note})" if r.note else "unknown"
    parts = []
    if r.candidate is not None:
        parts.append(f"{r.candidate} of {seeds} seed(s) of this experiment")
    if baseline_runs and r.baseline is not None:
        parts.append(f"{r.baseline} of {baseline_runs} of the baseline")
    return "already finished: " + ", ".join(parts) + (f" ({r.note})" if r.note else "")


def _data_line(d: DataPasses) -> str:
    if d.corpus_tokens is None:
        return f"{format_count(d.run_tokens)} tokens per run; passes over the data unknown ({d.note})"
    how = "prepared" if d.counted else "estimated from file sizes"
    per = ", ".join(f"{name} {passes:.2g}" for name, passes in d.per_source.items())
    overall = d.run_tokens / d.corpus_tokens if d.corpus_tokens else 0.0
    return (f"{format_count(d.run_tokens)} tokens per run over a {format_count(d.corpus_tokens)}-token training "
            f"corpus ({how}): {overall:.2g} passes; per source by its weight: {per}"
            + (f" ({d.note})" if d.note else ""))


def decision_rows(plan: Plan, decision: Decision, min_effect: float) -> list[tuple[str, str]]:
    """The decision, one line each, in the order a researcher decides."""
    p, m, c, r = plan.parallel, plan.memory, plan.compute, plan.resource
    unit = f"{r.gpu_type}" if p.on_gpu else "CPU process(es)"
    per_node = r.gpus_per_node if p.on_gpu else r.cpu_processes
    fits = "fits" if m.fits else "DOES NOT FIT"
    if plan.tier.required_approvals is None:
        approvals = "no approval can start it"
    else:
        approvals = f"{plan.tier.required_approvals} approval(s)"
    runs = decision.runs
    cost = plan.cost
    baseline_runs = cost.baseline_runs if cost is not None else 0
    total = (f"{format_duration(decision.total_wall_seconds)} for all {runs} run(s) one after another "
             f"({plan.seeds} seed(s)" + (f" + the baseline's {baseline_runs}" if baseline_runs else "") + ")")
    left = decision.train_wall_seconds
    if left is not None and left <= 0:
        total += "; nothing left to train if the finished runs below are reused"
    elif left is not None and left < decision.total_wall_seconds:
        total += f"; {format_duration(left)} if the finished runs below are reused"
    hours = f"{cost.gpu_hours if cost is not None else c.gpu_hours:.2f} GPU-hours" if p.on_gpu else "0 GPU-hours (CPU)"
    spent = f"{cost.total_device_hours:.3g} device-hours, " if cost is not None else ""
    return [
        ("layout", f"{p.describe()} on {r.nodes} node(s) x {per_node} {unit}: {_short_why(plan)}"),
        ("memory", f"{format_bytes(m.total_bytes)} of {format_bytes(m.capacity_bytes)} per device "
                   f"({m.headroom_pct:.0f}% free, {fits})"),
        ("time", f"{format_duration(c.wall_seconds)} per run; {total}"
                 + ("; one configuration: the sweep section below prices every trial" if decision.sweep else "")),
        ("cost", f"{spent}{hours} (budget {r.max_gpu_hours:g} GPU-hours); tier {plan.tier.name}: {approvals}"),
        ("detectable", _detectable_line(decision.detectable, min_effect)),
        ("reuse", _reuse_line(decision.reuse, plan.seeds, baseline_runs)),
        ("data", _data_line(decision.data)),
        ("evaluation", f"{decision.eval_points} point(s) per run (steps {_steps_text(decision)})"),
    ]


def _steps_text(decision: Decision) -> str:
    shown = [str(s) for s in decision.eval_steps]
    if decision.eval_points > len(shown):
        shown.insert(-1, "...")
    return ", ".join(shown)


def _short_why(plan: Plan) -> str:
    return _why_layout(plan.parallel)


def render_decision_text(plan: Plan, decision: Decision, *, headline: str, min_effect: float) -> str:
    """The top of `pipeline plan`: the hypothesis in one line, the decision rows, the warnings."""
    rows = decision_rows(plan, decision, min_effect)
    width = max(len(k) for k, _ in rows)
    lines = [headline]
    lines += [f"  {key.ljust(width)}  {value}" for key, value in rows]
    warnings = [*decision.warnings, *plan.warnings]
    lines += [f"  warning: {w}" for w in warnings]
    return "\n".join(lines) + "\n"
