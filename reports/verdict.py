"""The hypothesis verdict: supported, refuted or inconclusive, always with its reason (pure).

The rule, stated in every verdict ("one-sided paired t-test on per-seed log ratios, n = 3,
alpha = 0.05, margin 2 %"):

    d_i = s * log(candidate_i / baseline_i)      s = -1 for "decrease", +1 for "increase"

one log ratio per paired seed, positive when the metric moved the stated way, tested against
the margin

    M = log(1 + min_effect)    for "increase"  (candidate >= (1 + min_effect) x baseline)
    M = -log(1 - min_effect)   for "decrease"  (candidate <= (1 - min_effect) x baseline)

With n >= 2 pairs, mean d, sd s_d and t = t_{1-alpha, n-1}: lower = d - t s_d / sqrt(n),
upper = d + t s_d / sqrt(n) (the two one-sided (1 - alpha) bounds).

Why log ratios: seed noise multiplies a metric (a loss, a throughput), so log c_i - log b_i
is a difference of two identically distributed noise terms, symmetric about the true log
effect in *both* directions. The earlier mean of per-seed relative differences
(c_i - b_i) / |b_i| sits about sigma^2 above the ratio of means for an `increase` metric
(P(supported | effect = min_effect) 0.0595 at 5 % noise, n = 16) and below it for a
`decrease` one. Effects and bounds are reported back on the relative scale,
exp(x) - 1 ("increase") or 1 - exp(-x) ("decrease"), a monotone map with f(M) = min_effect,
so "lower bound > min_effect" reads the same on either scale.

- **supported** when lower > M: H0 "effect <= min_effect" rejected at level alpha, so
  P(supported) <= alpha whenever the true effect is at most min_effect
  (`tests/unit/test_report_simulation.py`: both directions, n = 2..16, noise 0.5-5 %).
- **refuted** when upper < M (significantly smaller than what counts; upper < 0: the wrong way).
- **inconclusive** otherwise: one pair, no noise estimate (the seed-to-seed spread of either
  side, or of the log ratios, is below NO_SPREAD relative to the metric: float jitter is not
  a variance), a non-positive value (no log), or an interval that still contains min_effect.

Seeds needed: the smallest n >= 2 whose exact power (noncentral t, `scipy.stats.nct`) for
"supported" reaches 0.8 at the *planning effect*, twice min_effect, computed from an upper
confidence bound on the sd (see `planning_sd`): a sd measured on 3 seeds is too small exactly
when it promises a feasible n.
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
RULE = "one-sided paired t-test on per-seed log ratios"
NO_SPREAD = 1e-6
"""Relative seed-to-seed spread (sd / |mean| of one side's values, or sd of the log ratios) at
or below this is no noise estimate. float32 rounding of a loss is ~6e-8 relative and two real
seeds differ by 1e-4 or more; a near-copy that differs by float jitter (2e-9) is not a sample."""
SD_CONFIDENCE = 0.9
"""The seeds hint sizes a study with an upper SD_CONFIDENCE bound on the observed sd."""

# Vectorised decision codes (simulation and `verdict` share `decide`).
SUPPORTED, REFUTED, INCONCLUSIVE = 1, -1, 0


def log_margin(direction: str, min_effect: float) -> float:
    """The margin on the log-ratio scale: log(1 + m) for "increase", -log(1 - m) for "decrease"."""
    if direction == "increase":
        return math.log1p(min_effect)
    assert min_effect < 1, "a decrease of 100 % or more cannot be reached (validation bounds min_effect)"
    return -math.log1p(-min_effect)


def to_relative(direction: str, x: Any) -> Any:
    """A stated-direction log effect back to a relative one (0.03 = 3 % better); monotone,
    and to_relative(d, log_margin(d, m)) == m."""
    import numpy as np

    return np.expm1(x) if direction == "increase" else -np.expm1(-np.asarray(x, dtype=float))


def pct_exact(x: float) -> str:
    """A registered fraction as a percentage with every digit it has (0.0025 -> '0.25 %')."""
    return f"{100 * x:.6g} %"


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    reason: str
    metric: str
    n_pairs: int
    effect: float | None = None
    """Relative effect in the stated direction (0.03 = 3 % better): from the mean log ratio,
    exp(d) - 1 ("increase") or 1 - exp(-d) ("decrease")."""
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
    excluded_seeds: tuple[int | None, ...] = ()
    """Seeds that diverged on both sides: left out of the comparison (nothing to compare)."""


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
    return f"{RULE}, n = {n}, alpha = {alpha:g}, margin {pct_exact(min_effect)}"


def _pct_plain(x: float) -> str:
    return f"{100 * x:.3g} %"


def _pct(x: float) -> str:
    return f"{100 * x:+.2f} %"


def bounds(mean: Any, sd: Any, n: int, alpha: float) -> tuple[Any, Any]:
    """The one-sided (1 - alpha) lower and upper bounds of the mean (numpy arrays or floats)."""
    from scipy import stats

    half = stats.t.ppf(1 - alpha, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def decide(log_ratios: Any, margin: float, alpha: float) -> Any:
    """Vectorised rule over the last axis of `log_ratios` (stated direction, log scale) against
    `margin` (`log_margin`): SUPPORTED, REFUTED or INCONCLUSIVE per row. Rows without a noise
    estimate (sd <= NO_SPREAD) and single-pair rows are INCONCLUSIVE."""
    import numpy as np

    d = np.asarray(log_ratios, dtype=float)
    n = d.shape[-1]
    if n < 2:
        return np.zeros(d.shape[:-1], dtype=int)
    mean, sd = d.mean(axis=-1), d.std(axis=-1, ddof=1)
    lower, upper = bounds(mean, sd, n, alpha)
    spread = sd > NO_SPREAD
    return np.where(spread & (lower > margin), SUPPORTED, np.where(spread & (upper < margin), REFUTED, INCONCLUSIVE))


def decide_values(candidate: Any, baseline: Any, direction: str, min_effect: float, alpha: float) -> Any:
    """The whole rule `verdict` applies, vectorised over rows of raw per-seed values (last
    axis: paired seeds): log ratios, the spread guard on either side, the test."""
    import numpy as np

    c, b = np.asarray(candidate, dtype=float), np.asarray(baseline, dtype=float)
    sign = 1.0 if direction == "increase" else -1.0
    codes = decide(sign * np.log(c / b), log_margin(direction, min_effect), alpha)
    if c.shape[-1] >= 2:
        flat = (_relative_sd(c) <= NO_SPREAD) | (_relative_sd(b) <= NO_SPREAD)
        codes = np.where(flat, INCONCLUSIVE, codes)
    return codes


def _relative_sd(values: Any) -> Any:
    import numpy as np

    v = np.asarray(values, dtype=float)
    return v.std(axis=-1, ddof=1) / np.abs(v.mean(axis=-1))


def power(n: int, sd: float, min_effect: float, alpha: float, effect: float | None = None,
          direction: str = "decrease") -> float:
    """Exact probability of "supported" with n pairs when the true relative effect is
    `effect` (default: the planning effect) and the log ratios have sd `sd`."""
    from scipy import stats

    if n < 2:
        return 0.0
    effect = PLANNING_FACTOR * min_effect if effect is None else effect
    if sd <= 0:
        return 0.0  # no spread is never decided (see `decide`)
    nc = (log_margin(direction, effect) - log_margin(direction, min_effect)) * math.sqrt(n) / sd
    return float(stats.nct.sf(stats.t.ppf(1 - alpha, n - 1), n - 1, nc))


def seeds_needed(sd: float, min_effect: float, alpha: float, target: float = POWER,
                 effect: float | None = None, direction: str = "decrease") -> int | None:
    """Smallest n >= 2 with `power(n) >= target` (None beyond SEARCH_LIMIT).

    `sd` is the sd of the per-seed log ratios. Power grows with n, so a doubling search then
    a bisection finds it in a few dozen nct evaluations.
    """
    assert min_effect > 0 and 0 < alpha < 1
    if direction == "decrease":
        planned = PLANNING_FACTOR * min_effect if effect is None else effect
        if planned >= 1:  # a 100 % decrease is unreachable: plan for halfway to it instead
            effect = (1 + min_effect) / 2
    if sd <= 0:
        return 2

    def enough(n: int) -> bool:
        return power(n, sd, min_effect, alpha, effect, direction) >= target

    if enough(2):
        return 2
    low, high = 2, 4
    while not enough(high):
        low, high = high, high * 2
        if high > SEARCH_LIMIT:
            return None
    while high - low > 1:  # power(low) < target <= power(high)
        mid = (low + high) // 2
        if enough(mid):
            high = mid
        else:
            low = mid
    return high


def planning_sd(sd: float, n: int, confidence: float = SD_CONFIDENCE) -> float:
    """An upper `confidence` bound on a sd measured from n values (chi-square, n - 1 df):
    the study is sized for the noise it may have, not the noise a few seeds happened to show.
    With it P(realised power < 0.8 at the hinted n) <= 1 - confidence whatever the true noise."""
    from scipy import stats

    if n < 2:
        return sd
    return sd * math.sqrt((n - 1) / stats.chi2.ppf(1 - confidence, n - 1))


def log_ratios(comparison: Comparison) -> tuple[float, ...] | None:
    """Per-seed log ratios of the hypothesis metric in the stated direction; None when a
    paired value is not positive (no log ratio)."""
    h = comparison.hypothesis
    sign = -1.0 if h.direction == "decrease" else 1.0
    values = comparison.primary_pairs
    if any(c <= 0 or b <= 0 for c, b in values):
        return None
    return tuple(sign * math.log(c / b) for c, b in values)


def _hint(sd: float | None, h: HypothesisView, n_now: int, source: str, measured_on: int) -> tuple[int | None, str]:
    """(seeds needed, sentence) for an undecided comparison; `sd` measured on `measured_on` values."""
    if sd is None or not math.isfinite(sd) or sd <= NO_SPREAD:
        return None, ""
    planning = PLANNING_FACTOR * h.min_effect
    if h.direction == "decrease" and planning >= 1:
        planning = (1 + h.min_effect) / 2
    bound = planning_sd(sd, measured_on)
    needed = seeds_needed(bound, h.min_effect, h.alpha, effect=planning, direction=h.direction)
    basis = (f"with {source} (log ratios with sd {_pct_plain(sd)}, {100 * SD_CONFIDENCE:.0f} % upper bound "
             f"{_pct_plain(bound)} from {measured_on} values), to call it supported with at least 80 % power "
             f"if the true effect were {_pct_plain(planning)}")
    follow = (" Seeds added to these runs only give an exploratory look: a confirmatory answer is a new "
              "registration on fresh seeds (see docs/verdicts.md).")
    if needed is None or needed > MAX_SEEDS:
        count = "far more" if needed is None else f"{needed}"
        return needed, (f" Seeds: {basis}, {count} paired seeds would be needed: more than the schema's "
                        f"maximum of {MAX_SEEDS}. This setup cannot decide a {pct_exact(h.min_effect)} margin; "
                        "reduce the seed noise (longer training, a larger eval set) or test a larger effect.")
    return needed, (f" Seeds: {basis}, about {needed} paired seeds would be needed (the bound holds "
                    f"{round(10 * SD_CONFIDENCE)} times in 10; when it does not, the power is lower).{follow}")


def diverged_runs(runs: Sequence[Any]) -> list[Any]:
    return [r for r in runs if getattr(r, "status", None) == "diverged"]


def verdict(comparison: Comparison, *, candidates: Sequence[Any] = (), baselines: Sequence[Any] = ()) -> Verdict:
    """The verdict on `comparison`; `candidates`/`baselines` (RunRecords) let it see diverged runs."""
    h = comparison.hypothesis
    metric = comparison.primary
    base_values = comparison.baseline_values
    base_sd_log = None
    if len(base_values) >= 2 and all(b > 0 for b in base_values):
        base_sd_log = stdev(math.log(b) for b in base_values)
    base_sd = stdev(base_values) if len(base_values) >= 2 else None
    want = f"{h.direction} by at least {pct_exact(h.min_effect)}"

    # A seed that diverged on both sides says nothing about the change: leave it out, say so.
    both = {r.seed for r in diverged_runs(candidates)} & {r.seed for r in diverged_runs(baselines)}
    excluded = tuple(sorted(both, key=lambda s: (s is None, s or 0)))
    plural = len(excluded) > 1
    left_out = (f" Seed{'s' if plural else ''} {', '.join(str(s) for s in excluded)} diverged on both sides and "
                f"{'are' if plural else 'is'} left out: a seed neither side can train says nothing about the change."
                if excluded else "")

    def result(outcome: Outcome, reason: str, **kw: Any) -> Verdict:
        kw.setdefault("seeds_needed", None)
        return Verdict(outcome, reason + left_out, h.metric, metric.n if metric else 0, baseline_sd=base_sd,
                       alpha=h.alpha, excluded_seeds=excluded, **kw)

    broken = [r for r in diverged_runs(candidates) if r.seed not in both]
    if broken:
        first = min(broken, key=lambda r: (r.diverged_at_step is None, r.diverged_at_step or 0))
        step = first.diverged_at_step
        where = f"at step {step}" if step is not None else "(step not recorded)"
        seeds = ", ".join(str(r.seed) for r in broken)
        total = len({r.seed for r in candidates if r.seed not in both})
        return result("refuted", (
            f"Refuted: candidate diverged {where} (seed{'s' if len(broken) > 1 else ''} {seeds}, {len(broken)} of "
            f"{total}): its loss became non-finite or rose above uniform guessing where the baseline trained "
            f"stably, so it cannot {h.direction} `{h.metric}`. A change that makes training unstable on some "
            "seeds is refuted whatever its other seeds show: the effect on the seeds that survived is not the "
            "effect of the change."), diverged_at_step=step)
    base_broken = [r for r in diverged_runs(baselines) if r.seed not in both]
    if base_broken:
        step = base_broken[0].diverged_at_step
        return result("inconclusive", (
            f"Inconclusive: the baseline diverged{f' at step {step}' if step is not None else ''} "
            f"(seed {base_broken[0].seed}) where the candidate did not; there is nothing sound to compare with."))

    if metric is None:
        hint_sd = math.sqrt(2) * base_sd_log if base_sd_log is not None else None
        needed, hint = _hint(hint_sd, h, 0, "the baseline's seed spread", len(base_values))
        if not comparison.pairs and not comparison.unpaired_baseline_seeds:
            return result("inconclusive", f"Inconclusive: no finished baseline run (`{h.baseline or 'baseline'}`) to compare with.")
        if not comparison.pairs:
            return result("inconclusive", (
                "Inconclusive: no finished candidate and baseline runs share a seed "
                f"(candidate seeds {list(comparison.unpaired_candidate_seeds)}, "
                f"baseline seeds {list(comparison.unpaired_baseline_seeds)})." + hint), seeds_needed=needed)
        return result("inconclusive", f"Inconclusive: `{h.metric}` is missing from the paired runs.")

    values = comparison.primary_pairs
    n = len(values)
    d = log_ratios(comparison)
    rule = rule_text(n, h.alpha, h.min_effect)
    if n == 1:
        hint_sd = math.sqrt(2) * base_sd_log if base_sd_log is not None else None
        needed, hint = _hint(hint_sd, h, 1, "the baseline's seed spread", len(base_values))
        c, b = values[0]
        raw = (c - b) / abs(b) if b else 0.0
        effect = float(to_relative(h.direction, d[0])) if d is not None else (raw if h.direction == "increase" else -raw)
        # Say which way the metric itself went: "+1.68 % in the stated direction" read as a rise
        # next to the table's -1.68 % for a metric that should decrease.
        went = "rose" if raw > 0 else "fell" if raw < 0 else "did not move"
        way = ", the stated direction" if effect > 0 else ", the opposite way" if effect < 0 else ""
        amount = f" {_pct_plain(abs(raw))}" if raw else ""
        return result("inconclusive", (
            f"Inconclusive: one seed. `{h.metric}` {went}{amount}{way} (wanted: {want}), "
            "but a single pair cannot separate the effect from seed noise; the verdict needs at "
            "least 2 paired seeds (3 or more to have power)." + hint),
            effect=effect, seeds_needed=needed, rule=rule)
    if d is None:
        return result("inconclusive", (
            f"Inconclusive: a paired `{h.metric}` value is zero or negative, so a ratio (the rule's log ratio) "
            "is undefined."))

    mean = fmean(d)
    effect = float(to_relative(h.direction, mean))
    sd = stdev(d)
    flat = [side for side, vals in (("candidate", [c for c, _ in values]), ("baseline", [b for _, b in values]))
            if stdev(vals) <= NO_SPREAD * abs(fmean(vals))]
    if sd <= NO_SPREAD or flat:
        if sd <= NO_SPREAD and abs(mean) <= NO_SPREAD:
            why = (f"candidate and baseline agree on all {n} seeds to within {NO_SPREAD:g} relative (float "
                   "rounding): this is an A/A comparison (the same runs, or a change that does not reach "
                   "training), not a test of anything. Compare against a different baseline, or change "
                   "something that is trained.")
        elif flat:
            why = (f"the {' and the '.join(flat)}'s {n} seeds gave the same `{h.metric}` (relative spread at or "
                   f"below {NO_SPREAD:g}): the seed does not change the run, so there is no noise estimate. "
                   "Check that the seed changes the initialisation and the data order.")
        else:
            why = (f"all {n} seeds gave the same relative difference ({_pct(effect)}, spread at or below "
                   f"{NO_SPREAD:g}): the candidate looks like a rescaled copy of the baseline, and the test has "
                   "no noise estimate. Check that each side's seed changes its run.")
        return result("inconclusive", f"Inconclusive: no noise estimate: {why}", effect=effect, rule=rule)

    from scipy import stats

    margin = log_margin(h.direction, h.min_effect)
    se = sd / math.sqrt(n)
    lower_log, upper_log = bounds(mean, sd, n, h.alpha)
    lower, upper = float(to_relative(h.direction, lower_log)), float(to_relative(h.direction, upper_log))
    p = float(stats.t.sf((mean - margin) / se, n - 1))
    level = f"{100 * (1 - h.alpha):.3g} %"
    stats_text = (f"effect {_pct(effect)} in the stated direction (geometric mean of the per-seed ratios), "
                  f"one-sided {level} bounds [{_pct(lower)}, {_pct(upper)}] ({rule})")
    kw: dict[str, Any] = {"effect": effect, "effect_ci": (lower, upper), "p_value": p, "rule": rule}
    if lower_log > margin:
        return result("supported", (
            f"Supported: the lower bound {_pct(lower)} clears min_effect {pct_exact(h.min_effect)}: {stats_text}."), **kw)
    if upper_log < 0:
        return result("refuted", (
            f"Refuted: significant effect the other way (upper bound {_pct(upper)} < 0; wanted: {want}): "
            f"{stats_text}."), **kw)
    if upper_log < margin:
        return result("refuted", (
            f"Refuted: the effect is significantly smaller than min_effect {pct_exact(h.min_effect)} "
            f"(upper bound {_pct(upper)}): {stats_text}."), **kw)
    needed, hint = _hint(sd, h, n, "the observed seed spread", n)
    return result("inconclusive", (
        f"Inconclusive: the interval still contains min_effect {pct_exact(h.min_effect)} "
        f"(wanted: {want}): {stats_text}." + hint), seeds_needed=needed, **kw)
