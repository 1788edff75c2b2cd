"""Sweeps: trial expansion, winner selection (ties by cost), the trial table."""

from __future__ import annotations

import pytest

from pipelines.sweep import (
    Trial,
    TrialOutcome,
    expand_trials,
    render_trials_markdown,
    select_winner,
    selection,
)
from validation.resolved import ResolvedExperiment, resolve_spec
from validation.spec import ExperimentSpec

pytestmark = pytest.mark.unit

SPEC = {
    "name": "lr-sweep",
    "owner": "octocat",
    "hypothesis": {"statement": "A tuned learning rate lowers held-out loss versus the base run.",
                   "metric": "eval/loss", "direction": "decrease", "min_effect": 0.01, "baseline": "base"},
    "model": {"model_type": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "vocab_size": 512},
    "data": {"sources": [{"name": "code", "path": "data/demo/code.jsonl", "weight": 1.0}], "seq_len": 32},
    "train": {"max_steps": 10},
}


def _spec(sweep: dict) -> ResolvedExperiment:
    return resolve_spec(ExperimentSpec.model_validate(SPEC | {"sweep": sweep}), ".")


def test_grid_expands_every_combination_as_valid_specs() -> None:
    spec = _spec({"parameters": {"train.lr": [0.001, 0.003], "model.num_layers": [2, 4]}, "max_trials": 4})
    trials = expand_trials(spec)
    assert [t.name for t in trials] == ["lr-sweep-t1", "lr-sweep-t2", "lr-sweep-t3", "lr-sweep-t4"]
    assert {(t.spec.train.lr, t.spec.model.num_layers) for t in trials} == {(0.001, 2), (0.001, 4), (0.003, 2), (0.003, 4)}
    assert all(t.spec.sweep is None for t in trials)
    # Each trial is its own work: distinct spec hashes, so distinct run identities.
    assert len({t.spec.spec_hash() for t in trials}) == 4


def test_random_sampling_is_bounded_and_seeded() -> None:
    sweep = {"method": "random", "parameters": {"train.lr": [0.001, 0.002, 0.003, 0.004, 0.005]}, "max_trials": 2, "seed": 7}
    a = [t.spec.train.lr for t in expand_trials(_spec(sweep))]
    b = [t.spec.train.lr for t in expand_trials(_spec(sweep))]
    assert a == b and len(a) == 2 and len(set(a)) == 2


def test_winner_by_metric_then_cost_and_failures_stay_visible() -> None:
    spec = _spec({"parameters": {"model.num_layers": [2, 4], "train.lr": [0.001]}, "max_trials": 2})
    small, big = expand_trials(spec)
    assert small.cost < big.cost
    metric, mode = selection(spec.spec)
    assert (metric, mode) == ("eval/loss", "min")
    tie = [TrialOutcome(big, "finished", 2.0), TrialOutcome(small, "finished", 2.0)]
    assert select_winner(tie, mode).trial is small  # equal metric: the cheaper trial wins
    better = [TrialOutcome(small, "finished", 2.5), TrialOutcome(big, "finished", 2.0)]
    assert select_winner(better, mode).trial is big
    assert select_winner(better, "max").trial is small
    assert select_winner([TrialOutcome(small, "failed", None, "crash")], mode) is None

    outcomes = [TrialOutcome(small, "stopped", None, "early_stopping"), TrialOutcome(big, "finished", 2.0)]
    table = render_trials_markdown(outcomes, outcomes[1], metric, mode)
    assert "stopped: early_stopping" in table and "lr-sweep-t2 **winner**" in table
    assert isinstance(small, Trial)
