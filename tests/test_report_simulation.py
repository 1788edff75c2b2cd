"""The verdict rule and the seeds hint checked by simulation (vectorised numpy, fixed seed).

- False positives: with a true effect at most min_effect, P(supported) <= alpha + 3
  Monte-Carlo sigmas, for 2, 3 and 5 seeds and two noise levels. The metric is simulated
  per seed like a loss (shared seed noise, per-side noise, relative differences computed
  as `compare` does) and decided by `reports.verdict.decide`, the rule `verdict` uses.
- Seeds hint: at the n `seeds_needed` hints (exact noncentral t), simulated power at the
  planning effect (2 x min_effect) is >= 0.8 - 3 sigma; beyond the schema's maximum the
  verdict says so.
`bench/bench_verdict.py` prints the same figures next to the previous rule's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from reports.compare import HypothesisView, compare
from reports.records import RunRecord
from reports.verdict import MAX_SEEDS, PLANNING_FACTOR, SUPPORTED, decide, power, seeds_needed, verdict

pytestmark = pytest.mark.unit

TRIALS = 20_000
ALPHA = 0.05
MIN_EFFECT = 0.02
NOISE = (0.005, 0.02)
"""Per-side relative seed noise (sd as a fraction of the metric): the review's 0.5 %, and 2 %."""


def simulate_metric(rng: np.random.Generator, n: int, effect: float, noise: float, trials: int = TRIALS) -> np.ndarray:
    """Relative differences, in the stated direction (decrease), of `trials` studies of n seeds."""
    mean = 3.5  # a loss
    shared = 0.01 * rng.standard_normal((trials, n))  # what the seed does to both sides alike
    base = mean * (1 + shared + noise * rng.standard_normal((trials, n)))
    cand = mean * (1 - effect) * (1 + shared + noise * rng.standard_normal((trials, n)))
    return -(cand - base) / np.abs(base)


def mc_bound(p: float, trials: int = TRIALS) -> float:
    return 3 * math.sqrt(p * (1 - p) / trials)


@pytest.mark.parametrize("noise", NOISE)
@pytest.mark.parametrize("n", [2, 3, 5])
def test_false_positive_rate_at_most_alpha_when_the_effect_is_at_most_min_effect(n, noise):
    rng = np.random.default_rng(20261201 + 10 * n + int(noise * 1000))
    for factor in (1.0, 0.9, 0.0):
        supported = (decide(simulate_metric(rng, n, factor * MIN_EFFECT, noise), MIN_EFFECT, ALPHA) == SUPPORTED).mean()
        assert supported <= ALPHA + mc_bound(ALPHA), (n, noise, factor, supported)
    power_2x = (decide(simulate_metric(rng, n, 2 * MIN_EFFECT, noise), MIN_EFFECT, ALPHA) == SUPPORTED).mean()
    print(f"n={n} noise={noise:.1%}: power at 2x min_effect {power_2x:.3f}")
    assert power_2x > ALPHA  # the test has some power above the margin


@pytest.mark.parametrize("sd", [0.005, 0.01, 0.02])
def test_hinted_seeds_reach_80_percent_power_at_the_planning_effect(sd):
    n = seeds_needed(sd, MIN_EFFECT, ALPHA)
    assert n is not None and 2 <= n <= 64
    rng = np.random.default_rng(7 + int(sd * 1e4))
    planning = PLANNING_FACTOR * MIN_EFFECT
    r = planning + sd * rng.standard_normal((TRIALS, n))
    simulated = (decide(r, MIN_EFFECT, ALPHA) == SUPPORTED).mean()
    assert simulated >= 0.8 - mc_bound(0.8), (sd, n, simulated)
    assert simulated == pytest.approx(power(n, sd, MIN_EFFECT, ALPHA), abs=mc_bound(0.8))  # nct is exact
    if n > 2:  # and one seed fewer would not do
        fewer = (decide(r[:, : n - 1], MIN_EFFECT, ALPHA) == SUPPORTED).mean()
        assert fewer < 0.8 + mc_bound(0.8)


def test_decide_is_the_rule_verdict_applies():
    rng = np.random.default_rng(3)
    h = HypothesisView(metric="eval/loss", direction="decrease", min_effect=MIN_EFFECT, alpha=ALPHA, seeds=3)
    for n in (2, 3, 5):
        for _ in range(40):
            base = 3.5 * (1 + 0.01 * rng.standard_normal(n))
            cand = base * (1 - MIN_EFFECT * rng.uniform(0, 3)) * (1 + 0.01 * rng.standard_normal(n))
            cands = [RunRecord(f"c{i}", "c", i, "finished", {"eval/loss": float(c)}) for i, c in enumerate(cand)]
            bases = [RunRecord(f"b{i}", "b", i, "finished", {"eval/loss": float(b)}) for i, b in enumerate(base)]
            v = verdict(compare(cands, bases, h))
            code = int(decide(-(cand - base) / base, MIN_EFFECT, ALPHA))
            assert {1: "supported", -1: "refuted", 0: "inconclusive"}[code] == v.outcome, v.reason


def test_a_hint_beyond_the_schema_maximum_is_said_plainly():
    sd = 0.05  # 5 % seed noise for a 2 % margin
    needed = seeds_needed(sd, MIN_EFFECT, ALPHA)
    assert needed is not None and needed > MAX_SEEDS
    base = [RunRecord(f"b{i}", "b", i, "finished", {"eval/loss": 3.5}) for i in range(3)]
    cand = [RunRecord(f"c{i}", "c", i, "finished", {"eval/loss": 3.5 * (1 - d)}) for i, d in enumerate((-0.03, 0.02, 0.07))]
    v = verdict(compare(cand, base, HypothesisView("eval/loss", "decrease", MIN_EFFECT, ALPHA, seeds=3)))
    assert v.outcome == "inconclusive"
    assert v.seeds_needed == needed and f"{needed} paired seeds would be needed: more than the schema's maximum of 16" in v.reason
