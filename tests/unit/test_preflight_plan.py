"""Preflight: parallel plan, memory and compute estimates, approval tiers, rendering.

Expected figures are computed by hand in each test from the published formulas
(ZeRO's 16 bytes/parameter, Korthikanti et al. 2022's activations, 6*N*T plus PaLM's
attention term), written out with literal numbers so a change to the module cannot
silently move both sides.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from basics.errors import SpecError
from validation import plan as preflight
from validation.capability import EVERY_LAYOUT, ExecutionCapability
from validation.plan import (
    FRAMEWORK_OVERHEAD_BYTES_CPU,
    FRAMEWORK_OVERHEAD_BYTES_GPU,
    GIB,
    LARGE_TIER_APPROVALS,
    SMALL_TIER_APPROVALS,
    SMALL_TIER_MAX_GPU_HOURS,
    STATE_BYTES,
    approval_tier,
    estimate_compute,
    estimate_memory,
    render_plan_markdown,
    render_plan_text,
)
from validation.plan.compute import CPU_RUN_UTILISATION, CPU_UTILISATION_SOURCE
from validation.spec import ExperimentSpec, ParallelLayout


# The planner is studied over its whole search space (FSDP, TP, PP); what the trainer runs
# today (`validation.capability.TRAINER`) is tested on its own at the end of the section.
def plan_parallel(spec: ExperimentSpec, **kwargs: Any) -> preflight.ParallelPlan:
    return preflight.plan_parallel(spec, **{"capability": EVERY_LAYOUT, **kwargs})


def make_plan(spec: ExperimentSpec, **kwargs: Any) -> preflight.Plan:
    return preflight.make_plan(spec, **{"capability": EVERY_LAYOUT, **kwargs})

TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 256}
LLAMA_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_layers": 32,
    "num_heads": 32,
    "intermediate_size": 11008,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
LLAMA3_70B = {
    "model_type": "llama",
    "hidden_size": 8192,
    "num_layers": 80,
    "num_heads": 64,
    "num_kv_heads": 8,
    "intermediate_size": 28672,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}
H100_NODE = {"gpus_per_node": 8, "gpu_type": "h100", "gpu_memory_gb": 80, "max_gpu_hours": 1000}


def make_spec(
    model: dict[str, Any],
    *,
    data: dict[str, Any] | None = None,
    train: dict[str, Any] | None = None,
    resource: dict[str, Any] | None = None,
    parallel: Any = "auto",
) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {
            "name": "preflight-case",
            "owner": "alice",
            "hypothesis": {
                "statement": "Doubling the width lowers the held-out loss on code by two percent.",
                "metric": "eval/loss",
                "direction": "decrease",
                "min_effect": 0.02,
                "baseline": "base-line",
            },
            "model": model,
            "data": {
                "sources": [{"name": "code", "path": "data/demo/code.jsonl", "weight": 1.0}],
                **(data or {}),
            },
            "train": {"max_steps": 100, **(train or {})},
            "resource": resource or {},
            "parallel": parallel,
        }
    )


def tiny_cpu_spec(**train: Any) -> ExperimentSpec:
    return make_spec(
        TINY_LLAMA,
        data={"seq_len": 128},
        train={"micro_batch_size": 8, "grad_accum_steps": 2, "precision": "fp32", **train},
        resource={"cpu_processes": 2, "gpu_memory_gb": 16},
    )


# --------------------------------------------------------------------------- memory


def test_state_bytes_are_sixteen_per_parameter_for_every_precision():
    # As the trainer keeps them: fp32 weights (their own master copy) + fp32 gradients + m, v in
    # every precision (autocast and FSDP2's MixedPrecisionPolicy both keep fp32 parameters). The
    # old bf16 row (2 + 2 + 12) was the defect: DDP's fp32 gradient buckets counted at 2 B/param.
    assert dataclasses.astuple(STATE_BYTES["bf16"]) == (4, 4, 8, "adamw")
    assert STATE_BYTES["fp16"] == STATE_BYTES["bf16"]
    assert dataclasses.astuple(STATE_BYTES["fp32"]) == (4, 4, 8, "adamw")
    assert {name: sb.total for name, sb in STATE_BYTES.items()} == {"bf16": 16, "fp16": 16, "fp32": 16}


def test_tiny_cpu_memory_by_hand():
    spec = tiny_cpu_spec()
    memory = estimate_memory(spec, ParallelLayout(dp=2))
    params = 123_200  # 256*64 embed + 2 * (4*64*64 attn + 3*64*192 mlp + 2*64 norms) + 64 final norm
    assert memory.parameters_per_device == params
    assert memory.sharding_degree == 1
    assert (memory.weights_bytes, memory.gradients_bytes, memory.optimizer_bytes) == (
        params * 4,
        params * 4,
        params * 8,
    )
    # The architecture's saved tensors per token (models/_llama_family.py, measured in
    # bench/bench_architectures.py): 4h + 4q + 2kv + 4ffn + 2 head_dim + heads elements, fp32,
    # 2 layers, one micro-batch in flight (pp=1).
    per_token = 4 * 64 + 4 * 64 + 2 * 64 + 4 * 192 + 2 * 16 + 4
    # Plus what is saved outside the blocks: 12 bytes per token x hidden (measured by the dry run),
    # and the fp32 document mask a CPU process builds once per forward for every block's attention
    # (micro batch x seq^2 x 4 B; models/_attention.py: no block keeps its own).
    activations = 2 * per_token * 128 * 8 * 4 + 12 * 128 * 8 * 64 + 8 * 128 * 128 * 4
    assert memory.activations_bytes == activations == 13_139_968
    assert memory.logits_bytes == 128 * 8 * 256 * 8  # the loss's fp32 gradients: seq x micro x vocab x 8 bytes
    assert memory.logits_saved_bytes == 128 * 8 * 256 * 4  # its saved fp32 log-softmax
    assert memory.overhead_bytes == FRAMEWORK_OVERHEAD_BYTES_CPU == GIB // 2
    # DDP (dp=2): its gradient buckets are one more fp32 gradient per parameter.
    assert memory.wrapper_bytes == params * 4
    # The peak is at the loss's backward (`peak_phase`): weights, the gradients accumulated over the
    # first micro-batch and DDP's buckets, the states (4 + 4 + 4 + 8 B/param), every activation, the
    # logits' saved log-softmax and gradients. (553,261,312 before: the log-softmax was missing and
    # the non-block activations were not counted.)
    assert memory.peak_phase == "loss"
    total = 123_200 * 20 + 13_139_968 + 1_048_576 + 2_097_152 + 536_870_912
    assert memory.total_bytes == total == 555_620_608
    assert memory.capacity_bytes == 16 * GIB
    assert memory.fits
    assert memory.headroom_pct == pytest.approx(100 * (16 * GIB - total) / (16 * GIB))


def test_the_plan_and_the_dry_run_count_one_copy_of_the_framework_overhead():
    import trainer.dry_run as dry_run  # torch-free at import: torch loads inside dry_run()
    from validation.plan import memory as model

    # Per GPU: the CUDA context (512 MiB), NCCL's buffers (512 MiB) and the kernels' workspaces
    # (256 MiB) are the plan's 1.25 GiB; per CPU process 512 MiB.
    assert FRAMEWORK_OVERHEAD_BYTES_GPU == 512 * 2**20 + 512 * 2**20 + 256 * 2**20 == GIB + GIB // 4
    assert FRAMEWORK_OVERHEAD_BYTES_CPU == model.CPU_PROCESS_BYTES == GIB // 2
    # The dry run adds the same constants for what its tracker cannot see, and splits its peak
    # into the plan's categories: the very objects, not a restatement.
    for name in ("CUDA_CONTEXT_BYTES", "NCCL_BUFFER_BYTES", "KERNEL_WORKSPACE_BYTES", "CPU_PROCESS_BYTES",
                 "ALLOCATOR_FRAGMENTATION", "CATEGORIES"):
        assert getattr(dry_run, name) is getattr(model, name), name
    assert set(dry_run.CATEGORY_OF.values()) < set(model.CATEGORIES)


def test_eager_attention_stores_the_score_matrices():
    spec = make_spec(
        {**TINY_LLAMA, "attn_implementation": "eager"},
        data={"seq_len": 128},
        train={"micro_batch_size": 8, "precision": "bf16"},
    )
    memory = estimate_memory(spec, ParallelLayout(dp=1))
    # eager keeps every score of its 2 blocks: heads x seq_len per token, at 6 bytes (the fp32
    # softmax and its bf16 copy, whatever the fitted bytes per element), and no log-sum-exp (one
    # element per head fewer).
    sdpa = make_spec(TINY_LLAMA, data={"seq_len": 128}, train={"micro_batch_size": 8, "precision": "bf16"})
    without = estimate_memory(sdpa, ParallelLayout(dp=1)).activations_bytes
    bf16 = preflight.ACTIVATION_ELEMENT_BYTES["bf16"]  # autocast: a mix of 16- and 32-bit tensors
    assert memory.activations_bytes - without == pytest.approx(2 * (4 * 128 * 6 - 4 * bf16) * 128 * 8, abs=2)


def test_seven_b_on_eight_h100_needs_fsdp():
    spec = make_spec(
        LLAMA_7B,
        data={"seq_len": 4096},
        train={"micro_batch_size": 1, "grad_accum_steps": 4, "precision": "bf16"},
        resource=H100_NODE,
    )
    assert spec.model.parameter_count() == 6_738_415_616  # the published LLaMA-7B count

    plan = plan_parallel(spec)
    assert (plan.dp, plan.tp, plan.pp, plan.fsdp) == (8, 1, 1, True)
    assert plan.rejected and plan.rejected[0].startswith("dp=8 tp=1 pp=1:")

    replicated = estimate_memory(spec, ParallelLayout(dp=8))
    assert replicated.total_bytes > 80 * GIB  # 16 B x 6.74 B params alone is 100 GiB
    m = plan.memory
    shard = 6_738_415_616 // 8  # = 842,301,952 exactly
    assert m.parameters_per_device == shard
    assert (m.weights_bytes, m.gradients_bytes, m.optimizer_bytes) == (shard * 4, shard * 4, shard * 8)
    # FSDP2 casts the parameters: the blocks' saved tensors are counted at its bf16 element bytes.
    per_layer = int(spec.model.activation_bytes_per_layer(4096, 1, preflight.ACTIVATION_ELEMENT_BYTES_FSDP_CAST["bf16"]))
    assert m.activations_bytes == 32 * per_layer + 12 * 4096 * 4096
    assert m.logits_bytes == 4096 * 1 * 32000 * 8
    # FSDP's working set: the largest group (a decoder layer, 202M params) unsharded in bf16 with
    # its bf16 gradients and their fp32 reduce-scatter copy (2 + 2 + 4 bytes; the fp32 copy was
    # missing before), plus the next layer's bf16 weights prefetched.
    layer = spec.model.block_parameters() // 32  # (6,738,415,616 - 2 x 32000 x 4096 - 4096 final norm) / 32
    assert m.wrapper_bytes == layer * 8 + layer * 2
    # The peak is at the last micro-batch's last block's backward: the earlier micro-batches'
    # gradients as this rank's fp32 shard (FSDP reduce-scatters every micro-batch; under no_sync
    # they were unsharded, 4 B x 6.74 B params, and not counted), that block gathered with the next
    # prefetched and its gradients reducing (the wrapper, 2 GiB), every other activation still
    # saved; the logits' gradients (1 GiB at this vocabulary) are gone by then. (The old total
    # added the gradients and the whole working set to it: 7-28 % above the dry run.)
    assert m.peak_phase == "last_block" and m.accumulated_gradient_bytes == shard * 4
    loss = m.phases()["loss"]
    assert sum(loss.values()) == shard * 16 + 32000 * 4096 * 2 + m.activations_bytes + 4096 * 32000 * 12 \
        + m.overhead_bytes
    peak = shard * 16 + m.wrapper_bytes + m.activations_bytes
    assert m.total_bytes == peak + m.overhead_bytes
    assert m.overhead_bytes == FRAMEWORK_OVERHEAD_BYTES_GPU + int(0.05 * peak)
    assert m.fits and 40 < m.headroom_pct < 65


def test_seventy_b_on_four_nodes_gets_a_node_wide_tensor_parallel_degree():
    spec = make_spec(
        LLAMA3_70B,
        data={"seq_len": 4096},
        train={"micro_batch_size": 1, "grad_accum_steps": 4, "precision": "bf16"},
        resource={**H100_NODE, "nodes": 2},
    )
    assert spec.model.parameter_count() == 70_553_706_496  # Llama-3-70B
    # Two nodes: the trainer's tensor parallelism has no sequence parallelism (10 of Korthikanti's
    # 34 bytes per s*b*h stay replicated) and leaves the 2.1B embedding parameters unsplit, so no
    # layout of 16 GPUs holds it, even with full checkpointing (pipeline stages accumulating 32
    # micro-batches to keep the global batch: 81.9 GiB).
    with pytest.raises(SpecError, match=r"resource.nodes >= 3 \(24 GPUs\)"):
        plan_parallel(spec)

    four = make_spec(
        LLAMA3_70B,
        data={"seq_len": 4096},
        train={"micro_batch_size": 1, "grad_accum_steps": 4, "precision": "bf16"},
        resource={**H100_NODE, "nodes": 4},
    )
    plan = plan_parallel(four)
    # FSDP alone over 4 nodes runs hybrid (sharded inside a node: 16 B x 70.6B / 8 does not fit,
    # with any checkpointing); tp spans the node, FSDP crosses nodes; checkpointing before pp.
    assert (plan.dp, plan.tp, plan.pp, plan.fsdp) == (4, 8, 1, True)
    # Selective checkpointing does not fit (83.3 GiB): at the last of 32 micro-batches this rank
    # also holds its fp32 shard of the gradients reduce-scattered so far (8.2 GiB); full does.
    assert plan.activation_checkpointing == "full"
    assert plan.rejected[3] == "dp=32 tp=1 pp=1 fsdp + full checkpointing: 154.8 GiB"
    assert plan.rejected[5] == ("dp=4 tp=8 pp=1 fsdp + selective checkpointing (micro batch 1 x 32 accumulated): "
                                "83.3 GiB")
    # The global batch (1 x 4 x 32 rows) is kept: 4 replicas accumulate 32 micro-batches of 1.
    assert (plan.micro_batch_size, plan.grad_accum_steps, plan.global_batch) == (1, 32, 128)
    # Every one of the 80 checkpointed blocks keeps only its bf16 input, plus the tensors saved
    # outside the blocks.
    assert plan.memory.activations_bytes == 80 * 4096 * 8192 * 2 + 12 * 4096 * 8192
    assert plan.layout() == ParallelLayout(dp=4, tp=8, pp=1, fsdp=True)


def test_checkpointing_comes_before_pipeline_stages():
    # One KV head (multi-query attention): tp must divide it; FSDP with selective checkpointing
    # fits before pipeline stages are tried.
    model = {**LLAMA_7B, "num_kv_heads": 1, "max_position_embeddings": 16384}
    spec = make_spec(model, data={"seq_len": 16384}, resource=H100_NODE,
                     train={"micro_batch_size": 1, "grad_accum_steps": 1, "precision": "bf16"})
    plan = plan_parallel(spec)
    assert (plan.dp, plan.tp, plan.pp, plan.fsdp, plan.activation_checkpointing) == (8, 1, 1, True, "selective")
    # (225.3 and 121.0 GiB when every category was summed whatever the phase; 222.3 and 115.5 GiB
    # while the plan counted k and v repeated to every head, which document attention no longer saves.)
    assert plan.rejected == ("dp=8 tp=1 pp=1: 211.3 GiB", "dp=8 tp=1 pp=1 fsdp: 106.0 GiB")
    per_layer = int(spec.model.activation_bytes_per_layer(16384, 1, preflight.ACTIVATION_ELEMENT_BYTES_FSDP_CAST["bf16"]))
    # Blocks 2, 4, ..., 32 keep their bf16 input; the other 16 everything; the tensors saved
    # outside the blocks. The block recomputed in the backward pass is not alive at the loss's peak.
    assert plan.memory.activations_bytes == 16 * per_layer + 16 * 16384 * 4096 * 2 + 12 * 16384 * 4096
    assert plan.memory.recompute_bytes == per_layer + 16384 * 4096 * 2


# --------------------------------------------------------------------------- errors


def test_nothing_fits_says_what_to_change_at_the_located_field():
    spec = make_spec(
        LLAMA3_70B,
        data={"seq_len": 4096},
        train={"micro_batch_size": 1, "grad_accum_steps": 4, "precision": "bf16"},
        resource=H100_NODE,
    )
    seen: list[str] = []

    def locate(field_path: str) -> tuple[str, int, int]:
        seen.append(field_path)
        return ("experiments/big.yaml", 31, 3)

    with pytest.raises(SpecError) as info:
        plan_parallel(spec, locate=locate)
    (issue,) = info.value.issues
    assert (issue.file, issue.line, issue.col, issue.field) == (
        "experiments/big.yaml",
        31,
        3,
        "resource.gpu_memory_gb",
    )
    assert seen == ["resource.gpu_memory_gb"]
    assert "no parallel layout fits 8 x 80 GiB" in issue.message
    # The executor's TP (no sequence parallelism, embeddings not split) needs 3 nodes to keep the
    # global batch (test_seventy_b_on_four_nodes_gets_a_node_wide_tensor_parallel_degree); a
    # suggestion keeps the spec's micro batch and accumulation, and 2 nodes of pipeline stages
    # hold that (3 when every category was summed whatever the phase).
    assert "resource.nodes >= 2 (16 GPUs)" in issue.message
    assert str(info.value).startswith("experiments/big.yaml:31:3: resource.gpu_memory_gb: ")
    assert info.value.exit_code == 2


def test_default_location_is_the_spec_placeholder():
    spec = make_spec(LLAMA_7B, resource={"cpu_processes": 1, "gpu_memory_gb": 16})
    with pytest.raises(SpecError) as info:
        plan_parallel(spec)
    (issue,) = info.value.issues
    assert (issue.file, issue.line) == ("<spec>", 1)
    assert "a CPU process cannot hold it" in issue.message


def test_suggests_the_largest_micro_batch_that_fits():
    spec = make_spec(
        TINY_LLAMA,
        data={"seq_len": 4096},
        train={"micro_batch_size": 64, "precision": "fp32"},
        resource={"gpu_memory_gb": 1},
    )
    # With full checkpointing (the search adds it) the peak is in the blocks' backward: per row one
    # block recomputed and its fp32 input, and the fp32 document mask a CPU process shares between
    # its blocks (seq^2 x 4 B: models/_attention.py); 0.5 GiB overhead; the states (123,200 x 16
    # bytes) too.
    per_row = spec.model.activation_bytes_per_layer(4096, 1, 4) + 4096 * 64 * 4 + 4096 * 4096 * 4
    largest = int((GIB - GIB // 2 - 123_200 * 16) // per_row)
    assert largest == 5
    with pytest.raises(SpecError) as info:
        plan_parallel(spec)
    assert f"train.micro_batch_size <= {largest} " in info.value.issues[0].message
    smaller = make_spec(
        TINY_LLAMA,
        data={"seq_len": 4096},
        train={"micro_batch_size": largest, "precision": "fp32"},
        resource={"gpu_memory_gb": 1},
    )
    assert plan_parallel(smaller).memory.fits


def test_explicit_layout_reports_every_divisibility_problem_at_once():
    spec = make_spec(
        TINY_LLAMA, resource={"gpus_per_node": 8, "gpu_type": "a100"}, parallel={"dp": 1, "tp": 3, "pp": 3}
    )
    with pytest.raises(SpecError) as info:
        plan_parallel(spec)
    found = [(i.field, i.message) for i in info.value.issues]
    # The same checks, in the same words, as `pipeline validate` (validation.rules).
    assert [f for f, _ in found] == ["parallel.tp", "parallel.tp", "parallel.pp", "parallel.dp"]
    assert "tp=3 must divide model.num_heads (4)" in found[0][1]
    assert "tp=3 must divide resource.gpus_per_node (8)" in found[1][1]
    assert "pp=3 must divide model.num_layers (2)" in found[2][1]
    assert "dp*tp*pp = 1*3*3 = 9 must equal the world size" in found[3][1]


def test_explicit_tensor_parallel_on_cpu_is_refused():
    spec = make_spec(TINY_LLAMA, resource={"cpu_processes": 2}, parallel={"dp": 1, "tp": 2})
    with pytest.raises(SpecError) as info:
        plan_parallel(spec)
    (issue,) = info.value.issues
    assert issue.field == "parallel.tp" and "not executable on CPU processes" in issue.message


def test_the_capability_limits_the_search_and_the_explicit_layouts():
    # A trainer that runs data parallelism only: auto never picks FSDP/TP/PP for it...
    dp_only = ExecutionCapability(gpu=frozenset({"dp"}), cpu=frozenset({"dp"}))
    spec = make_spec(LLAMA_7B, resource={"gpus_per_node": 8, "gpu_type": "h100", "gpu_memory_gb": 80})
    assert plan_parallel(spec).fsdp  # the planner alone would shard (see the 7B test above)
    with pytest.raises(SpecError) as info:
        preflight.plan_parallel(spec, capability=dp_only)
    assert "no parallel layout fits" in info.value.issues[0].message
    # ...and an explicit layout outside what the trainer runs (`TRAINER`, the default) is
    # refused at its field, saying what to change.
    explicit = make_spec(TINY_LLAMA, resource={"gpus_per_node": 4, "gpu_type": "a100"},
                         parallel={"dp": 1, "tp": 2, "pp": 2}, train={"grad_accum_steps": 2})
    assert preflight.plan_parallel(explicit).pp == 2  # the trainer runs pp x tp now
    with pytest.raises(SpecError) as info:
        preflight.plan_parallel(explicit, capability=dp_only, locate=lambda f: ("experiments/x.yaml", 30, 3))
    issues = info.value.issues
    assert [(i.file, i.line, i.field) for i in issues] == [("experiments/x.yaml", 30, "parallel.tp"),
                                                          ("experiments/x.yaml", 30, "parallel.pp")]
    assert "not executable" in issues[0].message and "set tp: 1" in issues[0].message


def test_tp_divisibility_agrees_with_validate():
    # Regression: preflight and the rules once disagreed on gpt2's kv heads; both now ask the
    # architecture (`tp_problem`), and gpt2 (fused qkv) declares no tensor-parallel plan.
    gpt2 = {"model_type": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 8, "vocab_size": 256}
    spec = make_spec(gpt2, resource={"gpus_per_node": 4, "gpu_type": "a100"}, parallel={"dp": 1, "tp": 4})
    with pytest.raises(SpecError) as info:
        plan_parallel(spec)
    assert [i.field for i in info.value.issues] == ["parallel.tp"]
    assert "declares no tensor-parallel plan" in info.value.issues[0].message
    llama = make_spec({**gpt2, "model_type": "llama", "num_kv_heads": 2}, resource={"gpus_per_node": 4, "gpu_type": "a100"},
                      parallel={"dp": 1, "tp": 4})
    with pytest.raises(SpecError) as info:
        plan_parallel(llama)
    assert [i.message for i in info.value.issues] == ["tp=4 must divide model.num_kv_heads (2)"]


def test_explicit_layout_is_verified_and_estimated():
    spec = make_spec(
        TINY_LLAMA, resource={"gpus_per_node": 8, "gpu_type": "a100"}, parallel={"dp": 2, "tp": 2, "pp": 2}
    )
    plan = plan_parallel(spec)
    assert plan.chosen_by == "explicit"
    assert (plan.dp, plan.tp, plan.pp, plan.fsdp, plan.world_size) == (2, 2, 2, False, 8)
    # tp > 1 over two replicas is sharded over them too (trainer.parallel.ParallelDims: FSDP on dp
    # whenever tp > 1), so 2 x 2 x 2 = 8; counting 4 was the defect.
    assert plan.memory.sharding_degree == 8
    # tp splits the decoder layers only (as trainer/parallel.py does); the tied embedding and the
    # final norm are whole.
    embedding = 256 * 64 + 64
    assert plan.memory.parameters_per_device == ((123_200 - embedding) // 2 + embedding) // 4


def test_explicit_layout_that_does_not_fit_names_one_that_does():
    spec = make_spec(
        LLAMA_7B,
        data={"seq_len": 4096},
        train={"micro_batch_size": 1, "precision": "bf16"},
        resource=H100_NODE,
        parallel={"dp": 8},
    )
    with pytest.raises(SpecError) as info:
        plan_parallel(spec)
    (issue,) = info.value.issues
    assert issue.field == "resource.gpu_memory_gb"
    assert "layout dp=8 tp=1 pp=1 needs" in issue.message
    assert "dp=8 tp=1 pp=1 fsdp fits" in issue.message


def test_auto_honours_the_requested_global_batch():
    # 8 GPUs and a global batch of 16 rows: dp=8 keeps it with a micro batch of 2 (the layout
    # absorbs dp by the micro batch; it used to pick dp=4 x tp=2 to keep micro 4).
    spec = make_spec(
        TINY_LLAMA,
        train={"micro_batch_size": 4, "global_batch_size": 16},
        resource={"gpus_per_node": 8, "gpu_type": "a100"},
    )
    plan = plan_parallel(spec)
    assert (plan.dp, plan.micro_batch_size, plan.grad_accum_steps, plan.global_batch) == (8, 2, 1, 16)
    assert plan.train_overrides()["train.micro_batch_size"] == 2


# --------------------------------------------------------------------------- divisibility (property)

DIVISIBLE_HEADS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 64]


@st.composite
def auto_specs(draw: st.DrawFn) -> ExperimentSpec:
    heads = draw(st.sampled_from(DIVISIBLE_HEADS))
    kv = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]))
    head_dim = draw(st.sampled_from([16, 64, 128]))
    model_type = draw(st.sampled_from(["llama", "qwen2", "gpt2"]))
    model = {
        "model_type": model_type,
        "hidden_size": heads * head_dim,
        "num_layers": draw(st.integers(1, 96)),
        "num_heads": heads,
        **({} if model_type == "gpt2" else {"num_kv_heads": kv}),
        "vocab_size": draw(st.sampled_from([256, 32000, 128256])),
        "max_position_embeddings": 8192,
    }
    gpus = draw(st.sampled_from([0, 1, 2, 4, 6, 8]))
    resource = {
        "nodes": draw(st.integers(1, 4)),
        "gpus_per_node": gpus,
        "cpu_processes": draw(st.integers(1, 4)),
        "gpu_type": "h100" if gpus else "cpu",
        "gpu_memory_gb": draw(st.sampled_from([1, 8, 24, 80])),
    }
    train = {
        "micro_batch_size": draw(st.integers(1, 8)),
        "grad_accum_steps": draw(st.integers(1, 8)),
        "precision": draw(st.sampled_from(["bf16", "fp32"])),
    }
    return make_spec(
        model, data={"seq_len": draw(st.sampled_from([128, 1024, 4096]))}, train=train, resource=resource
    )


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(auto_specs())
def test_auto_plans_always_honour_divisibility(spec: ExperimentSpec):
    try:
        plan = plan_parallel(spec)
    except SpecError as error:
        assert error.issues[0].field == "resource.gpu_memory_gb"
        assert "no parallel layout fits" in error.issues[0].message
        return
    model, resource = spec.model, spec.resource
    kv = model.kv_heads
    assert plan.tp == 1 or model.tensor_parallel_plan()  # gpt2 declares no TP plan
    assert plan.dp * plan.tp * plan.pp == resource.world_size == plan.world_size
    assert model.num_heads % plan.tp == 0 and kv % plan.tp == 0
    assert model.num_layers % plan.pp == 0
    assert plan.memory.fits
    if resource.gpus_per_node:
        assert resource.gpus_per_node % plan.tp == 0
    else:
        assert (plan.tp, plan.pp, plan.fsdp) == (1, 1, False)
    if plan.tp > 1 or plan.pp > 1 or plan.fsdp:
        # Never more machinery than needed: plain DP was tried first and did not fit.
        assert not estimate_memory(spec, ParallelLayout(dp=resource.world_size)).fits


# --------------------------------------------------------------------------- compute


def test_tiny_cpu_compute_by_hand():
    spec = tiny_cpu_spec()
    compute = estimate_compute(spec, ParallelLayout(dp=2))
    tokens = 100 * (8 * 2 * 2) * 128  # steps x (micro x accum x dp) x seq_len
    assert (compute.steps, compute.global_batch, compute.tokens) == (100, 32, tokens)
    matmul = 123_200 - (2 * 2 * 64 + 64)  # norm weights are not matmuls (models/_llama_family.py)
    assert compute.model_flops == 6 * matmul * tokens
    assert compute.attention_flops == 12 * 2 * 64 * 128 * tokens
    # A CPU process is estimated at one thread's peak (validation.flops: 0.16 TFLOPS per thread).
    assert (compute.peak_tflops_per_device, compute.peak_source) == (0.16, "cpu:per-thread")
    # At the measured whole-run CPU utilisation, not the GPU default of 0.35 (which planned
    # experiments/base.yaml at 55 s where it took 8.5 min).
    assert (compute.assumed_mfu, compute.mfu_source) == (CPU_RUN_UTILISATION, CPU_UTILISATION_SOURCE)
    expected_wall = (6 * matmul + 12 * 2 * 64 * 128) * tokens / (2 * 0.16e12 * 0.037)
    assert compute.wall_seconds == pytest.approx(expected_wall)
    assert compute.gpu_hours == 0.0 and compute.device_hours == pytest.approx(expected_wall * 2 / 3600)
    assert compute.fits_time_limit


def test_token_budget_becomes_steps_with_the_global_batch():
    spec = tiny_cpu_spec(max_steps=None, token_budget=1_000_000)
    compute = estimate_compute(spec, ParallelLayout(dp=2))
    assert compute.steps == math.ceil(1_000_000 / (32 * 128)) == 245
    assert compute.tokens == 245 * 32 * 128


def test_peak_comes_from_the_table_or_the_spec():
    gpu = {"gpus_per_node": 1, "gpu_memory_gb": 80}
    bf16 = make_spec(TINY_LLAMA, train={"precision": "bf16"}, resource={**gpu, "gpu_type": "a100"})
    assert estimate_compute(bf16, ParallelLayout()).peak_tflops_per_device == 312.0
    fp32 = make_spec(TINY_LLAMA, train={"precision": "fp32"}, resource={**gpu, "gpu_type": "h100"})
    assert estimate_compute(fp32, ParallelLayout()).peak_tflops_per_device == 989.0 / 2
    given_peak = make_spec(TINY_LLAMA, resource={**gpu, "gpu_type": "mi250", "peak_tflops": 191.5})
    compute = estimate_compute(given_peak, ParallelLayout())
    assert (compute.peak_tflops_per_device, compute.peak_source) == (191.5, "resource.peak_tflops")


def test_unknown_gpu_type_without_peak_is_a_spec_error():
    spec = make_spec(TINY_LLAMA, resource={"gpus_per_node": 1, "gpu_type": "rtx4090", "gpu_memory_gb": 24})
    with pytest.raises(SpecError) as info:
        estimate_compute(spec, ParallelLayout(), locate=lambda f: ("experiments/x.yaml", 40, 5))
    (issue,) = info.value.issues
    assert (issue.field, issue.line) == ("resource.peak_tflops", 40)
    assert "rtx4090" in issue.message and "set resource.peak_tflops" in issue.message


def test_pipeline_bubble_lengthens_the_wall_time():
    spec = make_spec(
        TINY_LLAMA, train={"grad_accum_steps": 4}, resource={"gpus_per_node": 2, "gpu_type": "l4"}
    )
    flat = estimate_compute(spec, ParallelLayout(dp=2))
    piped = estimate_compute(spec, ParallelLayout(dp=1, pp=2))
    assert piped.pipeline_bubble == 1 + (2 - 1) / 4
    # Same devices, half the global batch (dp=1), and the bubble on top.
    assert piped.wall_seconds == pytest.approx(flat.wall_seconds / 2 * 1.25)


# --------------------------------------------------------------------------- tiers


def _gpu_compute_with_hours(hours: float, world: int = 8):
    spec = make_spec(TINY_LLAMA, resource={"gpus_per_node": world, "gpu_type": "h100", "max_gpu_hours": 8})
    base = estimate_compute(spec, ParallelLayout(dp=world))
    return dataclasses.replace(base, wall_seconds=hours * 3600 / world), spec.resource


def test_tier_boundaries_are_inclusive():
    assert SMALL_TIER_MAX_GPU_HOURS == 1.0
    compute, resource = _gpu_compute_with_hours(1.0)
    assert compute.gpu_hours == 1.0
    tier = approval_tier(compute, resource)
    assert (tier.name, tier.required_approvals) == ("small", SMALL_TIER_APPROVALS)

    compute, resource = _gpu_compute_with_hours(1.0001)
    tier = approval_tier(compute, resource)
    assert (tier.name, tier.required_approvals) == ("large", LARGE_TIER_APPROVALS)

    compute, resource = _gpu_compute_with_hours(8.0)  # exactly max_gpu_hours
    assert approval_tier(compute, resource).name == "large"

    compute, resource = _gpu_compute_with_hours(8.01)
    tier = approval_tier(compute, resource)
    assert (tier.name, tier.required_approvals) == ("refused", None)
    assert "exceeds resource.max_gpu_hours (8)" in tier.reason


def test_cpu_runs_are_small_however_long():
    spec = tiny_cpu_spec()
    compute = dataclasses.replace(estimate_compute(spec, ParallelLayout(dp=2)), wall_seconds=10_000 * 3600)
    tier = approval_tier(compute, spec.resource)
    assert (tier.name, tier.required_approvals) == ("small", 1)


# --------------------------------------------------------------------------- plan + rendering


def test_make_plan_is_json_safe_and_renders():
    spec = make_spec(
        LLAMA_7B,
        data={"seq_len": 4096},
        train={"micro_batch_size": 1, "grad_accum_steps": 4, "precision": "bf16", "max_steps": 1000},
        resource={**H100_NODE, "time_limit_minutes": 30},
    )
    plan = make_plan(spec)
    data = json.loads(json.dumps(plan.to_dict(), allow_nan=False))
    assert data["parallel"] == {
        "dp": 8,
        "tp": 1,
        "pp": 1,
        "fsdp": True,
        "world_size": 8,
        "devices_per_node": 8,
        "on_gpu": True,
        "chosen_by": "auto",
        "rejected": list(plan.parallel.rejected),
        "micro_batch_size": 1,
        "grad_accum_steps": 4,
        "global_batch": 32,
        "activation_checkpointing": "none",
    }
    assert data["memory"]["total_bytes"] == plan.memory.total_bytes
    assert data["compute"]["tokens"] == 1000 * 32 * 4096
    assert data["tier"]["name"] == "large"
    assert data["spec_hash"] == spec.spec_hash()
    # 6.1e18 FLOPs at 989 TF x 0.35 on 8 GPUs is ~37 min: over the 30 min limit.
    assert not plan.compute.fits_time_limit
    assert any("time_limit_minutes (30)" in w for w in plan.warnings)

    text = render_plan_text(plan)
    assert text.startswith("plan: preflight-case")
    for needle in ("dp=8 tp=1 pp=1 fsdp (auto)", "6.74 B", "of 80.0 GiB", "tier", "large: 2 approval(s)"):
        assert needle in text
    markdown = render_plan_markdown(plan)
    assert "| layout | dp=8 tp=1 pp=1 fsdp (auto) |" in markdown
    assert "| memory/device |" in markdown and "- :warning: estimated wall time" in markdown
    cmarkgfm = pytest.importorskip("cmarkgfm")
    html = cmarkgfm.github_flavored_markdown_to_html(markdown)
    table_rows = len(text.splitlines()) - 1 - len(plan.warnings)  # minus title and warning lines
    assert html.count("<tr>") == 1 + table_rows  # the header row + the same rows as the text table


def test_plan_for_tiny_cpu_spec_is_small():
    plan = make_plan(tiny_cpu_spec())
    assert (plan.parallel.dp, plan.parallel.on_gpu, plan.tier.name) == (2, False, "small")
    assert plan.warnings == ()
    assert "0 (CPU)" in render_plan_text(plan)


def test_pipeline_stages_are_planned_only_when_no_layout_without_them_fits():
    # Llama-2-7B on 2 x H100 for a trainer that runs dp and pp only: the whole model does not fit
    # one device (112 GiB of fp32 states), two stages do; the global batch (1 x 8 x 2 rows) is kept
    # by 16 micro-batches, enough for 1F1B's two in flight.
    spec = make_spec(LLAMA_7B, train={"micro_batch_size": 1, "grad_accum_steps": 8, "precision": "bf16"},
                     resource={"gpus_per_node": 2, "gpu_type": "h100", "gpu_memory_gb": 80})
    staged = plan_parallel(spec, capability=ExecutionCapability(gpu=frozenset({"dp", "pp"}), cpu=frozenset({"dp"})))
    assert (staged.dp, staged.tp, staged.pp, staged.micro_batch_size, staged.grad_accum_steps) == (1, 1, 2, 1, 16)
    # With FSDP available (the trainer's own capability), sharding is preferred to stages.
    assert plan_parallel(spec).pp == 1
