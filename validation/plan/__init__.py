"""The planner: what a spec will cost before any machine is touched.

Pure functions of a validated `ExperimentSpec` (no torch, no I/O), so `pipeline plan`
and the PR check can answer in milliseconds. One module per concern:

- `layout`: `plan_parallel(spec)`, the parallel layout (dp x tp x pp, FSDP on or off).
  For `parallel: auto` the first layout that fits in memory in the search order; an
  explicit layout is verified. Raises `SpecError` (every problem at once, with what to
  change) when nothing fits.
- `memory`: `estimate_memory(spec, layout)`, bytes per device by category (weights,
  gradients, optimizer state, activations, logits, wrapper, overhead) vs
  `resource.gpu_memory_gb`.
- `compute`: `estimate_compute(spec, layout)`, FLOPs, GPU-hours at an assumed MFU, wall time.
- `cpu_speed`: a CPU run priced from this machine's speed measured now (`MeasuredCpu`).
- `tier`: `approval_tier(compute, resource)`, how many approvals the run needs, or refused.
- `assemble`: `make_plan(spec)` combines them.
- `decision`: the decision a researcher takes from a plan, first (layout, memory, time for
  every run, cost, detectable effect, reuse, passes over the data, evaluation points).
- `render`: `render_plan_text` / `render_plan_markdown` show it.
- `common`: shared pieces: units, the spec locator, layout names, number formats.

Every figure is an estimate with its assumptions named next to the constant that
encodes it; the point is to catch the 10x mistakes (a 70B model on one node, a
week-long run on a one-hour budget) before the pull request is merged, not to
predict the allocator to the megabyte.

Memory units: `resource.gpu_memory_gb` is read as GiB (2**30 bytes). An "80 GB" H100
reports 81,559 MiB (79.6 GiB) in nvidia-smi; the 0.4 GiB difference is well inside the
framework overhead counted below.
"""

from validation.plan.assemble import Plan, downstream_budget, make_plan
from validation.plan.common import (
    GIB,
    Locator,
    format_bytes,
    format_count,
    format_duration,
    no_location,
)
from validation.plan.compute import (
    ESTIMATE_THREADS_PER_CPU_PROCESS,
    ComputeEstimate,
    estimate_compute,
)
from validation.plan.layout import MAX_SUGGESTED_NODES, ParallelPlan, plan_parallel
from validation.plan.memory import (
    ACTIVATION_ELEMENT_BYTES,
    ACTIVATION_ELEMENT_BYTES_FSDP_CAST,
    ACTIVATION_UNSPLIT_BYTES_BY_TP,
    CATEGORIES,
    COMPUTE_COPY_BYTES,
    DDP_GRADIENT_BUCKET_COPIES,
    DENSE_MASK_BYTES,
    FRAMEWORK_OVERHEAD_BYTES_CPU,
    FRAMEWORK_OVERHEAD_BYTES_GPU,
    FSDP_PREFETCHED_LAYERS,
    LOGIT_BYTES_PER_ELEMENT,
    LOW_HEADROOM_PCT,
    SELECTIVE_EVERY,
    STATE_BYTES,
    ElementBytes,
    MemoryEstimate,
    StateBytes,
    checkpointed_blocks,
    estimate_memory,
    fsdp_shard_degree,
    state_bytes,
)
from validation.plan.render import render_plan_markdown, render_plan_text
from validation.plan.tier import (
    LARGE_TIER_APPROVALS,
    SMALL_TIER_APPROVALS,
    SMALL_TIER_MAX_GPU_HOURS,
    Tier,
    approval_tier,
)

__all__ = [
    "ACTIVATION_ELEMENT_BYTES", "ACTIVATION_ELEMENT_BYTES_FSDP_CAST", "ACTIVATION_UNSPLIT_BYTES_BY_TP",
    "DDP_GRADIENT_BUCKET_COPIES", "DENSE_MASK_BYTES", "ElementBytes", "ESTIMATE_THREADS_PER_CPU_PROCESS",
    "FRAMEWORK_OVERHEAD_BYTES_CPU", "FRAMEWORK_OVERHEAD_BYTES_GPU", "FSDP_PREFETCHED_LAYERS", "GIB",
    "LARGE_TIER_APPROVALS", "LOGIT_BYTES_PER_ELEMENT", "LOW_HEADROOM_PCT", "MAX_SUGGESTED_NODES", "SMALL_TIER_APPROVALS", "SMALL_TIER_MAX_GPU_HOURS", "STATE_BYTES",
    "ComputeEstimate", "Locator", "MemoryEstimate", "ParallelPlan", "Plan", "StateBytes", "Tier",
    "CATEGORIES", "COMPUTE_COPY_BYTES", "SELECTIVE_EVERY", "checkpointed_blocks", "fsdp_shard_degree",
    "approval_tier", "downstream_budget", "estimate_compute",
    "estimate_memory", "format_bytes", "format_count", "format_duration", "make_plan", "no_location",
    "plan_parallel", "render_plan_markdown", "render_plan_text", "state_bytes",
]
