"""Sweeps: trial expansion, selection seeds, winner selection (ties by cost), the cost,
successive halving, the trial table."""

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


# --------------------------------------------------------------------------- issue 20: sweeps that scale


def test_trials_train_on_selection_seeds_and_the_winner_on_fresh_hypothesis_seeds() -> None:
    from pipelines.sweep import SELECTION_SEED_OFFSET, selection_seeds, winner_experiment

    data = SPEC | {"hypothesis": SPEC["hypothesis"] | {"seeds": 3}}
    resolved = resolve_spec(ExperimentSpec.model_validate(data | {"sweep": {"parameters": {"train.lr": [1e-3, 3e-3]},
                                                                           "selection_seeds": 2}}), ".")
    trials = expand_trials(resolved)
    picked = set(selection_seeds(resolved.spec))
    first = resolved.spec.train.seed
    assert picked == {first + SELECTION_SEED_OFFSET, first + SELECTION_SEED_OFFSET + 1}
    assert all(set(t.resolved.seeds) == picked for t in trials)
    confirm = winner_experiment(resolved, trials[1])
    assert list(confirm.seeds) == [first, first + 1, first + 2] and not picked & set(confirm.seeds)  # never a selection seed
    assert confirm.spec.name == "lr-sweep" and confirm.spec.sweep is None and confirm.spec.train.lr == 3e-3


def test_cost_counts_trials_times_seeds_plus_the_winner_and_the_baseline() -> None:
    """The review's case: a 4-trial H100 sweep was planned (and tiered) as one trial."""
    from pipelines.sweep import sweep_cost, sweep_tier
    from validation.plan import make_plan

    gpu = {"resource": {"gpus_per_node": 8, "gpu_type": "h100", "gpu_memory_gb": 80.0, "max_gpu_hours": 8.0},
           "model": {"model_type": "llama", "hidden_size": 1024, "num_layers": 16, "num_heads": 16, "vocab_size": 32000},
           "train": {"max_steps": 2000, "micro_batch_size": 8}, "data": SPEC["data"] | {"seq_len": 1024}}
    data = SPEC | gpu | {"hypothesis": SPEC["hypothesis"] | {"seeds": 3}}
    sweep = {"parameters": {"train.lr": [1e-4, 3e-4, 1e-3, 3e-3]}, "max_trials": 4}
    resolved = resolve_spec(ExperimentSpec.model_validate(data | {"sweep": sweep}), ".")
    base = resolve_spec(ExperimentSpec.model_validate(data | {"name": "base"}), ".", seeds=list(resolved.seeds))
    trials = expand_trials(resolved)
    one = make_plan(trials[0].spec).compute.device_hours
    cost = sweep_cost(trials, resolved, base)
    assert cost.total_device_hours == pytest.approx(4 * one + 3 * one + 3 * one, rel=1e-6)
    assert cost.on_gpu and "4 trials x 1 selection seed(s)" in cost.describe()
    # One run plans as 0.34 GPU-hours, "small: 1 approval"; the sweep costs 10 of them: "large".
    # (The experiment's own plan now prices its 3 seeds too: 1.0 GPU-hours, "large".)
    from validation.plan import approval_tier

    assert approval_tier(make_plan(trials[0].spec).compute, resolved.spec.resource).name == "small"
    assert sweep_tier(cost, resolved).name == "large"


def test_successive_halving_prunes_the_worst_trials_at_a_rung() -> None:
    from pipelines.sweep import SuccessiveHalving

    pruner = SuccessiveHalving("min", reduction_factor=2, min_resource=10)
    finals = {}
    for index, loss in enumerate([2.0, 2.5, 3.0, 3.5]):  # trials run one after another here
        pruner.start(index)
        stopped = None
        for step in (10, 20, 40, 80):
            if pruner.report(index, step, loss + 1.0 / step):
                stopped = step
                break
        pruner.finish(index, None if stopped else loss, pruned=stopped is not None)
        finals[index] = stopped
    assert finals[0] is None and any(v is not None for v in finals.values()), finals
    assert not pruner.report(0, 10, 1.0)  # a finished trial reports nothing more


def test_trial_table_shows_pruning_compute_and_which_seeds_decided() -> None:
    spec = _spec({"parameters": {"train.lr": [0.001, 0.003, 0.01]}})
    a, b, c = expand_trials(spec)
    outcomes = [TrialOutcome(a, "finished", 2.0, steps_done=10), TrialOutcome(b, "pruned", None, pruned_at=4, steps_done=4),
                TrialOutcome(c, "finished", 2.2, steps_done=10)]
    table = render_trials_markdown(outcomes, outcomes[0], "eval/loss", "min", total_steps=10, selection=[10000],
                                   decided=[0, 1, 2])
    assert "3 trials, 1 pruned" in table and "pruned at step 4" in table
    assert "24 of 30 trial steps" in table and "80 %" in table
    assert "selection seed(s) [10000]" in table and "hypothesis seed(s) [0, 1, 2] only" in table
