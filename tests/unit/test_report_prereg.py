"""Preregistration bound to the claim, not the name (issue 20, item 1).

The claim is the trained configuration without its seed plus the baseline
(`reports.prereg.claim_key`). One confirmatory registration per claim, on its own seeds;
everything else (seeds added later, a rename, a rerun on another base seed, a pilot) is an
exploratory look. Simulated (vectorised; which seeds decide comes from the real
`split_by_registration` on records shaped as the orchestrator writes them): under
"rename and add seeds", "add seeds until supported" and "best of k reruns",
P(headline supported | effect = min_effect) <= alpha, where the name-keyed registration
reached 0.17-0.23.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from reports import prereg
from reports.compare import HypothesisView
from reports.records import RunRecord
from reports.report import make_report
from reports.verdict import SUPPORTED, decide_values

ALPHA, MIN_EFFECT, NOISE = 0.05, 0.02, 0.005
TRIALS = 20_000
H = HypothesisView(metric="eval/loss", direction="decrease", min_effect=MIN_EFFECT, alpha=ALPHA, seeds=3,
                   baseline="base", statement="A better schedule lowers the held-out loss by two percent.")
CLAIM = "c1a1m"


def entry(seeds, *, at=100.0, experiment="first", kind="confirmatory"):
    return {"claim": CLAIM, "experiment": experiment, "kind": kind, "seed_list": list(seeds),
            "hypothesis": H.registered_fields(), "registered_at_s": at, "registered_at": f"t{at}"}


def record(seed, value, registration, *, results_existed=False, experiment="first"):
    return RunRecord(f"{experiment}-{seed}", experiment, seed, "finished", {"eval/loss": value},
                     registrations={prereg.CLAIM_PREFIX + CLAIM: {**registration, "results_existed": results_existed}})


def decided_seeds(records) -> set:
    _, decided, _ = prereg.split_by_registration(records, CLAIM)
    return {r.seed for r in decided}


# --------------------------------------------------------------------------- the registry


def test_one_confirmatory_registration_per_claim_first_wins(tmp_path):
    first = prereg.register_confirmatory(tmp_path, entry([0, 1, 2]))
    again = prereg.register_confirmatory(tmp_path, entry([0, 1, 2, 3, 4, 5, 6, 7], at=200.0, experiment="renamed"))
    assert again == first and again["seed_list"] == [0, 1, 2] and again["experiment"] == "first"


def test_a_claim_does_not_depend_on_the_name_or_the_base_seed_but_on_the_configuration_and_baseline():
    from tests.infra.report_runs import SPEC
    from validation.spec import ExperimentSpec

    def spec(**edit):
        data = json.loads(json.dumps(SPEC))
        for path, value in edit.items():
            section, key = path.split("__")
            data.setdefault(section, {})[key] = value
        return ExperimentSpec.model_validate(data)

    base = prereg.claim_key(spec())
    assert prereg.claim_key(spec(train__seed=100)) == base  # a rerun on other seeds
    renamed = spec()
    assert prereg.claim_key(renamed.model_copy(update={"name": "higher-lr-v2"})) == base
    assert prereg.claim_key(spec(train__lr=1e-3)) != base  # another configuration
    other = spec()
    other_h = other.hypothesis.model_copy(update={"baseline": "other-base"})
    assert prereg.claim_key(other.model_copy(update={"hypothesis": other_h})) != base


def test_the_confirmatory_run_after_a_pilot_gets_fresh_seeds(tmp_path):
    for s in (0, 1, 2):
        prereg.mark_seen(tmp_path, CLAIM, s)
    assert prereg.fresh_seeds(0, 3, prereg.seen_seeds(tmp_path, CLAIM)) == [3, 4, 5]
    assert prereg.fresh_seeds(10, 2, {11}) == [10, 12]


# --------------------------------------------------------------------------- the report


def test_rename_and_add_seeds_decides_on_the_registered_seeds_only():
    """The review's case: an inconclusive 3-seed run, then the same spec under a new name with
    8 seeds. The old name-keyed registration decided the renamed one on all 8 seeds."""
    registration = entry([0, 1, 2])
    base = [RunRecord(f"b{s}", "base", s, "finished", {"eval/loss": 3.5 + 0.01 * (s % 3)}) for s in range(8)]
    values = [3.5 * 0.985, 3.51 * 0.96, 3.52 * 0.99] + [b.final_metrics["eval/loss"] * 0.96 for b in base[3:]]
    cands = [record(s, v, registration, experiment="first" if s < 3 else "renamed") for s, v in enumerate(values)]
    report = make_report(cands, base, {**H.__dict__, "seeds": 8}, experiment="renamed")
    assert report.decided_seeds == (0, 1, 2) and report.verdict.n_pairs == 3
    assert report.added_seeds == (3, 4, 5, 6, 7) and report.exploratory is not None
    assert report.verdict.outcome == "inconclusive"
    assert report.hypothesis_changes == ("seeds 3 -> 8",)


def test_a_rerun_on_other_seeds_has_no_headline_and_says_why():
    registration = entry([0, 1, 2])
    base = [RunRecord(f"b{s}", "base", s, "finished", {"eval/loss": 3.5 + 0.01 * s}) for s in (100, 101, 102)]
    cands = [record(s, 3.3 + 0.01 * s, registration, experiment="rerun") for s in (100, 101, 102)]
    report = make_report(cands, base, H, experiment="rerun")
    assert report.verdict.outcome == "inconclusive" and "registered seeds [0, 1, 2]" in report.verdict.reason
    assert report.decided_seeds == ()


def test_a_pilot_decides_nothing_and_points_to_a_confirmatory_run_on_fresh_seeds():
    pilot = entry([0, 1, 2], kind="pilot")
    base = [RunRecord(f"b{s}", "base", s, "finished", {"eval/loss": 3.5 + 0.01 * s}) for s in (0, 1, 2)]
    cands = [record(s, (3.5 + 0.01 * s) * r, pilot) for s, r in zip((0, 1, 2), (0.9, 0.905, 0.895), strict=True)]
    report = make_report(cands, base, H, experiment="first")
    assert report.verdict.outcome == "inconclusive" and "pilot decides nothing" in report.verdict.reason
    assert "fresh seeds" in report.verdict.reason and report.exploratory is not None
    assert report.exploratory.outcome == "supported"  # shown apart, decides nothing


def test_runs_reused_by_a_later_registration_are_exploratory_for_it():
    later = entry([0, 1, 2], at=500.0, experiment="late")
    cands = [record(s, 3.0, later, results_existed=True, experiment="early") for s in (0, 1, 2)]
    assert decided_seeds(cands) == set()


# --------------------------------------------------------------------------- strategies, simulated


def simulate(rng, trials, n):
    """(candidate, baseline) with the true effect exactly min_effect (a decrease)."""
    shared = 0.01 * rng.standard_normal((trials, n))
    base = 3.5 * (1 + shared + NOISE * rng.standard_normal((trials, n)))
    cand = 3.5 * (1 - MIN_EFFECT) * (1 + shared + NOISE * rng.standard_normal((trials, n)))
    return cand, base


def supported(cand, base, columns) -> np.ndarray:
    idx = sorted(columns)
    if not idx:
        return np.zeros(cand.shape[0], dtype=bool)
    return decide_values(cand[:, idx], base[:, idx], "decrease", MIN_EFFECT, ALPHA) == SUPPORTED


def bound(p=ALPHA, trials=TRIALS):
    return ALPHA + 3 * math.sqrt(p * (1 - p) / trials)


def test_strategy_rename_and_add_seeds():
    rng = np.random.default_rng(1)
    cand, base = simulate(rng, TRIALS, 8)
    registration = entry([0, 1, 2])
    pilot_runs = [record(s, 0.0, registration) for s in (0, 1, 2)]
    renamed_runs = pilot_runs + [record(s, 0.0, registration, experiment="renamed") for s in range(3, 8)]
    first = supported(cand, base, decided_seeds(pilot_runs))
    second = supported(cand, base, decided_seeds(renamed_runs))
    headline = (first | second).mean()
    by_name = (first | supported(cand, base, range(8))).mean()  # the renamed run decided on all 8 seeds
    print(f"rename and add seeds 3 -> 8: P(headline supported) {headline:.4f} (by name: {by_name:.4f})")
    assert headline <= bound() < by_name


def test_strategy_add_seeds_until_supported():
    rng = np.random.default_rng(2)
    cand, base = simulate(rng, TRIALS, 16)
    registration = entry([0, 1, 2])
    ever, ever_by_name = np.zeros(TRIALS, dtype=bool), np.zeros(TRIALS, dtype=bool)
    for n in range(3, 17):  # add one seed at a time, stop at the first "supported"
        runs = [record(s, 0.0, registration) for s in range(n)]
        ever |= supported(cand, base, decided_seeds(runs))
        ever_by_name |= supported(cand, base, range(n))
    print(f"add seeds until supported 3 -> 16: P(headline supported) {ever.mean():.4f} "
          f"(all seeds each look: {ever_by_name.mean():.4f})")
    assert ever.mean() <= bound() < ever_by_name.mean()


@pytest.mark.parametrize("k", [3, 5])
def test_strategy_best_of_k_reruns(k):
    rng = np.random.default_rng(10 + k)
    cand, base = simulate(rng, TRIALS, 3 * k)  # rerun j trains seeds 3j .. 3j + 2 (another base seed)
    registration = entry([0, 1, 2])
    best, best_by_name = np.zeros(TRIALS, dtype=bool), np.zeros(TRIALS, dtype=bool)
    for j in range(k):
        runs = [record(3 * j + i, 0.0, registration, experiment=f"rerun-{j}") for i in range(3)]
        best |= supported(cand, base, decided_seeds(runs))
        best_by_name |= supported(cand, base, range(3 * j, 3 * j + 3))
    print(f"best of {k} reruns: P(headline supported) {best.mean():.4f} (each its own registration: "
          f"{best_by_name.mean():.4f})")
    assert best.mean() <= bound() < best_by_name.mean()
