"""The hypothesis verdict: supported, refuted or inconclusive, always with its reason (pure).

The rule, stated in every verdict ("one-sided paired t-test on per-seed relative
differences, n = 3, alpha = 0.05, margin 2 %"):

    r_i = s * (candidate_i - baseline_i) / |baseline_i|     s = -1 for "decrease"

one relative difference per paired seed, each against its own seed's baseline (so the
denominator is exact per pair, no ratio of means and no delta method), positive when the
metric moved the stated way. With n >= 2 pairs, mean r, sd s_r and t = t_{1-alpha, n-1}:

    lower = r - t * s_r / sqrt(n)      upper = r + t * s_r / sqrt(n)

(the two one-sided (1 - alpha) confidence bounds; together a (1 - 2 alpha) interval).

- **supported** when lower > min_effect: a superiority-margin test of H0 "effect <=
  min_effect" at level alpha, so P(supported) <= alpha whenever the true effect is at
  most min_effect, whatever the number of seeds (`tests/test_report_simulation.py`).
- **refuted** when upper < min_effect: the effect is significantly smaller than what
  counts (H0 "effect >= min_effect" rejected at alpha); when upper < 0 it went
  significantly the wrong way.
- **inconclusive** otherwise, with what would settle it: one pair (no spread, no test),
  zero spread between seeds (a t-test without a variance estimate would invent
  significance), or an interval that still contains min_effect, with the seeds needed.

Seeds needed: the smallest n >= 2 whose exact power (noncentral t, `scipy.stats.nct`)
for "supported" reaches 0.8 when the true effect is the *planning effect*, twice
min_effect (at min_effect itself the power of a margin test is alpha by construction):

    power(n) = P(T' > t_{1-alpha, n-1}),  T' ~ nct(n - 1, (planning - min_effect) * sqrt(n) / sd)

with sd the observed sd of the relative differences, or, before two pairs exist,
sqrt(2) x the baseline's relative seed sd (seeds varying independently on both sides).
Above the schema's maximum number of seeds the hint says so plainly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean, stdev
from typing import Any, Literal

from reports.compare import Comparison, HypothesisView

Outcome = Literal["supported", "refuted", "inconclusive", "identical"]
POWER = 0.8
PLANNING_FACTOR = 2.0
"""The seeds hint plans for a true effect of PLANNING_FACTOR x min_effect."""
MAX_SEEDS = 16
"""`hypothesis.seeds` upper bound in the schema (validation.spec.Hypothesis)."""
SEARCH_LIMIT = 100_000
"""seeds_needed stops counting here (returns None: "far more than anyone will run")."""
RULE = "one-sided paired t-test on per-seed relative differences"
ZERO_SPREAD = 1e-12
"""A relative-difference sd at or below this is zero spread (float rounding of equal values)."""

# Vectorised decision codes (simulation and `verdict` share `decide`).
SUPPORTED, REFUTED, INCONCLUSIVE = 1, -1, 0


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    reason: str
    metric: str
    n_pairs: int
    effect: float | None = None
    """Mean per-seed relative effect in the stated direction (0.03 = 3 % better)."""
    effect_ci: tuple[float, float] | None = None
    """(lower, upper): the two one-sided (1 - alpha) bounds of `effect`."""
    p_value: float | None = None
    """One-sided p of H0 "effect <= min_effect" (small: supported)."""
    seeds_needed: int | None = None
    """Paired seeds for 80 % power at the planning effect; None when unknown or beyond SEARCH_LIMIT."""
    baseline_sd: float | None = None
    rule: str = ""
    """The test, named with its n, alpha and margin (shown in the comment)."""
    alpha: float | None = None
    """The level the verdict was decided at."""
    diverged_at_step: int | None = None


def headline(outcome: str, reason: str) -> str:
    """One line for a terminal: the outcome in capitals, then the reason, the outcome named once.

    Reasons open with their outcome ("Inconclusive: one seed. ...") because the PR comment and
    the report print them alone after "**Verdict:**"; a line that puts the outcome in front
    drops that opening word ("INCONCLUSIVE: one seed. ..."), or capitalises it when the
    reason uses it in a sentence ("IDENTICAL to `base` ...")."""
    word = outcome.strip()
    if not reason.strip():
        return word.upper()
    head, _, rest = reason.partition(" ")
    if word and head.rstrip(":").lower() == word.lower():
        return f"{word.upper()}: {rest}" if head.endswith(":") else f"{word.upper()} {rest}"
    return f"{word.upper()}: {reason}"


def rule_text(n: int, alpha: float, min_effect: float) -> str:
    return f"{RULE}, n = {n}, alpha = {alpha:g}, margin {_pct_plain(min_effect)}"


def _pct_plain(x: float) -> str:
    return f"{100 * x:.3g} %"


def _pct(x: float) -> str:
    return f"{100 * x:+.2f} %"


def bounds(mean: Any, sd: Any, n: int, alpha: float) -> tuple[Any, Any]:
    """The one-sided (1 - alpha) lower and upper bounds of the mean (numpy arrays or floats)."""
    from scipy import stats

    half = stats.t.ppf(1 - alpha, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def decide(differences: Any, min_effect: float, alpha: float) -> Any:
    """Vectorised rule over the last axis of `differences` (relative, signed): SUPPORTED,
    REFUTED or INCONCLUSIVE per row. Zero-spread and single-pair rows are INCONCLUSIVE."""
    import numpy as np

    r = np.asarray(differences, dtype=float)
    n = r.shape[-1]
    if n < 2:
        return np.zeros(r.shape[:-1], dtype=int)
    mean, sd = r.mean(axis=-1), r.std(axis=-1, ddof=1)
    lower, upper = bounds(mean, sd, n, alpha)
    spread = sd > ZERO_SPREAD
    return np.where(spread & (lower > min_effect), SUPPORTED, np.where(spread & (upper < min_effect), REFUTED, INCONCLUSIVE))


def power(n: int, sd: float, min_effect: float, alpha: float, effect: float | None = None) -> float:
    """Exact probability of "supported" with n pairs when the true relative effect is
    `effect` (default: the planning effect) and the relative differences have sd `sd`."""
    from scipy import stats

    if n < 2:
        return 0.0
    effect = PLANNING_FACTOR * min_effect if effect is None else effect
    if sd <= 0:
        return 0.0  # zero spread is never decided (see `decide`)
    nc = (effect - min_effect) * math.sqrt(n) / sd
    return float(stats.nct.sf(stats.t.ppf(1 - alpha, n - 1), n - 1, nc))


def seeds_needed(sd: float, min_effect: float, alpha: float, target: float = POWER,
                 effect: float | None = None) -> int | None:
    """Smallest n >= 2 with `power(n) >= target` (None beyond SEARCH_LIMIT).

    `sd` is the sd of the per-seed *relative* differences. Power grows with n, so a
    doubling search then a bisection finds it in a few dozen nct evaluations.
    """
    assert min_effect > 0 and 0 < alpha < 1
    if sd <= 0:
        return 2
    if power(2, sd, min_effect, alpha, effect) >= target:
        return 2
    low, high = 2, 4
    while power(high, sd, min_effect, alpha, effect) < target:
        low, high = high, high * 2
        if high > SEARCH_LIMIT:
            return None
    while high - low > 1:  # power(low) < target <= power(high)
        mid = (low + high) // 2
        if power(mid, sd, min_effect, alpha, effect) >= target:
            high = mid
        else:
            low = mid
    return high


def relative_differences(comparison: Comparison) -> tuple[float, ...] | None:
    """Per-seed relative differences of the hypothesis metric in the stated direction;
    None when a paired baseline value is 0 (a relative effect is undefined)."""
    h = comparison.hypothesis
    sign = -1.0 if h.direction == "decrease" else 1.0
    values = comparison.primary_pairs
    if any(b == 0 for _, b in values):
        return None
    return tuple(sign * (c - b) / abs(b) for c, b in values)


def _hint(sd: float | None, h: HypothesisView, n_now: int, source: str) -> tuple[int | None, str]:
    """(seeds needed, sentence) for an undecided comparison."""
    if sd is None or not math.isfinite(sd):
        return None, ""
    planning = PLANNING_FACTOR * h.min_effect
    if sd <= ZERO_SPREAD:
        return None, ""
    needed = seeds_needed(sd, h.min_effect, h.alpha)
    basis = (f"with {source} (per-seed relative differences with sd {_pct_plain(sd)}), "
             f"to call it supported with 80 % power if the true effect were {_pct_plain(planning)} "
             f"(2x min_effect)")
    if needed is None or needed > MAX_SEEDS:
        count = "far more" if needed is None else f"{needed}"
        return needed, (f" Seeds: {basis}, {count} paired seeds would be needed: more than the schema's "
                        f"maximum of {MAX_SEEDS}. This setup cannot decide a {_pct_plain(h.min_effect)} margin; "
                        "reduce the seed noise (longer training, a larger eval set) or test a larger effect.")
    if needed <= n_now:
        return needed, (f" Seeds: {basis}, {needed} paired seeds would do and {n_now} ran: the estimate sits "
                        "too close to min_effect to tell; more seeds narrow the interval.")
    caveat = (f" A spread measured on {n_now} seeds is itself uncertain, so take that as a lower bound."
              if 2 <= n_now < 5 else "")
    return needed, f" Seeds: {basis}, about {needed} paired seeds would be needed.{caveat}"


def diverged_runs(runs: Sequence[Any]) -> list[Any]:
    return [r for r in runs if getattr(r, "status", None) == "diverged"]


def verdict(comparison: Comparison, *, candidates: Sequence[Any] = (), baselines: Sequence[Any] = ()) -> Verdict:
    """The verdict on `comparison`; `candidates`/`baselines` (RunRecords) let it see diverged runs."""
    h = comparison.hypothesis
    metric = comparison.primary
    base_values = comparison.baseline_values
    base_sd_rel = None
    if len(base_values) >= 2 and fmean(base_values) != 0:
        base_sd_rel = stdev(base_values) / abs(fmean(base_values))
    base_sd = stdev(base_values) if len(base_values) >= 2 else None
    want = f"{h.direction} by at least {_pct_plain(h.min_effect)}"

    def result(outcome: Outcome, reason: str, **kw: Any) -> Verdict:
        kw.setdefault("seeds_needed", None)
        return Verdict(outcome, reason, h.metric, metric.n if metric else 0, baseline_sd=base_sd, alpha=h.alpha, **kw)

    broken = diverged_runs(candidates)
    if broken:
        first = min(broken, key=lambda r: (r.diverged_at_step is None, r.diverged_at_step or 0))
        step = first.diverged_at_step
        where = f"at step {step}" if step is not None else "(step not recorded)"
        seeds = ", ".join(str(r.seed) for r in broken)
        return result("refuted", (
            f"Refuted: candidate diverged {where} (seed{'s' if len(broken) > 1 else ''} {seeds}): "
            "its loss became non-finite or rose above uniform guessing, so it cannot "
            f"{h.direction} `{h.metric}`."), diverged_at_step=step)
    if diverged_runs(baselines):
        step = diverged_runs(baselines)[0].diverged_at_step
        return result("inconclusive", (
            f"Inconclusive: the baseline diverged{f' at step {step}' if step is not None else ''}; "
            "there is nothing sound to compare with."))

    if metric is None:
        hint_sd = math.sqrt(2) * base_sd_rel if base_sd_rel is not None else None
        needed, hint = _hint(hint_sd, h, 0, "the baseline's seed spread")
        if not comparison.pairs and not comparison.unpaired_baseline_seeds:
            return result("inconclusive", f"Inconclusive: no finished baseline run (`{h.baseline or 'baseline'}`) to compare with.")
        if not comparison.pairs:
            return result("inconclusive", (
                "Inconclusive: no finished candidate and baseline runs share a seed "
                f"(candidate seeds {list(comparison.unpaired_candidate_seeds)}, "
                f"baseline seeds {list(comparison.unpaired_baseline_seeds)})." + hint), seeds_needed=needed)
        return result("inconclusive", f"Inconclusive: `{h.metric}` is missing from the paired runs.")

    r = relative_differences(comparison)
    if r is None:
        return result("inconclusive", f"Inconclusive: a baseline `{h.metric}` is 0, so a relative effect is undefined.")
    n = len(r)
    effect = fmean(r)
    rule = rule_text(n, h.alpha, h.min_effect)
    if n == 1:
        hint_sd = math.sqrt(2) * base_sd_rel if base_sd_rel is not None else None
        needed, hint = _hint(hint_sd, h, 1, "the baseline's seed spread")
        # Say which way the metric itself went: "+1.68 % in the stated direction" read as a rise
        # next to the table's -1.68 % for a metric that should decrease.
        raw = effect if h.direction == "increase" else -effect
        went = "rose" if raw > 0 else "fell" if raw < 0 else "did not move"
        way = ", the stated direction" if effect > 0 else ", the opposite way" if effect < 0 else ""
        amount = f" {_pct_plain(abs(raw))}" if raw else ""
        return result("inconclusive", (
            f"Inconclusive: one seed. `{h.metric}` {went}{amount}{way} (wanted: {want}), "
            "but a single pair cannot separate the effect from seed noise; the verdict needs at "
            "least 2 paired seeds (3 or more to have power)." + hint),
            effect=effect, seeds_needed=needed, rule=rule)

    sd = stdev(r)
    if sd <= ZERO_SPREAD:
        return result("inconclusive", (
            f"Inconclusive: all {n} seeds gave the same relative difference ({_pct(effect)}): zero spread, "
            "so the test has no noise estimate and cannot tell a real effect from none. "
            "Check that the seed changes the run (initialisation, data order)."), effect=effect, rule=rule)

    from scipy import stats

    se = sd / math.sqrt(n)
    lower, upper = bounds(effect, sd, n, h.alpha)
    p = float(stats.t.sf((effect - h.min_effect) / se, n - 1))
    level = f"{100 * (1 - h.alpha):.3g} %"
    stats_text = (f"mean relative effect {_pct(effect)} in the stated direction, one-sided {level} bounds "
                  f"[{_pct(lower)}, {_pct(upper)}] ({rule})")
    kw: dict[str, Any] = {"effect": effect, "effect_ci": (lower, upper), "p_value": p, "rule": rule}
    if lower > h.min_effect:
        return result("supported", (
            f"Supported: the lower bound {_pct(lower)} clears min_effect {_pct_plain(h.min_effect)}: {stats_text}."), **kw)
    if upper < 0:
        return result("refuted", (
            f"Refuted: significant effect the other way (upper bound {_pct(upper)} < 0; wanted: {want}): "
            f"{stats_text}."), **kw)
    if upper < h.min_effect:
        return result("refuted", (
            f"Refuted: the effect is significantly smaller than min_effect {_pct_plain(h.min_effect)} "
            f"(upper bound {_pct(upper)}): {stats_text}."), **kw)
    needed, hint = _hint(sd, h, n, "the observed seed spread")
    return result("inconclusive", (
        f"Inconclusive: the interval still contains min_effect {_pct_plain(h.min_effect)} "
        f"(wanted: {want}): {stats_text}." + hint), seeds_needed=needed, **kw)
