"""Parallel layouts without a launch: a model left unsharded under a sharded layout fails
loudly, the topology (no pipeline parallelism; rows per TP group), the fault plan's null
object, and an automatic layout never plans tensor parallelism the trainer cannot run."""

from __future__ import annotations

import pytest


def test_an_unsharded_model_under_a_sharded_layout_fails_loudly() -> None:
    """The silent fallback (accelerate running DDP when asked for FSDP) must stop the run."""
    import torch

    from basics.errors import TrainingError
    from trainer.parallel import ParallelDims, assert_sharded

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    with pytest.raises(TrainingError, match="not sharded: this rank holds 8320 of 8320"):
        assert_sharded(model, ParallelDims(world=2, rank=0, dp=2, tp=1, fsdp=True))
    assert assert_sharded(model, ParallelDims(world=2, rank=0, dp=2, tp=1, fsdp=False)) == (8320, 8320)  # DDP


def test_topology_places_pipeline_stages_and_reads_rows_per_tp_group() -> None:
    from basics.errors import TrainingError
    from trainer.parallel import ParallelDims
    from validation.spec import ParallelLayout

    with pytest.raises(TrainingError, match="pp=2 x tp=2 does not divide the 6 processes"):
        ParallelDims.from_layout(ParallelLayout(dp=1, tp=2, pp=2), 6, 0)
    three = ParallelDims.from_layout(ParallelLayout(dp=2, tp=2, pp=2), 8, 5)  # rank = (stage x dp + dp index) x tp + tp
    assert (three.pp_rank, three.dp_rank, three.tp_rank, three.fsdp) == (1, 0, 1, True)
    staged = ParallelDims.from_layout(ParallelLayout(dp=2, pp=2), 4, 1)  # rank = stage x dp + dp index
    assert (staged.dp, staged.pp, staged.dp_rank, staged.pp_rank, staged.sharded) == (2, 2, 1, 0, True)
    last = ParallelDims.from_layout(ParallelLayout(dp=2, pp=2, fsdp=True), 4, 2)  # stages outermost: across nodes
    assert (last.dp_rank, last.pp_rank, last.fsdp, last.shard) == (0, 1, True, 2)
    topo = ParallelDims.from_layout(ParallelLayout(dp=2, tp=2), 4, 3)
    assert (topo.dp, topo.dp_rank, topo.tp_rank, topo.fsdp, topo.sharded) == (2, 1, 1, True, True)
    assert not ParallelDims.from_layout(ParallelLayout(dp=1, fsdp=True), 1, 0).sharded  # one process: plain


def test_fault_plan_is_a_null_object_unless_asked() -> None:
    from trainer.faults import FaultPlan, InjectedFaults

    plain = FaultPlan.from_env(0, {})
    assert type(plain) is FaultPlan and not plain.oom_now(3) and not plain.nan_now(3)
    plan = FaultPlan.from_env(1, {"TRAINER_INJECT_OOM_AT_STEP": "3", "TRAINER_INJECT_OOM_RANK": "1"})
    assert isinstance(plan, InjectedFaults)
    assert [plan.oom_now(s) for s in (2, 3, 3)] == [False, True, False]  # once per process


def test_auto_layout_never_plans_tensor_parallelism_the_trainer_cannot_run() -> None:
    """gpt2 has no tensor-parallel plan: a model too big for one GPU gets FSDP, not TP; llama may get TP."""
    from validation.plan import plan_parallel
    from validation.spec import ExperimentSpec

    def spec(model_type: str) -> ExperimentSpec:
        return ExperimentSpec.model_validate({
            "name": "big-model", "owner": "ml-platform",
            "hypothesis": {"statement": "A much larger model lowers the held-out loss on the mixture.",
                           "metric": "eval/loss", "direction": "decrease", "min_effect": 0.01, "baseline": "champion"},
            "model": {"model_type": model_type, "hidden_size": 4096, "num_layers": 32, "num_heads": 32,
                      "vocab_size": 32000},
            "data": {"sources": [{"name": "code", "path": "data/demo/code.jsonl", "weight": 1.0}], "seq_len": 1024},
            "train": {"max_steps": 10, "micro_batch_size": 1},
            "resource": {"gpus_per_node": 8, "gpu_type": "h100", "gpu_memory_gb": 80},
        })

    from validation.capability import TRAINER
    from validation.plan.layout import _candidates

    tps = {m: {tp for _, tp, _, _ in _candidates(spec(m), 1, TRAINER)} for m in ("gpt2", "llama")}
    assert tps["gpt2"] == {1} and max(tps["llama"]) > 1  # the search space itself
    for model_type in ("gpt2", "llama"):
        plan = plan_parallel(spec(model_type))
        assert plan.fsdp or plan.tp > 1, model_type  # ~7B: 16 B/param does not fit 80 GB replicated
