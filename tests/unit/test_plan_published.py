"""The planner at the sizes it exists for (issue 29): published configurations (fields written
here, from the models' config.json), torchtitan's recipes, mixed precision as the trainer runs
it, optimizer state per parameter role, and every seed priced."""

from __future__ import annotations

from typing import Any

import pytest

from validation.plan import (
    GIB,
    estimate_memory,
    make_plan,
    render_plan_markdown,
    render_plan_text,
    state_bytes,
)
from validation.resolved import resolve_spec
from validation.spec import ExperimentSpec, ParallelLayout

LLAMA3_8B = {"model_type": "llama", "hidden_size": 4096, "num_layers": 32, "num_heads": 32, "num_kv_heads": 8,
             "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
             "tie_word_embeddings": False}
LLAMA3_70B = {"model_type": "llama", "hidden_size": 8192, "num_layers": 80, "num_heads": 64, "num_kv_heads": 8,
              "intermediate_size": 28672, "vocab_size": 128256, "max_position_embeddings": 8192,
              "tie_word_embeddings": False}
GPT2_XL = {"model_type": "gpt2", "hidden_size": 1600, "num_layers": 48, "num_heads": 25, "vocab_size": 50257,
           "max_position_embeddings": 1024}
H100 = {"gpus_per_node": 8, "gpu_type": "h100", "gpu_memory_gb": 80, "max_gpu_hours": 100000}


def spec(model: dict[str, Any], *, seq: int = 8192, train: dict[str, Any] | None = None,
         resource: dict[str, Any] | None = None, parallel: Any = "auto", name: str = "published-case",
         hypothesis: dict[str, Any] | None = None) -> ExperimentSpec:
    return ExperimentSpec.model_validate({
        "name": name, "owner": "alice",
        "hypothesis": {"statement": "Doubling the width lowers the held-out loss on code by two percent.",
                       "metric": "eval/loss", "direction": "decrease", "min_effect": 0.02, "baseline": "champion",
                       **(hypothesis or {})},
        "model": model,
        "data": {"sources": [{"name": "code", "path": "data/demo/code.jsonl", "weight": 1.0}], "seq_len": seq},
        "train": {"max_steps": 100, "micro_batch_size": 1, "precision": "bf16", **(train or {})},
        "resource": {**H100, **(resource or {})},
        "parallel": parallel,
    })


def test_torchtitan_llama3_8b_recipe_is_planned_with_checkpointing():
    """FSDP over 8 x 80 GB, seq 8192, local batch 1, bf16: refused whatever the checkpointing
    (88.2 GiB, 62.1 GiB of activations, on main); planned with selective or full."""
    totals = {}
    for mode in ("none", "selective", "full"):
        s = spec(LLAMA3_8B, train={"activation_checkpointing": mode}, parallel={"dp": 8, "fsdp": True})
        assert s.model.parameter_count() == 8_030_261_248
        m = estimate_memory(s, s.parallel_layout())
        totals[mode] = m.total_bytes
        assert m.checkpointed_layers == {"none": 0, "selective": 16, "full": 32}[mode]
    assert totals["none"] > 80 * GIB > totals["selective"] > totals["full"]
    # full: 32 block inputs (bf16 under FSDP's cast) and the tensors saved outside the blocks at the
    # loss; one block recomputed later, in the blocks' backward (at FSDP2's bf16 element bytes).
    full = estimate_memory(spec(LLAMA3_8B, train={"activation_checkpointing": "full"}), ParallelLayout(dp=8, fsdp=True))
    per_layer = int(full_spec_model().activation_bytes_per_layer(8192, 1, 2.25))
    assert full.activations_bytes == 32 * 8192 * 4096 * 2 + 12 * 8192 * 4096
    assert full.recompute_bytes == per_layer + 8192 * 4096 * 2
    plan = make_plan(spec(LLAMA3_8B, train={"activation_checkpointing": "selective"}, parallel={"dp": 8, "fsdp": True}))
    assert plan.memory.fits and plan.parallel.activation_checkpointing == "selective"


def full_spec_model() -> Any:
    return spec(LLAMA3_8B).model


def test_auto_keeps_the_global_batch_and_prefers_fsdp_with_checkpointing():
    """On main `parallel: auto` gave dp 4 x tp 2 and halved the global batch (8 -> 4 rows)."""
    s = spec(LLAMA3_8B)
    plan = make_plan(s)
    p = plan.parallel
    assert (p.dp, p.tp, p.pp, p.fsdp, p.activation_checkpointing) == (8, 1, 1, True, "selective")
    assert (p.global_batch, plan.compute.global_batch, plan.compute.tokens) == (8, 8, 100 * 8 * 8192)
    assert plan.to_dict()["parallel"]["global_batch"] == 8


def test_llama3_70b_on_64_h100_is_fsdp8_tp8_and_the_runs_train_that():
    s = spec(LLAMA3_70B, resource={"nodes": 8})
    assert s.model.parameter_count() == 70_553_706_496
    plan = make_plan(s)
    p = plan.parallel
    assert (p.dp, p.tp, p.pp, p.fsdp) == (8, 8, 1, True)
    # 64 rows per step whatever the layout: 8 replicas x 8 accumulated micro-batches of 1.
    assert (p.micro_batch_size, p.grad_accum_steps, p.global_batch) == (1, 8, 64)
    assert any(r.startswith("dp=64 tp=1 pp=1 fsdp") for r in p.rejected)  # FSDP alone (hybrid over nodes)
    resolved = resolve_spec(s, ".")
    run = resolved.runs[0].spec
    assert (run.train.micro_batch_size, run.train.grad_accum_steps) == (1, 8)
    assert run.train.activation_checkpointing == p.activation_checkpointing
    assert run.global_batch(run.parallel_layout().dp) == 64
    assert resolved.compute.tokens == 100 * 64 * 8192


def test_ddp_in_bf16_counts_what_autocast_keeps():
    """fp32 weights and gradients, fp32 DDP buckets (main counted 2 B/param: >= 2.9 GiB missing
    for GPT-2 XL), and autocast's bf16 copy of each matmul weight."""
    s = spec(GPT2_XL, seq=1024, parallel={"dp": 8})
    n = s.model.parameter_count()
    assert n == 1_557_611_200
    m = estimate_memory(s, s.parallel_layout())
    assert (m.weights_bytes, m.gradients_bytes, m.wrapper_bytes) == (4 * n, 4 * n, 4 * n)
    assert m.wrapper_bytes - 2 * n >= 2.9 * GIB
    assert m.autocast_copy_bytes == 2 * (s.model.matmul_parameters())  # tied: the head once
    cats = m.by_category()
    assert list(cats) == ["parameters", "gradients", "optimizer_state", "activations", "logits_temporaries",
                          "overhead"]
    # The buckets live all along: at the loss's peak they are the only gradients (none accumulated),
    # in the optimizer step they sit beside the fp32 gradients.
    assert m.peak_phase == "loss" and cats["gradients"] == 4 * n and sum(cats.values()) == m.total_bytes
    assert m.phases()["optimizer"]["gradients"] == 8 * n
    # FSDP2: bf16 unsharded group + bf16 gradients + their fp32 reduce-scatter input.
    f = estimate_memory(s, ParallelLayout(dp=8, fsdp=True))
    layer = s.model.block_parameters() // 48
    largest = max(layer, 50257 * 1600)
    assert (f.wrapper_parameter_bytes, f.wrapper_gradient_bytes) == (largest * 2 + layer * 2, largest * 6)
    assert f.autocast_copy_bytes == 0


def test_optimizer_state_follows_the_models_role_map():
    """An MoE's hidden matrices include the experts a token skips (main used the active count:
    Muon's state 30 % high for a 4-expert top-2 model)."""
    moe = {"model_type": "moe", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 256,
           "num_experts": 4, "top_k": 2, "intermediate_size": 96}
    s = spec(moe, seq=128, train={"optimizer": {"name": "muon"}}, resource={"gpus_per_node": 1})
    model = s.model
    roles = model.parameters_by_role()
    total = model.parameter_count()
    assert model.active_parameter_count() < total and sum(roles.values()) == total
    assert roles["hidden"] > model.matmul_parameters() - 256 * 64  # more than the active matrices
    assert state_bytes(s).optimizer == pytest.approx((roles["hidden"] * 4 + (total - roles["hidden"]) * 8) / total,
                                                     abs=1e-3)
    # The contract's default role map counts the same hidden matrices as the MoE file's own.
    from models import Architecture

    assert Architecture.parameters_by_role(model)["hidden"] == roles["hidden"]


def test_every_seed_and_the_baselines_are_priced_and_tiered():
    """On main a 3-seed 8 x H100 run was priced (and tiered) as one seed."""
    kw: dict[str, Any] = {"seq": 4096, "train": {"max_steps": 200}, "resource": {"max_gpu_hours": 8}}
    base = spec(LLAMA3_8B, name="llama-base", **kw)
    s = spec(LLAMA3_8B, hypothesis={"seeds": 3, "baseline": "llama-base"}, **kw)
    one = make_plan(s).compute.device_hours
    alone = make_plan(s)
    assert alone.cost is not None and alone.cost.total_device_hours == pytest.approx(3 * one)
    assert "llama-base: not priced" in alone.cost.baseline_note
    plan = make_plan(s, baseline=base)
    assert plan.cost is not None and plan.cost.total_device_hours == pytest.approx(6 * one)
    assert one <= 1 and plan.tier.name == "large" and f"{6 * one:.1f} GPU-hours" in plan.tier.reason
    data = plan.to_dict()
    assert data["cost"]["seeds"] == 3 and data["cost"]["baseline_runs"] == 3
    text = render_plan_text(plan)
    assert "3 seed(s) x" in text and "baseline 3 x" in text


def test_total_and_active_parameters_and_the_n_of_6nt_are_shown():
    moe = {"model_type": "moe", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 256,
           "num_experts": 4, "top_k": 2, "intermediate_size": 96}
    s = spec(moe, seq=128, resource={"gpus_per_node": 1})
    plan = make_plan(s)
    total, active = s.model.parameter_count(), s.model.active_parameter_count()
    assert (plan.parameters, plan.active_parameters, plan.to_dict()["active_parameters"]) == (total, active, active)
    assert plan.compute.model_flops == 6 * s.model.matmul_parameters() * plan.compute.tokens
    for text in (render_plan_text(plan), render_plan_markdown(plan)):
        assert f"({total:,})" in text and "active per token" in text
        assert "active matmul parameters" in text and "of active FLOPs" in text


def test_a_cpu_run_is_timed_at_the_measured_cpu_utilisation():
    s = spec({"model_type": "llama", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 256},
             seq=128, train={"precision": "fp32"}, resource={"gpus_per_node": 0, "gpu_memory_gb": 16})
    c = make_plan(s).compute
    assert c.assumed_mfu == 0.037 and "measured" in c.mfu_source
    explicit = spec({"model_type": "llama", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 256},
                    seq=128, train={"precision": "fp32"},
                    resource={"gpus_per_node": 0, "gpu_memory_gb": 16, "assumed_mfu": 0.2})
    assert make_plan(explicit).compute.assumed_mfu == 0.2
