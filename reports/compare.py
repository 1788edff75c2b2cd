"""Candidate vs baseline, paired by seed (pure: records in, `Comparison` out).

Candidate and baseline run on the same seeds, so seed-to-seed noise common to both
cancels in the per-seed ratio. `Δ %` is the geometric mean of the per-seed ratios minus
one, 100 (exp(mean log(c_i / b_i)) - 1): the quantity the verdict tests (`reports.verdict`).
Intervals are two-sided t-intervals (`scipy.stats.t`) of the mean log ratio at the
verdict's level, 1 - 2 alpha, mapped back to percent, so their ends are exactly the
verdict's one-sided (1 - alpha) bounds; available from two paired seeds on. A metric with a
value <= 0 has no log ratio: its `Δ %` is the mean per-seed relative change instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import fmean, stdev
from typing import Any, Protocol

from reports.records import RunRecord

CONFIDENCE = 0.95


class HypothesisLike(Protocol):
    """What compare/verdict need of `validation.spec.Hypothesis` (or a dict-backed stand-in)."""

    metric: str
    direction: str
    min_effect: float
    alpha: float


@dataclass(frozen=True)
class HypothesisView:
    """A plain hypothesis for records that carry it as a dict (run dirs, MLflow)."""

    metric: str
    direction: str
    min_effect: float
    alpha: float = 0.05
    statement: str = ""
    baseline: str = ""
    seeds: int = 1
    alpha_override: str = ""
    """Why alpha exceeds the 0.1 limit (shown in the comment); empty when it does not."""
    pilot: bool = False
    """An exploratory pilot (decides nothing)."""

    @classmethod
    def of(cls, hypothesis: Any) -> HypothesisView:
        if isinstance(hypothesis, HypothesisView):
            return hypothesis
        get = hypothesis.get if isinstance(hypothesis, dict) else lambda k, d=None: getattr(hypothesis, k, d)
        return cls(
            metric=str(get("metric")),
            direction=str(get("direction")),
            min_effect=float(get("min_effect") or 0.0),
            alpha=float(get("alpha", 0.05) or 0.05),
            statement=str(get("statement", "") or ""),
            baseline=str(get("baseline", "") or ""),
            seeds=int(get("seeds", 1) or 1),
            alpha_override=str(get("alpha_override", "") or ""),
            pilot=bool(get("pilot", False)),
        )

    def registered_fields(self) -> dict[str, Any]:
        """What preregistration freezes (the statement's wording is not a change of hypothesis)."""
        return {"metric": self.metric, "direction": self.direction, "min_effect": self.min_effect,
                "alpha": self.alpha, "seeds": self.seeds, "baseline": self.baseline}


@dataclass(frozen=True)
class SeedPair:
    seed: int | None
    candidate: RunRecord
    baseline: RunRecord


@dataclass(frozen=True)
class MetricComparison:
    """One metric over the paired seeds. `delta` = candidate - baseline (means)."""

    metric: str
    candidate: float
    baseline: float
    delta: float
    delta_pct: float | None
    """100 (exp(mean log(c_i / b_i)) - 1) when every value is positive, else the mean per-seed
    relative change 100 mean((c_i - b_i) / |b_i|); None when a baseline value is 0."""
    n: int
    ci_low: float | None = None
    ci_high: float | None = None
    """`confidence` t-interval of the mean paired difference (absolute units); None below 2 pairs."""
    differences: tuple[float, ...] = ()
    relative: tuple[float, ...] = ()
    """Per-seed relative changes (c_i - b_i) / |b_i| (empty when a baseline value is 0)."""
    confidence: float = CONFIDENCE
    """Level of the intervals."""
    log_ratios: tuple[float, ...] = ()
    """Per-seed log(c_i / b_i) (empty when a value is not positive)."""

    @property
    def ci_pct(self) -> tuple[float, float] | None:
        """`confidence` interval of `delta_pct`, in percent: the t-interval of the mean log
        ratio mapped back (or of the mean relative change when there are no log ratios)."""
        if self.log_ratios:
            interval = t_interval(self.log_ratios, self.confidence)
            return None if interval is None else (100.0 * math.expm1(interval[0]), 100.0 * math.expm1(interval[1]))
        interval = t_interval(self.relative, self.confidence) if self.relative else None
        if interval is None:
            return None
        return 100.0 * interval[0], 100.0 * interval[1]


@dataclass(frozen=True)
class Comparison:
    hypothesis: HypothesisView
    pairs: tuple[SeedPair, ...]
    metrics: dict[str, MetricComparison]
    unpaired_candidate_seeds: tuple[int | None, ...] = ()
    unpaired_baseline_seeds: tuple[int | None, ...] = ()
    baseline_values: tuple[float, ...] = field(default=())
    """The hypothesis metric over every finished baseline run (paired or not): its seed spread."""

    confidence: float = CONFIDENCE
    """Level of every interval in `metrics`: 1 - 2 alpha, matching the verdict's one-sided bounds."""

    @property
    def primary(self) -> MetricComparison | None:
        return self.metrics.get(self.hypothesis.metric)

    @property
    def primary_pairs(self) -> list[tuple[float, float]]:
        """(candidate, baseline) values of the hypothesis metric, per paired seed."""
        key = self.hypothesis.metric
        values = [(p.candidate.final_metrics.get(key), p.baseline.final_metrics.get(key)) for p in self.pairs]
        return [(c, b) for c, b in values if c is not None and b is not None]


def t_interval(differences: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Two-sided t-interval of the mean of `differences`; None with fewer than 2 values."""
    n = len(differences)
    if n < 2:
        return None
    from scipy import stats

    mean = fmean(differences)
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * stdev(differences) / math.sqrt(n)
    return mean - half, mean + half


def _usable(run: RunRecord) -> bool:
    return run.status == "finished"


def pair_by_seed(candidates: Sequence[RunRecord], baselines: Sequence[RunRecord]
                 ) -> tuple[list[SeedPair], list[int | None], list[int | None]]:
    """Pairs finished runs with equal seeds (first of each seed wins); lists the leftovers."""
    base_by_seed: dict[int | None, RunRecord] = {}
    for run in baselines:
        if _usable(run):
            base_by_seed.setdefault(run.seed, run)
    pairs, lonely_candidates, seen = [], [], set()
    for run in candidates:
        if not _usable(run) or run.seed in seen:
            continue
        seen.add(run.seed)
        if run.seed in base_by_seed:
            pairs.append(SeedPair(run.seed, run, base_by_seed[run.seed]))
        else:
            lonely_candidates.append(run.seed)
    lonely_baselines = [s for s in base_by_seed if s not in seen]
    pairs.sort(key=lambda p: (p.seed is None, p.seed or 0))
    return pairs, lonely_candidates, lonely_baselines


def compare_metric(metric: str, pairs: Sequence[SeedPair], confidence: float = CONFIDENCE) -> MetricComparison | None:
    values = [(p.candidate.final_metrics[metric], p.baseline.final_metrics[metric]) for p in pairs
              if metric in p.candidate.final_metrics and metric in p.baseline.final_metrics]
    if not values:
        return None
    cand = fmean(c for c, _ in values)
    base = fmean(b for _, b in values)
    differences = tuple(c - b for c, b in values)
    delta = fmean(differences)
    interval = t_interval(differences, confidence)
    relative = tuple((c - b) / abs(b) for c, b in values) if all(b != 0 for _, b in values) else ()
    logs = tuple(math.log(c / b) for c, b in values) if all(c > 0 and b > 0 for c, b in values) else ()
    if logs:
        delta_pct: float | None = 100.0 * math.expm1(fmean(logs))
    else:
        delta_pct = 100.0 * fmean(relative) if relative else None
    return MetricComparison(
        metric=metric,
        candidate=cand,
        baseline=base,
        delta=delta,
        delta_pct=delta_pct,
        n=len(values),
        ci_low=interval[0] if interval else None,
        ci_high=interval[1] if interval else None,
        differences=differences,
        relative=relative,
        confidence=confidence,
        log_ratios=logs,
    )


def verdict_confidence(alpha: float) -> float:
    """The two-sided level whose ends are the verdict's one-sided (1 - alpha) bounds."""
    return 1.0 - 2.0 * alpha


def compare(candidates: Sequence[RunRecord], baselines: Sequence[RunRecord], hypothesis: Any) -> Comparison:
    """Every metric both sides report, over the seeds both sides finished, with intervals
    at the verdict's level (1 - 2 alpha)."""
    view = HypothesisView.of(hypothesis)
    confidence = verdict_confidence(view.alpha)
    pairs, lonely_candidates, lonely_baselines = pair_by_seed(candidates, baselines)
    keys = sorted({k for p in pairs for k in p.candidate.final_metrics} & {k for p in pairs for k in p.baseline.final_metrics})
    keys = [k for k in keys if not k.startswith(("data/mix/", "alerts/"))]  # context, not outcomes
    if view.metric in keys:  # the hypothesis metric first
        keys.remove(view.metric)
        keys.insert(0, view.metric)
    metrics = {}
    for key in keys:
        result = compare_metric(key, pairs, confidence)
        if result is not None:
            metrics[key] = result
    baseline_values = tuple(
        r.final_metrics[view.metric] for r in baselines if _usable(r) and view.metric in r.final_metrics
    )
    return Comparison(
        hypothesis=view,
        pairs=tuple(pairs),
        metrics=metrics,
        unpaired_candidate_seeds=tuple(lonely_candidates),
        unpaired_baseline_seeds=tuple(lonely_baselines),
        baseline_values=baseline_values,
        confidence=confidence,
    )
