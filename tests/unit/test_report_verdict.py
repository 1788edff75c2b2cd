"""compare() and verdict() on hand-computed cases (pure; no files, no servers).

The rule: one-sided paired t-test on per-seed log ratios d_i = s log(c_i / b_i) (s = -1 for
"decrease") against the margin -log(1 - min_effect) ("decrease") or log(1 + min_effect)
("increase"). Hand values use the closed forms of Student's t with 2 degrees of freedom:
F(t) = 1/2 + t / (2 sqrt(2 + t^2)) and t_p = (2p - 1) / sqrt(2 p (1 - p)), so
t_{0.95, 2} = 0.9 / sqrt(0.095) = 2.919986. Candidates are written as baseline x ratio, so
d_i = -log(ratio_i) exactly.
"""

from __future__ import annotations

import math
from statistics import fmean, stdev

import pytest

from reports.compare import HypothesisView, compare, pair_by_seed
from reports.records import RunRecord
from reports.verdict import MAX_SEEDS, planning_sd, power, seeds_needed, verdict

T_95_DF2 = 0.9 / math.sqrt(0.095)


def run(seed: int | None, value: float, *, experiment: str = "cand", metric: str = "eval/loss", status: str = "finished",
        extra: dict[str, float] | None = None, diverged_at_step: int | None = None) -> RunRecord:
    return RunRecord(run_id=f"{experiment}-{seed}", experiment=experiment, seed=seed, status=status,
                     final_metrics={metric: value, **(extra or {})}, diverged_at_step=diverged_at_step)


def hyp(**kw) -> HypothesisView:
    base = {"metric": "eval/loss", "direction": "decrease", "min_effect": 0.02, "alpha": 0.05, "seeds": 3,
            "statement": "Lower loss because of a better learning rate schedule."}
    return HypothesisView(**{**base, **kw})


BASE_VALUES = (5.0, 5.1, 4.9)
BASE = [run(s, v, experiment="base") for s, v in zip((1, 2, 3), BASE_VALUES, strict=True)]  # sd 0.1
FLAT = [run(s, 5.0, experiment="base") for s in (1, 2, 3)]  # the seed changes nothing: no noise estimate


def sides(ratios, baseline=BASE, **kw):
    """Candidate seed i = baseline seed i x ratios[i]."""
    cands = [run(b.seed, b.final_metrics["eval/loss"] * r) for b, r in zip(baseline, ratios, strict=False)]
    return compare(cands, baseline, hyp(**kw))


def hand(ratios, alpha_t=T_95_DF2):
    """(mean d, sd d, half width) for a decrease, by hand."""
    d = [-math.log(r) for r in ratios]
    return fmean(d), stdev(d), alpha_t * stdev(d) / math.sqrt(len(d))


def test_three_seeds_supported_with_hand_computed_bounds_and_p_value():
    ratios = (0.96, 0.958, 0.962)
    comparison = sides(ratios)
    m = comparison.primary
    mean, sd, half = hand(ratios)
    assert m.n == 3 and m.delta_pct == pytest.approx(100 * (math.exp(-mean) - 1))
    v = verdict(comparison)
    assert v.outcome == "supported", v.reason
    assert v.effect == pytest.approx(1 - math.exp(-mean))
    assert v.effect_ci == (pytest.approx(1 - math.exp(-(mean - half)), abs=1e-12),
                           pytest.approx(1 - math.exp(-(mean + half)), abs=1e-12))
    # H0 effect <= 0.02: t = (mean + log 0.98) / (sd / sqrt 3); one-sided p = (1 - t / sqrt(2 + t^2)) / 2
    t = (mean + math.log(0.98)) / (sd / math.sqrt(3))
    assert v.p_value == pytest.approx((1 - t / math.sqrt(2 + t * t)) / 2, rel=1e-6)
    assert v.rule == "one-sided paired t-test on per-seed log ratios, n = 3, alpha = 0.05, margin 2 %"
    assert v.rule in v.reason and v.reason.startswith("Supported: the lower bound")
    # the table's interval is the verdict's: 90 % two-sided = the two one-sided 95 % bounds (sign of c - b)
    assert comparison.confidence == pytest.approx(0.90)
    assert m.ci_pct == (pytest.approx(100 * (math.exp(-(mean + half)) - 1)), pytest.approx(100 * (math.exp(-(mean - half)) - 1)))
    assert m.ci_pct == (pytest.approx(-100 * v.effect_ci[1]), pytest.approx(-100 * v.effect_ci[0]))


def test_an_effect_just_above_min_effect_is_not_supported_while_its_bound_is_below():
    ratios = (0.984, 0.979, 0.974)  # about 2.1 % better on average, but noisy
    v = verdict(sides(ratios))
    mean, _, half = hand(ratios)
    assert v.outcome == "inconclusive", v.reason
    assert v.effect > 0.02 and v.effect_ci[0] == pytest.approx(1 - math.exp(-(mean - half)), abs=1e-12)
    assert "still contains min_effect 2 %" in v.reason
    assert v.seeds_needed is not None and v.seeds_needed >= 2 and "paired seeds" in v.reason


def test_a_tight_effect_just_above_the_margin_is_supported():
    v = verdict(sides([0.979, 0.9788, 0.9792]))  # 2.1 % +- 0.02 %
    assert v.outcome == "supported", v.reason
    assert v.effect_ci[0] > 0.02


def test_a_flat_side_has_no_noise_estimate():
    v = verdict(sides([0.96, 0.958, 0.962], baseline=FLAT))
    assert v.outcome == "inconclusive" and "no noise estimate" in v.reason and "baseline" in v.reason


def test_one_seed_is_never_supported_even_with_a_large_effect():
    comparison = compare([run(1, 4.0)], [run(1, 5.0, experiment="base")], hyp(seeds=1))
    v = verdict(comparison)
    assert v.outcome == "inconclusive"
    assert "one seed" in v.reason
    assert v.effect == pytest.approx(0.2)
    assert comparison.primary.ci_low is None and comparison.primary.ci_pct is None
    assert v.seeds_needed is None  # one baseline value: no spread to size a study with


def test_one_seed_says_which_way_the_metric_itself_went():
    # The report's table shows -1.68 % for a loss that fell; the reason once said "moved +1.68 % in
    # the stated direction", which reads as a rise.
    fell = verdict(compare([run(1, 4.0)], [run(1, 5.0, experiment="base")], hyp(seeds=1)))
    assert "`eval/loss` fell 20 %, the stated direction (wanted: decrease" in fell.reason, fell.reason
    rose = verdict(compare([run(1, 5.5)], [run(1, 5.0, experiment="base")], hyp(seeds=1)))
    assert "`eval/loss` rose 10 %, the opposite way (wanted: decrease" in rose.reason, rose.reason


def test_one_paired_seed_but_baseline_spread_known_sizes_the_study_exactly():
    v = verdict(compare([run(1, 4.0)], BASE, hyp()))
    assert v.outcome == "inconclusive" and "one seed" in v.reason
    # independent seeds on both sides: sqrt(2) x the baseline's sd of log values, bounded above at 90 %
    sd = planning_sd(math.sqrt(2) * stdev(math.log(b) for b in BASE_VALUES), 3)
    n = seeds_needed(sd, 0.02, 0.05)
    assert v.seeds_needed == n and f"{n} paired seeds" in v.reason
    assert power(n, sd, 0.02, 0.05) >= 0.8 > power(n - 1, sd, 0.02, 0.05)


def test_refuted_by_a_significant_effect_the_other_way():
    v = verdict(sides([1.04, 1.042, 1.038]))  # about 4 % worse when a decrease was wanted
    assert v.outcome == "refuted", v.reason
    assert v.effect == pytest.approx(1 - math.exp(fmean(math.log(r) for r in (1.04, 1.042, 1.038))))
    assert "other way" in v.reason and v.effect_ci[1] < 0


def test_refuted_when_the_upper_bound_lies_below_min_effect():
    # Same 4 % improvement as the supported case, but 10 % was required: upper bound 4.34 % < 10 %.
    ratios = (0.96, 0.958, 0.962)
    v = verdict(sides(ratios, min_effect=0.10))
    mean, _, half = hand(ratios)
    assert v.outcome == "refuted", v.reason
    assert v.effect_ci[1] == pytest.approx(1 - math.exp(-(mean + half)), abs=1e-12)
    assert "significantly smaller than min_effect" in v.reason


def test_zero_spread_does_not_invent_significance():
    # Every seed exactly 1 % better (relative, up to float rounding): a t-test would divide by ~0.
    v = verdict(compare([run(s, b * 0.99) for s, b in ((1, 5.0), (2, 5.1), (3, 4.9))], BASE, hyp(min_effect=0.005)))
    assert v.outcome == "inconclusive", v.reason
    assert "no noise estimate" in v.reason and v.p_value is None
    # the A/A case: identical values give effect 0 with zero spread, not "significantly refuted, p = 1"
    aa = verdict(compare([run(s, b) for s, b in ((1, 5.0), (2, 5.1), (3, 4.9))], BASE, hyp()))
    assert aa.outcome == "inconclusive" and "A/A" in aa.reason


def test_seeds_hint_beyond_the_schema_maximum_says_so_plainly():
    v = verdict(sides([0.9, 1.0, 1.1]))  # sd 10 % of the metric for a 2 % margin
    assert v.outcome == "inconclusive"
    assert v.seeds_needed is None or v.seeds_needed > MAX_SEEDS
    assert f"more than the schema's maximum of {MAX_SEEDS}" in v.reason and "cannot decide" in v.reason


def test_diverged_candidate_is_refuted_with_the_step():
    cands = [run(1, 4.8), run(2, float("nan"), status="diverged", diverged_at_step=37), run(3, 4.8)]
    v = verdict(compare(cands, BASE, hyp()), candidates=cands, baselines=BASE)
    assert v.outcome == "refuted" and v.diverged_at_step == 37
    assert v.reason.startswith("Refuted: candidate diverged at step 37")


def test_increase_direction_is_supported_on_throughput():
    metric = "perf/tokens_per_s"
    base = [run(s, v, experiment="base", metric=metric) for s, v in ((1, 1000.0), (2, 1010.0), (3, 990.0))]
    cands = [run(s, v, metric=metric) for s, v in ((1, 1100.0), (2, 1121.1), (3, 1079.1))]  # +10, +11, +9 %
    v = verdict(compare(cands, base, hyp(metric=metric, direction="increase", min_effect=0.05)))
    assert v.outcome == "supported", v.reason
    assert v.effect == pytest.approx((1.10 * 1.11 * 1.09) ** (1 / 3) - 1)  # geometric mean of the ratios


def test_seeds_needed_is_the_smallest_n_with_exact_power():
    for sd in (0.005, 0.01, 0.02, 0.03):
        n = seeds_needed(sd, 0.02, 0.05)
        assert n is not None and n >= 2
        assert power(n, sd, 0.02, 0.05) >= 0.8
        assert n == 2 or power(n - 1, sd, 0.02, 0.05) < 0.8
    assert seeds_needed(0.0, 0.02, 0.05) == 2
    assert seeds_needed(10.0, 0.001, 0.05) is None  # beyond the search limit: "far more"
    # more noise, smaller alpha -> more seeds
    assert seeds_needed(0.02, 0.02, 0.01) > seeds_needed(0.02, 0.02, 0.05) > seeds_needed(0.01, 0.02, 0.05)


def test_pairing_by_seed_skips_unfinished_and_unpaired_runs():
    cands = [run(1, 4.8), run(2, 4.9), run(3, 4.7, status="failed"), run(4, 4.6)]
    bases = [run(1, 5.0, experiment="base"), run(2, 5.1, experiment="base"), run(3, 4.9, experiment="base"),
             run(5, 5.0, experiment="base")]
    pairs, lonely_c, lonely_b = pair_by_seed(cands, bases)
    assert [p.seed for p in pairs] == [1, 2]
    assert lonely_c == [4] and sorted(lonely_b) == [3, 5]
    comparison = compare(cands, bases, hyp())
    assert comparison.primary.n == 2
    assert comparison.baseline_values == (5.0, 5.1, 4.9, 5.0)


def test_no_shared_seed_is_inconclusive():
    v = verdict(compare([run(7, 4.0)], [run(8, 5.0, experiment="base")], hyp()))
    assert v.outcome == "inconclusive" and "share a seed" in v.reason


def test_all_metrics_are_compared_with_the_hypothesis_metric_first():
    cands = [run(s, 4.8 + s / 100, extra={"train/loss": 4.0, "perf/tokens_per_s": 900.0, "data/mix/code": 0.4}) for s in (1, 2)]
    bases = [run(s, 5.0, experiment="base", extra={"train/loss": 4.2, "perf/tokens_per_s": 1000.0}) for s in (1, 2)]
    comparison = compare(cands, bases, hyp(metric="eval/loss"))
    assert list(comparison.metrics)[0] == "eval/loss"
    assert set(comparison.metrics) == {"eval/loss", "train/loss", "perf/tokens_per_s"}
    assert comparison.metrics["perf/tokens_per_s"].delta_pct == pytest.approx(-10.0)


def test_no_baseline_runs_at_all_is_inconclusive_and_names_the_baseline():
    v = verdict(compare([run(1, 4.0), run(2, 4.1)], [], hyp(baseline="champion")))
    assert v.outcome == "inconclusive" and "no finished baseline run (`champion`)" in v.reason


def test_headline_names_the_outcome_once():
    # `pipeline run` printed "verdict      INCONCLUSIVE: Inconclusive: one seed. ..." (the reason
    # already opens with its outcome).
    from reports.identical import OUTCOME, reason
    from reports.verdict import headline

    cases = [
        verdict(compare([run(1, 4.0)], [run(1, 5.0, experiment="base")], hyp(seeds=1))),  # inconclusive
        verdict(sides([0.8, 0.82, 0.79])),  # supported
        verdict(sides([1.1, 1.12, 1.09])),  # refuted
    ]
    assert {v.outcome for v in cases} == {"inconclusive", "supported", "refuted"}
    for v in cases:
        line = headline(v.outcome, v.reason)
        assert line.startswith(f"{v.outcome.upper()}: "), line
        assert not line.lower().startswith(f"{v.outcome}: {v.outcome}"), line
        assert line == f"{v.outcome.upper()}: {v.reason.split(': ', 1)[1]}"
    assert headline("inconclusive", "Inconclusive: one seed.") == "INCONCLUSIVE: one seed."
    # A reason that opens with its outcome word in a sentence keeps the sentence.
    identical = headline(OUTCOME, reason("cand", "base"))
    assert identical.startswith("IDENTICAL to `base` (same code, spec and data)"), identical
    assert identical.lower().count("identical") == 1
    # A reason that does not name its outcome gets it in front.
    assert headline("refuted", "the effect went the other way.") == "REFUTED: the effect went the other way."


# --------------------------------------------------------------------------- properties

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

finite = st.floats(min_value=0.5, max_value=10.0, allow_nan=False)
shift = st.floats(min_value=-1.0, max_value=1.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(pairs=st.lists(st.tuples(finite, shift), min_size=1, max_size=6),
       direction=st.sampled_from(["increase", "decrease"]),
       min_effect=st.floats(min_value=0.001, max_value=0.5), alpha=st.sampled_from([0.01, 0.05, 0.1]))
def test_verdict_outcomes_always_match_their_definitions(pairs, direction, min_effect, alpha):
    cands = [run(i, b + d) for i, (b, d) in enumerate(pairs)]
    bases = [run(i, b, experiment="base") for i, (b, _) in enumerate(pairs)]
    v = verdict(compare(cands, bases, hyp(direction=direction, min_effect=min_effect, alpha=alpha)))
    assert v.reason.lower().startswith(v.outcome)
    if len(pairs) == 1:
        assert v.outcome == "inconclusive" and "one seed" in v.reason
    if v.outcome == "supported":
        assert v.effect_ci[0] > min_effect and v.p_value < alpha
    if v.outcome == "refuted":
        assert v.effect_ci[1] < min_effect
    if v.outcome != "inconclusive":
        assert v.rule and f"n = {len(pairs)}" in v.rule
    if v.seeds_needed is not None:
        assert v.seeds_needed >= 2
