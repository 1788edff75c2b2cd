"""compare() and verdict() on hand-computed cases (pure; no files, no servers).

The numbers in the comments were worked out by hand: for a t-statistic with 2 degrees
of freedom the two-sided p-value is 1 - |t| / sqrt(2 + t^2), and t_{0.975, 2} = 4.302653.
"""

from __future__ import annotations

import math

import pytest

from reports.compare import HypothesisView, compare, pair_by_seed
from reports.records import RunRecord
from reports.verdict import seeds_needed, verdict

pytestmark = pytest.mark.unit

T_975_DF2 = 4.302653


def run(seed: int | None, value: float, *, experiment: str = "cand", metric: str = "eval/loss", status: str = "finished",
        extra: dict[str, float] | None = None) -> RunRecord:
    return RunRecord(run_id=f"{experiment}-{seed}", experiment=experiment, seed=seed, status=status,
                     final_metrics={metric: value, **(extra or {})})


def hyp(**kw) -> HypothesisView:
    base = {"metric": "eval/loss", "direction": "decrease", "min_effect": 0.02, "alpha": 0.05, "seeds": 3,
            "statement": "Lower loss because of a better learning rate schedule."}
    return HypothesisView(**{**base, **kw})


BASE = [run(1, 5.0, experiment="base"), run(2, 5.1, experiment="base"), run(3, 4.9, experiment="base")]  # mean 5, sd 0.1


def sides(candidate_values, baseline=BASE, **kw):
    cands = [run(s, v) for s, v in zip((1, 2, 3), candidate_values, strict=False)]
    return compare(cands, baseline, hyp(**kw))


def test_three_seeds_supported_with_hand_computed_interval_and_p_value():
    # differences -0.2, -0.22, -0.18: mean -0.2, sd 0.02, t = -17.3205, p = 1 - 17.3205/sqrt(302) = 0.003317
    comparison = sides([4.8, 4.88, 4.72])
    m = comparison.primary
    assert m.n == 3 and m.candidate == pytest.approx(4.8) and m.baseline == pytest.approx(5.0)
    assert m.delta == pytest.approx(-0.2) and m.delta_pct == pytest.approx(-4.0)
    half = T_975_DF2 * 0.02 / math.sqrt(3)  # 0.049683
    assert (m.ci_low, m.ci_high) == (pytest.approx(-0.2 - half, abs=1e-6), pytest.approx(-0.2 + half, abs=1e-6))
    assert m.ci_pct == (pytest.approx(-4.99366, abs=1e-4), pytest.approx(-3.00634, abs=1e-4))

    v = verdict(comparison)
    assert v.outcome == "supported", v.reason
    assert v.effect == pytest.approx(0.04)
    assert v.p_value == pytest.approx(0.003317, abs=2e-6)
    assert v.effect_ci == (pytest.approx(0.030063, abs=1e-5), pytest.approx(0.049937, abs=1e-5))
    assert v.reason.startswith("Supported") and "3 seeds" in v.reason


def test_one_seed_is_never_supported_even_with_a_large_effect():
    comparison = compare([run(1, 4.0)], [run(1, 5.0, experiment="base")], hyp(seeds=1))
    v = verdict(comparison)
    assert v.outcome == "inconclusive"
    assert "one seed" in v.reason
    assert v.effect == pytest.approx(0.2)
    assert comparison.primary.ci_low is None and comparison.primary.ci_pct is None
    assert v.seeds_needed is None  # one baseline value: no spread to size a study with


def test_one_paired_seed_but_baseline_spread_known_says_how_many_seeds():
    comparison = compare([run(1, 4.0)], BASE, hyp())
    v = verdict(comparison)
    assert v.outcome == "inconclusive" and "one seed" in v.reason
    assert v.seeds_needed == 16 and "16 paired seeds" in v.reason


def test_refuted_by_a_significant_effect_the_other_way():
    v = verdict(sides([5.2, 5.32, 5.08]))  # differences +0.2, +0.22, +0.18 when a decrease was wanted
    assert v.outcome == "refuted", v.reason
    assert v.effect == pytest.approx(-0.04)
    assert "other way" in v.reason


def test_refuted_when_the_interval_lies_below_min_effect():
    # Same 4 % improvement as the supported case, but 10 % was required: upper bound 4.99 % < 10 %.
    v = verdict(sides([4.8, 4.88, 4.72], min_effect=0.10))
    assert v.outcome == "refuted", v.reason
    assert v.effect_ci[1] == pytest.approx(0.049937, abs=1e-5)
    assert "significantly smaller than min_effect" in v.reason


def test_too_noisy_is_inconclusive_and_says_why():
    # differences -0.3, +0.1, -0.25: mean -0.15, sd 0.217945, t = -1.19208, p = 1 - 1.19208/sqrt(3.42105) = 0.35550
    v = verdict(sides([4.7, 5.2, 4.65]))
    assert v.outcome == "inconclusive"
    assert "too noisy" in v.reason
    assert v.p_value == pytest.approx(0.35550, abs=1e-4)
    half = T_975_DF2 * 0.217945 / math.sqrt(3) / 5.0
    assert v.effect_ci == (pytest.approx(0.03 - half, abs=1e-5), pytest.approx(0.03 + half, abs=1e-5))
    assert v.seeds_needed == 16 and "16 paired seeds" in v.reason


def test_increase_direction_is_supported_on_throughput():
    metric = "perf/tokens_per_s"
    base = [run(s, v, experiment="base", metric=metric) for s, v in ((1, 1000.0), (2, 1010.0), (3, 990.0))]
    cands = [run(s, v, metric=metric) for s, v in ((1, 1100.0), (2, 1112.0), (3, 1088.0))]
    v = verdict(compare(cands, base, hyp(metric=metric, direction="increase", min_effect=0.05)))
    assert v.outcome == "supported", v.reason
    assert v.effect == pytest.approx(0.10)


def test_seeds_needed_formula_by_hand():
    # sigma_d = sqrt(2) * 0.1; delta = 0.02 * 5 = 0.1; (1.959964 + 0.841621)^2 * 2 = 15.6978 -> 16
    assert seeds_needed(0.1, 5.0, 0.02, 0.05) == 16
    # alpha 0.01: (2.575829 + 0.841621)^2 * 2 = 23.3555 -> 24
    assert seeds_needed(0.1, 5.0, 0.02, 0.01) == 24
    # a tiny spread still needs two seeds for a paired test at all
    assert seeds_needed(1e-6, 5.0, 0.02, 0.05) == 2
    assert seeds_needed(0.0, 5.0, 0.02, 0.05) == 2


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


def test_identical_differences_are_significant_without_nan():
    v = verdict(sides([4.8, 4.9, 4.7]))  # every difference exactly -0.2 (up to float rounding)
    assert v.outcome == "supported", v.reason
    assert v.p_value is not None and v.p_value < 0.05


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
        assert v.effect >= min_effect and v.p_value < alpha
    if v.outcome == "refuted":
        assert (v.p_value < alpha and v.effect < 0) or v.effect_ci[1] < min_effect
    if v.seeds_needed is not None:
        assert v.seeds_needed >= 2
