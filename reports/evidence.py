"""The evidence under the verdict, in one sign convention (pure: `Report` in, numbers and text out).

Every effect in the comment is an *improvement*: positive when the metric moved the better way
(for the hypothesis metric, its stated direction), from the per-seed log ratios exactly as the
verdict computes its effect (`reports.verdict`), so the per-seed table, the interval chart and
the headline's sentence show the same numbers with the same sign. Raw values stay beside them.

What is left out of the effect tables, and why (`left_out`):

- statistics of statistics: lm-eval's `*_stderr` and the example count `n` (shown as ± and n in
  the downstream table, never given an interval of their own);
- derived duplicates: bits per byte (`…/bpb`) is the loss times a constant (tokens per byte of the
  held-out set) when both sides share the tokenizer, so its change is the loss's;
- `train/lr`: the schedule's value at the last step (the decayed minimum), not the configured
  peak; the configured values are under "Parameters changed";
- performance (`perf/…`): throughput, MFU and memory depend on the machine and its load, not only
  on the change; they are in "Cost and performance", marked so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

from reports.compare import MetricComparison, t_interval
from reports.report import Report
from reports.verdict import pct_exact, to_relative

LOWER_IS_BETTER = ("loss", "bpb", "perplexity", "ppl", "peak_mem_gb", "step_time_s")
HIGHER_IS_BETTER = ("tokens_per_s", "mfu")
NEGLIGIBLE = 1e-9
"""A difference this small relative to the values is float rounding: shown as 0."""


def better_way(metric: str, report: Report) -> str | None:
    """'decrease' or 'increase': which way `metric` is better; None when nobody can say (a gradient norm)."""
    if metric == report.hypothesis.metric:
        return report.hypothesis.direction
    from validation.eval_tasks import better_direction

    task = better_direction(metric)
    if task is not None:
        return task
    last = metric.rsplit("/", 1)[-1]
    if last in LOWER_IS_BETTER:
        return "decrease"
    if last in HIGHER_IS_BETTER:
        return "increase"
    return None


@dataclass(frozen=True)
class Improvement:
    """A metric's change in the convention of the comment: + is better (or + is higher when no way is better)."""

    metric: str
    way: str | None
    """'decrease' / 'increase': the better way; None: + means higher."""
    baseline: float
    candidate: float
    effect: float | None
    """Fraction (0.0025 = 0.25 % better); None when a baseline value is 0."""
    interval: tuple[float, float] | None
    """Two-sided (1 - 2 alpha) interval of `effect`: its ends are the verdict's one-sided bounds."""
    per_seed: tuple[float, ...]
    n: int

    @property
    def beyond_noise(self) -> bool:
        """The interval excludes 0: the seeds' own spread does not explain the difference."""
        return self.interval is not None and (self.interval[0] > 0 or self.interval[1] < 0)


def _to_better(way: str | None, log_values: Sequence[float]) -> list[float]:
    direction = way or "increase"
    sign = -1.0 if direction == "decrease" else 1.0
    return [float(to_relative(direction, sign * x)) for x in log_values]


def improvement(m: MetricComparison, way: str | None, confidence: float) -> Improvement:
    """`m` in the comment's convention (see the module docstring)."""
    direction = way or "increase"
    sign = -1.0 if direction == "decrease" else 1.0
    if m.log_ratios:
        logs = [sign * x for x in m.log_ratios]
        effect = float(to_relative(direction, fmean(logs)))
        ci = t_interval(logs, confidence)
        interval = (float(to_relative(direction, ci[0])), float(to_relative(direction, ci[1]))) if ci else None
        per_seed = tuple(float(to_relative(direction, x)) for x in logs)
    elif m.relative:
        rel = [sign * x for x in m.relative]
        effect = fmean(rel)
        ci = t_interval(rel, confidence)
        interval = ci
        per_seed = tuple(rel)
    else:
        effect, interval, per_seed = None, None, ()
    if effect is not None and _negligible(m):
        effect, per_seed = 0.0, tuple(0.0 for _ in per_seed)
    return Improvement(m.metric, way, m.baseline, m.candidate, effect, interval, per_seed, m.n)


def _negligible(m: MetricComparison) -> bool:
    scale = max(abs(m.baseline), abs(m.candidate))
    return all(abs(d) <= NEGLIGIBLE * max(scale, 1e-300) for d in m.differences)


# --------------------------------------------------------------------------- which metrics


def is_statistic_of_statistic(metric: str) -> bool:
    """lm-eval's standard errors and example counts: context for a value, not outcomes."""
    from validation.eval_tasks import TASK_METRIC

    match = TASK_METRIC.match(metric)
    return metric.endswith("_stderr") or bool(match and match["metric"] == "n")


def duplicate_of(metric: str, report: Report) -> str | None:
    """The metric `metric` merely restates (`eval/bpb` -> `eval/loss` on a shared tokenizer), or None.
    Of a loss and its bits per byte the hypothesis metric is kept, else the loss."""
    h = report.hypothesis.metric
    stem, _, last = metric.rpartition("/")
    if last not in ("bpb", "loss") or not stem:
        return None
    twin = f"{stem}/{'loss' if last == 'bpb' else 'bpb'}"
    if twin not in report.comparison.metrics:
        return None
    if any(k in report.definitions for k in (metric, twin)):
        return None  # a different tokenizer: loss and bits per byte say different things
    kept = h if h in (metric, twin) else f"{stem}/loss"
    return kept if metric != kept else None


def is_performance(metric: str) -> bool:
    return metric.startswith("perf/")


def outcome_metrics(report: Report) -> tuple[list[str], dict[str, str]]:
    """(exploratory metrics worth an effect, {left-out metric: why}); the hypothesis metric is neither."""
    keep: list[str] = []
    why: dict[str, str] = {}
    for key in report.comparison.metrics:
        if key == report.hypothesis.metric:
            continue
        if is_statistic_of_statistic(key):
            why[key] = "lm-eval's standard error or example count (shown in Downstream tasks)"
        elif key == "train/lr" or key.startswith("train/lr/"):
            why[key] = "the schedule's value at the last step; configured values are under Parameters changed"
        elif (twin := duplicate_of(key, report)) is not None:
            why[key] = f"restates `{twin}` (same tokenizer: a constant factor, the same change)"
        elif is_performance(key):
            why[key] = "machine-dependent (load on the machine, not the change): see Cost and performance"
        else:
            keep.append(key)
    return keep, why


def improvements(report: Report, metrics: Sequence[str]) -> list[Improvement]:
    conf = report.comparison.confidence
    return [improvement(report.comparison.metrics[k], better_way(k, report), conf)
            for k in metrics if k in report.comparison.metrics]


# --------------------------------------------------------------------------- number formats


def pct(x: float | None, *, signed: bool = True, digits: int = 2) -> str:
    """A fraction as a percentage; `-0.00 %` is `0.00 %`."""
    if x is None or not math.isfinite(x):
        return "—"
    value = round(100 * x, digits)
    if value == 0:
        value = 0.0
    return f"{value:+.{digits}f} %" if signed and value != 0 else f"{abs(value) if not signed else value:.{digits}f} %"


def num(value: float | None, digits: int = 4) -> str:
    """A value for a table: 4 significant digits, thousands separated, tiny values as 0."""
    if value is None or not math.isfinite(value):
        return "—"
    if abs(value) < 1e-12:
        return "0"
    if abs(value) >= 1_000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


# --------------------------------------------------------------------------- interval chart


_STEPS = (0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 10.0, 20.0, 25.0, 50.0, 100.0, 200.0, 500.0)


def interval_chart(effect: float | None, interval: tuple[float, float] | None, margin: float,
                   seeds: Sequence[float] = (), *, level: str = "95 %", width: int = 61) -> str | None:
    """A number line (monospace text, so it shows the same in a PR comment and a terminal): the
    effect `●` and its interval `[━━━]`, the per-seed improvements `·`, and the required margin `▲`,
    all in percent better. None when there is no effect to draw."""
    if effect is None:
        return None
    points = [100 * effect, 100 * margin, 0.0, *(100 * s for s in seeds)]
    if interval is not None:
        points += [100 * interval[0], 100 * interval[1]]
    low, high = min(points), max(points)
    span = max(high - low, 1e-9)
    step = next((s for s in _STEPS if span / s <= 6), _STEPS[-1])
    low = math.floor(low / step) * step
    high = math.ceil(high / step) * step
    if high - low < step:
        high = low + step
    cells = width - 1

    def col(x: float) -> int:
        return max(0, min(cells, round((100 * x - low) / (high - low) * cells)))

    label_w = 10
    axis = ["─"] * width
    labels = [" "] * (width + 8)
    tick = low
    while tick <= high + 1e-9:
        c = round((tick - low) / (high - low) * cells)
        axis[c] = "┼"
        text = f"{tick:+g} %" if abs(tick) > 1e-9 else "0 %"
        start = max(0, min(len(labels) - len(text), c - len(text) // 2))
        if all(ch == " " for ch in labels[max(0, start - 1):start + len(text) + 1]):
            labels[start:start + len(text)] = list(text)
        tick += step
    line = [" "] * width
    if interval is not None:
        lo, hi = col(interval[0]), col(interval[1])
        for c in range(lo, hi + 1):
            line[c] = "━"
        line[lo], line[hi] = "[", "]"
    line[col(effect)] = "●"
    dots = [" "] * width
    for s in seeds:
        c = col(s)
        dots[c] = "·" if dots[c] == " " else "∶"
    need = [" "] * width
    need[col(margin)] = "▲"
    rows = [
        " " * label_w + "".join(labels).rstrip(),
        " " * label_w + "".join(axis),
        f"{'effect':<{label_w}}" + "".join(line).rstrip() + ("" if interval is None else f"   {level} bounds"),
    ]
    if seeds:
        rows.append(f"{'seeds':<{label_w}}" + "".join(dots).rstrip())
    rows.append(f"{'required':<{label_w}}" + "".join(need).rstrip() + f" {pct_exact(margin)}")
    return "\n".join(rows)
