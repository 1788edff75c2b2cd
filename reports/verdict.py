"""The hypothesis verdict: supported, refuted or inconclusive, always with its reason (pure).

Effects are relative and signed so that positive means "in the stated direction":
    effect_i = s * (candidate_i - baseline_i) / |mean(baseline)|,  s = -1 for "decrease".

- supported: mean effect > 0, mean effect >= min_effect, and the paired t-test
  (`scipy.stats.ttest_rel`, two-sided) is significant at the hypothesis' alpha.
- refuted: significant at alpha the wrong way, or the upper bound of the (1 - alpha)
  confidence interval of the effect lies below min_effect (whatever the effect is, it is
  significantly smaller than what counts).
- inconclusive otherwise, saying why: no paired seeds, one seed (no test is possible
  with one pair, however large the difference looks), too noisy, or significant but
  too close to min_effect to tell.

Seeds needed (normal approximation, two-sided test at alpha, power 0.8): with the
baseline's seed standard deviation sigma_b, assume candidate and baseline seeds vary
independently with the same spread, so a paired difference has sd sigma_d = sqrt(2) *
sigma_b (conservative: pairing by seed can only remove shared noise). To detect an
absolute effect delta = min_effect * |mean(baseline)|:
    n = ceil(((z_{1-alpha/2} + z_{power}) * sigma_d / delta) ** 2), at least 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist, fmean, stdev
from typing import Literal

from reports.compare import Comparison

Outcome = Literal["supported", "refuted", "inconclusive"]
POWER = 0.8


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    reason: str
    metric: str
    n_pairs: int
    effect: float | None = None
    """Mean relative effect in the stated direction (0.03 = 3 % better)."""
    effect_ci: tuple[float, float] | None = None
    """(1 - alpha) confidence interval of `effect`."""
    p_value: float | None = None
    seeds_needed: int | None = None
    baseline_sd: float | None = None


def seeds_needed(baseline_sd: float, baseline_mean: float, min_effect: float, alpha: float, power: float = POWER) -> int:
    """Paired seeds needed to detect `min_effect` (see the module docstring for the formula)."""
    delta = min_effect * abs(baseline_mean)
    assert delta > 0, "min_effect and the baseline mean must be non-zero"
    if baseline_sd <= 0:
        return 2
    normal = NormalDist()
    z = normal.inv_cdf(1 - alpha / 2) + normal.inv_cdf(power)
    return max(2, math.ceil((z * math.sqrt(2) * baseline_sd / delta) ** 2))


def _pct(x: float) -> str:
    return f"{100 * x:+.2f} %"


def _paired_p_value(differences: tuple[float, ...]) -> float:
    if stdev(differences) == 0:  # identical differences: t is infinite (or 0/0 when all zero)
        return 0.0 if fmean(differences) != 0 else 1.0
    from scipy import stats

    return float(stats.ttest_1samp(differences, 0.0).pvalue)  # == ttest_rel on the pairs


def verdict(comparison: Comparison, power: float = POWER) -> Verdict:
    h = comparison.hypothesis
    metric = comparison.primary
    sign = -1.0 if h.direction == "decrease" else 1.0
    base_values = comparison.baseline_values
    base_sd = stdev(base_values) if len(base_values) >= 2 else None
    base_mean = metric.baseline if metric else (fmean(base_values) if base_values else None)
    needed = seeds_needed(base_sd, base_mean, h.min_effect, h.alpha, power) if base_sd is not None and base_mean else None
    needed_text = (
        f" With the baseline's seed spread (sd {base_sd:.4g}), about {needed} paired seeds would detect "
        f"a {h.min_effect:.1%} effect (power {power:.0%}, alpha {h.alpha:g})."
        if needed is not None else ""
    )

    def result(outcome: Outcome, reason: str, **kw) -> Verdict:
        return Verdict(outcome, reason, h.metric, metric.n if metric else 0, seeds_needed=needed, baseline_sd=base_sd, **kw)

    if metric is None:
        if not comparison.pairs and not comparison.unpaired_baseline_seeds:
            return result("inconclusive", f"Inconclusive: no finished baseline run (`{h.baseline or 'baseline'}`) to compare with.")
        if not comparison.pairs:
            return result("inconclusive", (
                "Inconclusive: no finished candidate and baseline runs share a seed "
                f"(candidate seeds {list(comparison.unpaired_candidate_seeds)}, "
                f"baseline seeds {list(comparison.unpaired_baseline_seeds)})." + needed_text))
        return result("inconclusive", f"Inconclusive: `{h.metric}` is missing from the paired runs.")
    if metric.baseline == 0:
        return result("inconclusive", f"Inconclusive: the baseline's `{h.metric}` is 0, so a relative effect is undefined.")

    scale = sign / abs(metric.baseline)
    effect = metric.delta * scale
    want = f"{h.direction} by at least {h.min_effect:.1%}"
    if metric.n == 1:
        moved = (f"`{h.metric}` moved {_pct(metric.delta / abs(metric.baseline))}, "
                 + ("in the stated direction" if effect > 0 else "the opposite way" if effect < 0 else "not at all"))
        return result("inconclusive", (
            f"Inconclusive: one seed. {moved} (wanted: {want}), "
            "but a single pair cannot separate the effect from seed noise." + needed_text), effect=effect)

    p = _paired_p_value(metric.differences)
    from reports.compare import t_interval

    low, high = t_interval(metric.differences, 1 - h.alpha)
    effect_ci = tuple(sorted((low * scale, high * scale)))
    ci_text = f"{1 - h.alpha:.0%} CI [{_pct(effect_ci[0])}, {_pct(effect_ci[1])}]"
    stats_text = f"{_pct(effect)} in the stated direction over {metric.n} seeds, p = {p:.3g}, {ci_text}"
    kw = {"effect": effect, "effect_ci": effect_ci, "p_value": p}

    significant = p < h.alpha
    if significant and effect > 0 and effect >= h.min_effect:
        return result("supported", f"Supported: {stats_text} (wanted: {want}).", **kw)
    if significant and effect < 0:
        return result("refuted", f"Refuted: significant effect the other way: {stats_text} (wanted: {want}).", **kw)
    if effect_ci[1] < h.min_effect:
        return result("refuted", (
            f"Refuted: the effect is significantly smaller than min_effect {h.min_effect:.1%}: {stats_text}."), **kw)
    if significant:
        return result("inconclusive", (
            f"Inconclusive: {stats_text}: significant but below min_effect {h.min_effect:.1%}, "
            "and the interval still reaches it." + needed_text), **kw)
    return result("inconclusive", (
        f"Inconclusive: too noisy: {stats_text} (p >= alpha {h.alpha:g}; wanted: {want})." + needed_text), **kw)
