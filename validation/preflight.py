"""Preflight: what a spec will cost before any machine is touched.

Pure functions of a validated `ExperimentSpec` (no torch, no I/O), so `pipeline plan`
and the PR check can answer in milliseconds:

- `plan_parallel(spec)`: the parallel layout (dp x tp x pp, FSDP on or off). For
  `parallel: auto` the cheapest layout that fits in memory, preferring plain data
  parallelism, then FSDP sharding, then tensor parallelism inside a node, then
  pipeline stages; an explicit layout is verified. Raises `SpecError` (every problem
  at once, with what to change) when nothing fits.
- `estimate_memory(spec, layout)`: bytes per device for weights, gradients, Adam
  states, activations, logits and framework overhead vs `resource.gpu_memory_gb`.
- `estimate_compute(spec, layout)`: FLOPs, GPU-hours at an assumed MFU, wall time.
- `approval_tier(compute, resource)`: how many approvals the run needs, or refused.
- `make_plan(spec)` combines them; `render_plan_text` / `render_plan_markdown` show it.

Every figure is an estimate with its assumptions named next to the constant that
encodes it; the point is to catch the 10x mistakes (a 70B model on one node, a
week-long run on a one-hour budget) before the pull request is merged, not to
predict the allocator to the megabyte.

Memory units: `resource.gpu_memory_gb` is read as GiB (2**30 bytes). An "80 GB" H100
reports 81,559 MiB (79.6 GiB) in nvidia-smi; the 0.4 GiB difference is well inside the
framework overhead counted below.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NoReturn

from validation.capability import TRAINER, ExecutionCapability
from validation.errors import Issue, SpecError
from validation.flops import (
    PEAK_TFLOPS_BF16,
    attention_flops_per_token,
    device_peak,
    matmul_parameters,
)
from validation.spec import ExperimentSpec, ParallelLayout, ResourceSpec

GIB = 2**30

# --------------------------------------------------------------------------- constants


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter kept for training (ZeRO paper, Rajbhandari et al. 2020, §3.1)."""

    weights: int
    """The weights the forward pass reads."""
    gradients: int
    """One gradient per weight, in the weights' precision."""
    optimizer: float
    """The optimizer's own state (its file under models/optimizers/ declares it per parameter
    role; AdamW: first and second moments, fp32), plus an fp32 master copy under mixed precision.
    A mean over the model's parameters when it differs by role (Muon)."""
    optimizer_name: str = "adamw"

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


STATE_BYTES: dict[str, StateBytes] = {
    # Mixed precision: 2 (bf16/fp16 weights) + 2 (grads) + 12 (fp32 master 4 + m 4 + v 4) = 16.
    "bf16": StateBytes(weights=2, gradients=2, optimizer=12),
    "fp16": StateBytes(weights=2, gradients=2, optimizer=12),
    # Full fp32: 4 (weights, which are their own master copy) + 4 (grads) + 8 (m 4 + v 4) = 16.
    # (accelerate's autocast keeps fp32 weights and grads, which is this same 16.)
    "fp32": StateBytes(weights=4, gradients=4, optimizer=8),
}

# Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
# Models", §4.1) count activations in 16-bit (plus 1-byte dropout masks): per layer
# s*b*h*(34 + 5*a*s/h) bytes. In fp32 every stored tensor doubles; 2x is a slight
# overestimate (the masks stay 1 byte), which is the safe side.
ACTIVATION_PRECISION_FACTOR: dict[str, int] = {"bf16": 1, "fp16": 1, "fp32": 2}
# Bytes of one saved activation element: the architectures declare their saved tensors in
# elements (models/<model_type>.py, `activation_bytes_per_layer`). Under bf16/fp16 autocast
# only the matmul outputs are 16-bit: the residual stream, the norms' upcasts and softmax
# statistics stay fp32. Measured per block over the shipped architectures
# (bench/bench_architectures.py): 0.59-0.75 of the fp32 bytes, i.e. 2.4-3.0 bytes per element.
ACTIVATION_ELEMENT_BYTES: dict[str, float] = {"bf16": 2.75, "fp16": 2.75, "fp32": 4}
MASTER_WEIGHT_BYTES: dict[str, int] = {"bf16": 4, "fp16": 4, "fp32": 0}

# The 5*a*s^2*b term is the attention score matrix (softmax, its dropout mask and
# output). Fused SDPA kernels (flash / memory-efficient) keep only a log-sum-exp and
# recompute the scores in the backward pass -- the same effect as the paper's selective
# recomputation -- so the term is only counted for `attn_implementation: eager`. (The
# boolean document mask of packed rows, s^2*b bytes, is small next to 34*s*b*h*layers.)
ATTENTION_SCORES_STORED: dict[str, bool] = {"eager": True, "sdpa": False}

# The loss upcasts the [s, b, vocab] logits to fp32 and keeps the log-softmax for the
# backward pass: about 8 bytes per logit at the peak, on the last pipeline stage,
# split over tp (vocab-parallel output). Not in Korthikanti's per-layer formula, but it
# dominates for small models with large vocabularies.
LOGIT_BYTES_PER_ELEMENT = 8

# What the data-parallel wrapper holds besides the states above (checked against measured
# per-rank memory by bench/bench_parallel_memory.py, tests/unit/test_preflight_memory.py):
# - DDP copies every gradient into its own communication buckets (gradient_as_bucket_view is
#   off, as accelerate leaves it): one more gradient per parameter at the peak.
# - FSDP gathers one group at a time: the group being computed in full (its parameters, and
#   its unsharded gradients before the reduce-scatter) plus the next layer prefetched. The
#   largest group is usually the embedding or the LM head (their own groups), vocab x hidden.
DDP_GRADIENT_BUCKET_COPIES = 1
FSDP_PREFETCHED_LAYERS = 1

# Tensor parallelism as the trainer executes it (trainer/parallel.py: Megatron column/row-wise
# linears in the decoder layers only, no sequence parallelism, logits gathered on every rank):
# the embedding and LM head are not split over tp (FSDP still shards them over dp); of
# Korthikanti's 34 bytes per s*b*h, 10 stay replicated (norm inputs, residuals, dropout masks)
# and 24 are split over tp (paper, Table 2, "tensor parallel" row); the logits are not split.
# Measured: bench/bench_parallel_memory.py, FSDP+TP 1x2 (the old sequence-parallel assumption
# was 0.66 of the measured peak).
ACTIVATION_UNSPLIT_BY_TP = 10

# CUDA context, NCCL buffers and allocator slack per GPU; interpreter, torch and gloo
# buffers per CPU process.
FRAMEWORK_OVERHEAD_BYTES_GPU = 1 * GIB
FRAMEWORK_OVERHEAD_BYTES_CPU = GIB // 2

# Below this free share a layout "fits" but a warning says fragmentation may still OOM.
LOW_HEADROOM_PCT = 10.0

# Peak FLOPS and FLOPs per token live in `validation.flops` (one table, one formula).
# A CPU process is estimated at one thread's peak: a lower bound, so CPU wall-time
# estimates err long rather than short. It never affects the tier: CPU runs cost no GPU-hours.
ESTIMATE_THREADS_PER_CPU_PROCESS = 1

# Approval tiers (budget in GPU-hours = devices x wall hours; CPU runs cost no GPU-hours).
SMALL_TIER_MAX_GPU_HOURS = 1.0
"""A GPU run estimated at or under this many GPU-hours, or any CPU run, is `small`."""
SMALL_TIER_APPROVALS = 1
"""Approvals a `small` run needs before `/train` starts it."""
LARGE_TIER_APPROVALS = 2
"""Approvals a `large` run (over the small threshold, within `resource.max_gpu_hours`) needs."""

# How far `plan_parallel` looks for a node count that would fit, to suggest it.
MAX_SUGGESTED_NODES = 4096

Locator = Callable[[str], tuple[str, int, int]]
"""Maps a dotted spec field (e.g. `resource.gpu_memory_gb`) to (file, line, col) of its YAML node."""


def no_location(field_path: str) -> tuple[str, int, int]:
    """Default locator for specs built in code: no file to point at."""
    return ("<spec>", 1, 1)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device holds at the peak of a training step, vs its capacity."""

    parameters_per_device: int
    """Parameters whose states this device keeps (after tp/pp split and FSDP sharding)."""
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    """Korthikanti et al. 2022, per layer / tp, times layers per stage, times micro-batches in flight."""
    logits_bytes: int
    overhead_bytes: int
    capacity_bytes: int
    state_bytes: StateBytes
    """Bytes per parameter behind weights/gradients/optimizer."""
    sharding_degree: int
    """How many ways the parameter states are split on this device (tp x pp x dp-if-FSDP)."""
    wrapper_bytes: int = 0
    """DDP's gradient buckets, or FSDP's unsharded working set (see `DDP_GRADIENT_BUCKET_COPIES`)."""

    @property
    def total_bytes(self) -> int:
        return (
            self.wrapper_bytes
            + self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.logits_bytes
            + self.overhead_bytes
        )

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    @property
    def headroom_pct(self) -> float:
        """Free share of the device at the estimated peak; negative when it does not fit."""
        return 100.0 * (self.capacity_bytes - self.total_bytes) / self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(total_bytes=self.total_bytes, fits=self.fits, headroom_pct=round(self.headroom_pct, 2))
        return data


@dataclass(frozen=True)
class ParallelPlan:
    """The layout a run will use, why, and what it costs in memory."""

    dp: int
    tp: int
    pp: int
    fsdp: bool
    world_size: int
    devices_per_node: int
    on_gpu: bool
    chosen_by: Literal["auto", "explicit"]
    memory: MemoryEstimate
    rejected: tuple[str, ...] = ()
    """Cheaper layouts tried first (auto only) and why they did not fit."""

    def layout(self) -> ParallelLayout:
        """The plan as the spec's explicit layout (what the trainer should run with)."""
        return ParallelLayout(dp=self.dp, tp=self.tp, pp=self.pp, fsdp=self.fsdp)

    def describe(self) -> str:
        return _describe_layout(self.dp, self.tp, self.pp, self.fsdp)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dp": self.dp,
            "tp": self.tp,
            "pp": self.pp,
            "fsdp": self.fsdp,
            "world_size": self.world_size,
            "devices_per_node": self.devices_per_node,
            "on_gpu": self.on_gpu,
            "chosen_by": self.chosen_by,
            "rejected": list(self.rejected),
        }


@dataclass(frozen=True)
class ComputeEstimate:
    """Training FLOPs and what they cost on the spec's devices."""

    parameters: int
    steps: int
    seq_len: int
    global_batch: int
    """Rows per optimizer step (micro batch x grad accumulation x dp)."""
    tokens: int
    model_flops: float
    """6 x N x tokens (forward 2N + backward 4N per token; Kaplan et al. 2020); see `validation.flops`."""
    attention_flops: float
    """12 x layers x hidden x seq_len per token, forward + backward (PaLM, Chowdhery et al. 2022, App. B)."""
    peak_tflops_per_device: float
    peak_source: str
    """Where the peak came from: `resource.peak_tflops` or `table:<gpu_type>`."""
    assumed_mfu: float
    pipeline_bubble: float
    """Wall-time factor of the 1F1B pipeline bubble: 1 + (pp - 1) / micro-batches per step."""
    world_size: int
    on_gpu: bool
    wall_seconds: float
    time_limit_minutes: int

    @property
    def total_flops(self) -> float:
        return self.model_flops + self.attention_flops

    @property
    def device_hours(self) -> float:
        return self.wall_seconds * self.world_size / 3600.0

    @property
    def gpu_hours(self) -> float:
        """What the budget counts: device-hours on GPUs, zero on CPUs."""
        return self.device_hours if self.on_gpu else 0.0

    @property
    def fits_time_limit(self) -> bool:
        return self.wall_seconds <= self.time_limit_minutes * 60

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            total_flops=self.total_flops,
            device_hours=self.device_hours,
            gpu_hours=self.gpu_hours,
            fits_time_limit=self.fits_time_limit,
        )
        return data


@dataclass(frozen=True)
class Tier:
    """How much sign-off a run needs before it may start."""

    name: Literal["small", "large", "refused"]
    required_approvals: int | None
    """Maintainer approvals needed; None when refused (no number of approvals suffices)."""
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Plan:
    """Everything preflight knows about a spec: layout, memory, compute, tier."""

    experiment: str
    spec_hash: str
    parameters: int
    parallel: ParallelPlan
    compute: ComputeEstimate
    tier: Tier
    resource: ResourceSpec
    warnings: tuple[str, ...] = field(default=())
    seeds: int = 1
    """`hypothesis.seeds`: the plan says what that many paired seeds can decide."""
    downstream: str | None = None
    """`eval.tasks`: what the downstream evaluation may spend (`downstream_budget`); None without tasks."""

    @property
    def memory(self) -> MemoryEstimate:
        return self.parallel.memory

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (plain str/int/float/bool/list/dict)."""
        return {
            "experiment": self.experiment,
            "spec_hash": self.spec_hash,
            "parameters": self.parameters,
            "parallel": self.parallel.to_dict(),
            "memory": self.memory.to_dict(),
            "compute": self.compute.to_dict(),
            "tier": self.tier.to_dict(),
            "resource": {
                "nodes": self.resource.nodes,
                "gpus_per_node": self.resource.gpus_per_node,
                "cpu_processes": self.resource.cpu_processes,
                "gpu_type": self.resource.gpu_type,
                "gpu_memory_gb": self.resource.gpu_memory_gb,
                "max_gpu_hours": self.resource.max_gpu_hours,
                "time_limit_minutes": self.resource.time_limit_minutes,
            },
            "warnings": list(self.warnings),
            "downstream": self.downstream,
        }


# --------------------------------------------------------------------------- memory


def activation_bytes_per_layer(
    seq_len: int, micro_batch: int, hidden: int, heads: int, *, store_attention_scores: bool = True
) -> int:
    """Korthikanti et al. 2022: s*b*h*(34 + 5*a*s/h) bytes per layer with 16-bit activations.

    Written as s*b*h*34 + 5*a*s^2*b so it stays an exact integer; the second term (the
    attention scores) is dropped when a fused kernel recomputes them.
    """
    s, b, h, a = seq_len, micro_batch, hidden, heads
    scores = 5 * a * s * s * b if store_attention_scores else 0
    return 34 * s * b * h + scores


def estimate_memory(spec: ExperimentSpec, layout: ParallelLayout) -> MemoryEstimate:
    """Peak bytes per device for `layout`; never raises (see `plan_parallel` for checks).

    Parameter states: N x 16 bytes (see `STATE_BYTES`) divided by tp x pp (each device
    holds its slice of the model), and by dp too when FSDP shards everything (ZeRO-3).
    Wrapper: DDP's gradient buckets or FSDP's unsharded group (see `DDP_GRADIENT_BUCKET_COPIES`).
    Tensor parallelism splits the decoder layers' parameters and 24 of Korthikanti's 34 bytes
    of activations, not the embeddings or logits (see `ACTIVATION_UNSPLIT_BY_TP`).
    Activations: Korthikanti's per-layer bytes, times
    the layers of one pipeline stage, times the micro-batches a 1F1B schedule keeps in
    flight on the first stage, min(pp, grad_accum_steps) -- which is why pipelining
    alone does not shrink activations once there are >= pp micro-batches.
    """
    return _memory(spec, layout.dp, layout.tp, layout.pp, layout.fsdp, spec.train.micro_batch_size)


def state_bytes(spec: ExperimentSpec) -> StateBytes:
    """Bytes per parameter of weights, gradients and optimizer state for `spec`'s precision and
    optimizer: the optimizer file's state bytes per role, weighted by the parameters of each
    role (hidden matrices vs the rest), plus the fp32 master copy of mixed precision."""
    model, train = spec.model, spec.train
    base = STATE_BYTES[train.precision]
    total = model.parameter_count()
    head = model.vocab_size * model.hidden_size
    hidden = max(0, min(total, model.matmul_parameters() - head))
    opt = train.optimizer
    square = (model.hidden_size, model.hidden_size)
    per_param = (hidden * opt.state_bytes_per_parameter("hidden", square)
                 + (total - hidden) * opt.state_bytes_per_parameter("embedding", (model.vocab_size, model.hidden_size))
                 ) / max(1, total)
    return StateBytes(weights=base.weights, gradients=base.gradients,
                      optimizer=round(MASTER_WEIGHT_BYTES[train.precision] + per_param, 3), optimizer_name=opt.name)


def _memory(spec: ExperimentSpec, dp: int, tp: int, pp: int, fsdp: bool, micro_batch: int) -> MemoryEstimate:
    model, train, resource = spec.model, spec.train, spec.resource
    on_gpu = resource.gpus_per_node > 0
    state = state_bytes(spec)
    sharding = tp * pp * (dp if fsdp else 1)
    embedding = model.embedding_parameters()
    layers_total = model.block_parameters()
    # tp splits the decoder layers only (see ACTIVATION_UNSPLIT_BY_TP); pp and FSDP split everything.
    params_here = -(-(-(-layers_total // tp) + embedding) // (pp * (dp if fsdp else 1)))

    element = ACTIVATION_ELEMENT_BYTES[train.precision]
    # The architecture's own count of what one block saves (models/<model_type>.py).
    per_layer = int(model.activation_bytes_per_layer(spec.data.seq_len, micro_batch, element))
    unsplit = ACTIVATION_UNSPLIT_BY_TP // 2 * element  # Korthikanti's 10 of 34 bytes, per element
    replicated = int(unsplit * spec.data.seq_len * micro_batch * model.hidden_size) if tp > 1 else 0
    per_layer = replicated + -(-(per_layer - replicated) // tp)
    in_flight = min(pp, train.grad_accum_steps)
    activations = per_layer * (model.num_layers // pp) * in_flight
    logits = spec.data.seq_len * micro_batch * model.vocab_size * LOGIT_BYTES_PER_ELEMENT

    if fsdp and dp > 1:
        one_embedding = model.vocab_size * model.hidden_size
        layer = -(-(layers_total // model.num_layers) // tp)
        largest = max(one_embedding, layer)
        wrapper = largest * (state.weights + state.gradients) + FSDP_PREFETCHED_LAYERS * layer * state.weights
    elif dp > 1:
        wrapper = DDP_GRADIENT_BUCKET_COPIES * params_here * state.gradients
    else:
        wrapper = 0

    return MemoryEstimate(
        parameters_per_device=params_here,
        weights_bytes=params_here * state.weights,
        gradients_bytes=params_here * state.gradients,
        optimizer_bytes=int(params_here * state.optimizer),
        activations_bytes=activations,
        logits_bytes=logits,
        overhead_bytes=FRAMEWORK_OVERHEAD_BYTES_GPU if on_gpu else FRAMEWORK_OVERHEAD_BYTES_CPU,
        capacity_bytes=int(resource.gpu_memory_gb * GIB),
        state_bytes=state,
        sharding_degree=sharding,
        wrapper_bytes=wrapper,
    )


# --------------------------------------------------------------------------- parallel plan


def plan_parallel(
    spec: ExperimentSpec, *, locate: Locator = no_location, capability: ExecutionCapability = TRAINER
) -> ParallelPlan:
    """The layout to train with: verified if explicit, searched if `parallel: auto`.

    Only layouts `capability` covers are searched or accepted (by default what the
    trainer executes today, `validation.capability.TRAINER`).

    Auto search order (cheapest communication first): fewest pipeline stages, then the
    smallest tensor-parallel degree, then FSDP only if the replicated layout does not
    fit -- i.e. plain DP, FSDP, TP within a node (+FSDP), then PP. The first layout that
    fits in memory wins. On CPU (`gpus_per_node: 0`) only plain DP over
    `cpu_processes` per node is considered.
    """
    if isinstance(spec.parallel, ParallelLayout):
        return _verify_explicit(spec, spec.parallel, locate, capability)
    return _search_auto(spec, locate, capability)


def _devices_per_node(resource: ResourceSpec) -> int:
    return resource.gpus_per_node if resource.gpus_per_node else resource.cpu_processes


def _describe_layout(dp: int, tp: int, pp: int, fsdp: bool) -> str:
    return f"dp={dp} tp={tp} pp={pp}" + (" fsdp" if fsdp else "")


def _candidates(
    spec: ExperimentSpec, nodes: int, capability: ExecutionCapability
) -> Iterator[tuple[int, int, int, bool]]:
    """Layouts honouring the divisibility rules and `capability`, most preferred first."""
    resource = spec.resource
    if resource.gpus_per_node == 0:
        # CPU processes: replicated first, then sharded (FSDP2 runs on gloo) where the
        # trainer can execute it; tensor/pipeline parallelism never pays off on CPUs.
        world = nodes * resource.cpu_processes
        yield (world, 1, 1, False)
        if world > 1 and "fsdp" in capability.axes(on_gpu=False):
            yield (world, 1, 1, True)
        return
    axes = capability.axes(on_gpu=True)
    gpn = resource.gpus_per_node
    world = nodes * gpn
    layers = spec.model.num_layers
    # The architecture says which degrees split it (heads, kv heads, a declared TP plan).
    tps = [t for t in range(1, gpn + 1) if gpn % t == 0 and spec.model.tp_problem(t) is None]
    pps = [p for p in range(1, layers + 1) if layers % p == 0]
    tps = tps if "tp" in axes else [1]
    pps = pps if "pp" in axes else [1]
    for pp in pps:
        for tp in tps:
            if world % (tp * pp):
                continue
            dp = world // (tp * pp)
            yield (dp, tp, pp, False)
            if dp > 1 and "fsdp" in axes:
                yield (dp, tp, pp, True)


def _global_batch_ok(spec: ExperimentSpec, dp: int) -> bool:
    wanted = spec.train.global_batch_size
    return wanted is None or spec.global_batch(dp) == wanted


def _first_fit(
    spec: ExperimentSpec,
    nodes: int,
    micro_batch: int,
    capability: ExecutionCapability,
    *,
    honour_global_batch: bool = True,
) -> tuple[int, int, int, bool] | None:
    for dp, tp, pp, fsdp in _candidates(spec, nodes, capability):
        if honour_global_batch and not _global_batch_ok(spec, dp):
            continue
        if _memory(spec, dp, tp, pp, fsdp, micro_batch).fits:
            return (dp, tp, pp, fsdp)
    return None


def _search_auto(spec: ExperimentSpec, locate: Locator, capability: ExecutionCapability) -> ParallelPlan:
    resource = spec.resource
    rejected: list[str] = []
    smallest: tuple[tuple[int, int, int, bool], MemoryEstimate] | None = None
    batch_mismatch = False
    for dp, tp, pp, fsdp in _candidates(spec, resource.nodes, capability):
        if not _global_batch_ok(spec, dp):
            batch_mismatch = True
            continue
        memory = _memory(spec, dp, tp, pp, fsdp, spec.train.micro_batch_size)
        if memory.fits:
            return ParallelPlan(
                dp=dp,
                tp=tp,
                pp=pp,
                fsdp=fsdp,
                world_size=resource.world_size,
                devices_per_node=_devices_per_node(resource),
                on_gpu=resource.gpus_per_node > 0,
                chosen_by="auto",
                memory=memory,
                rejected=tuple(rejected),
            )
        rejected.append(f"{_describe_layout(dp, tp, pp, fsdp)}: {format_bytes(memory.total_bytes)}")
        if smallest is None or memory.total_bytes < smallest[1].total_bytes:
            smallest = ((dp, tp, pp, fsdp), memory)

    if smallest is None:
        # Every divisibility-valid layout was excluded by the global batch size.
        wanted = spec.train.global_batch_size
        _raise(
            locate,
            "train.global_batch_size",
            f"no parallel layout over {resource.world_size} devices gives a global batch of {wanted} "
            f"with micro_batch_size {spec.train.micro_batch_size} x grad_accum_steps "
            f"{spec.train.grad_accum_steps}; adjust them or drop global_batch_size",
        )
    (dp, tp, pp, fsdp), memory = smallest
    message = (
        f"no parallel layout fits {resource.world_size} x {_fmt_gb(resource.gpu_memory_gb)}: the smallest, "
        f"{_describe_layout(dp, tp, pp, fsdp)}, needs {format_bytes(memory.total_bytes)} per device "
        f"({_breakdown(memory)}); {_what_to_change(spec, capability)}"
    )
    if batch_mismatch:
        message += " (layouts whose dp does not give train.global_batch_size were skipped)"
    _raise(locate, "resource.gpu_memory_gb", message)


def _what_to_change(spec: ExperimentSpec, capability: ExecutionCapability) -> str:
    """Concrete edits that would make some layout fit, searched with the same estimator.

    Suggestions ignore `train.global_batch_size` (the message says to rebalance it).
    """
    resource, train = spec.resource, spec.train
    options: list[str] = []
    micro = _largest_fitting_micro_batch(spec, capability)
    if micro is not None:
        options.append(f"train.micro_batch_size <= {micro} (raise grad_accum_steps to keep the global batch)")
    if resource.gpus_per_node > 0:
        for nodes in _node_counts(resource.nodes):
            if _first_fit(spec, nodes, train.micro_batch_size, capability, honour_global_batch=False):
                options.append(f"resource.nodes >= {nodes} ({nodes * resource.gpus_per_node} GPUs)")
                break
    if options:
        return "it fits with " + " or ".join(options)
    if resource.gpus_per_node == 0:
        return (
            "a CPU process cannot hold it; use a smaller model or GPUs (resource.gpus_per_node), "
            "or raise resource.gpu_memory_gb if each process really has more memory"
        )
    return "no node count or micro batch helps; use GPUs with more memory or a smaller model"


def _largest_fitting_micro_batch(spec: ExperimentSpec, capability: ExecutionCapability) -> int | None:
    """Binary search below the current micro batch (memory grows with it, so fitting is monotone)."""
    nodes = spec.resource.nodes

    def fits(micro: int) -> bool:
        return _first_fit(spec, nodes, micro, capability, honour_global_batch=False) is not None

    low, high = 1, spec.train.micro_batch_size - 1
    if high < 1 or not fits(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def _node_counts(current: int) -> Iterator[int]:
    """Node counts to try for a suggestion: every count up to +64, then doubling."""
    nodes = current + 1
    while nodes <= MAX_SUGGESTED_NODES:
        yield nodes
        nodes = nodes + 1 if nodes < current + 64 else nodes * 2


def _verify_explicit(
    spec: ExperimentSpec, layout: ParallelLayout, locate: Locator, capability: ExecutionCapability
) -> ParallelPlan:
    # The layout rules of `validation.rules` (the one divisibility check, the world size,
    # the execution capability) run here too, for specs built in code without the loader.
    from validation.rules import layout_violations
    from validation.yaml_source import dotted

    resource = spec.resource
    dp, tp, pp = layout.dp, layout.tp, layout.pp
    on_gpu = resource.gpus_per_node > 0
    world = resource.world_size
    violations = layout_violations(spec, capability)
    if violations:
        issues = []
        for violation in violations:
            field_path = dotted(violation.path)
            file, line, col = locate(field_path)
            issues.append(Issue(file=file, line=line, col=col, field=field_path, message=violation.message))
        raise SpecError(issues)

    memory = _memory(spec, dp, tp, pp, layout.fsdp, spec.train.micro_batch_size)
    if not memory.fits:
        found = _first_fit(spec, resource.nodes, spec.train.micro_batch_size, capability)
        if found:
            hint = f"; {_describe_layout(*found)} fits (or set parallel: auto)"
        else:
            hint = "; " + _what_to_change(spec, capability)
        _raise(
            locate,
            "resource.gpu_memory_gb",
            f"layout {_describe_layout(dp, tp, pp, layout.fsdp)} needs {format_bytes(memory.total_bytes)} "
            f"per device ({_breakdown(memory)}) but a device has {_fmt_gb(resource.gpu_memory_gb)}{hint}",
        )
    return ParallelPlan(
        dp=dp,
        tp=tp,
        pp=pp,
        fsdp=layout.fsdp,
        world_size=world,
        devices_per_node=_devices_per_node(resource),
        on_gpu=on_gpu,
        chosen_by="explicit",
        memory=memory,
    )


def _raise(locate: Locator, field_path: str, message: str) -> NoReturn:
    file, line, col = locate(field_path)
    raise SpecError([Issue(file=file, line=line, col=col, field=field_path, message=message)])


def _breakdown(memory: MemoryEstimate) -> str:
    states = memory.weights_bytes + memory.gradients_bytes + memory.optimizer_bytes
    return (
        f"states {format_bytes(states)}, wrapper {format_bytes(memory.wrapper_bytes)}, "
        f"activations {format_bytes(memory.activations_bytes)}, "
        f"logits {format_bytes(memory.logits_bytes)}, overhead {format_bytes(memory.overhead_bytes)}"
    )


# --------------------------------------------------------------------------- compute


def estimate_compute(
    spec: ExperimentSpec, layout: ParallelLayout, *, locate: Locator = no_location
) -> ComputeEstimate:
    """FLOPs of the whole run and the time/GPU-hours they take at `resource.assumed_mfu`.

    FLOPs per token come from `validation.flops.flops_per_token` (the formula the trainer's
    MFU uses), the peak from `validation.flops.device_peak`. Raises `SpecError` at
    `resource.peak_tflops` for a gpu_type without a known peak.
    """
    resource, model = spec.resource, spec.model
    peak = device_peak(resource, spec.train.precision)
    if peak is None:
        known = ", ".join(sorted(PEAK_TFLOPS_BF16))
        _raise(
            locate,
            "resource.peak_tflops",
            f"no peak FLOPS known for gpu_type '{resource.gpu_type}' (known: {known}); "
            "set resource.peak_tflops to its dense bf16 TFLOPS",
        )
    peak_tf = peak.flops_per_second(ESTIMATE_THREADS_PER_CPU_PROCESS) / 1e12
    source = peak.source

    n = model.parameter_count()
    steps = spec.total_steps(layout.dp)
    global_batch = spec.global_batch(layout.dp)
    tokens = steps * global_batch * spec.data.seq_len
    model_flops = 6.0 * matmul_parameters(model) * tokens
    attention_flops = attention_flops_per_token(model, spec.data.seq_len) * tokens
    bubble = 1.0 + (layout.pp - 1) / spec.train.grad_accum_steps
    world = layout.dp * layout.tp * layout.pp
    wall = (model_flops + attention_flops) / (world * peak_tf * 1e12 * resource.assumed_mfu) * bubble
    return ComputeEstimate(
        parameters=n,
        steps=steps,
        seq_len=spec.data.seq_len,
        global_batch=global_batch,
        tokens=tokens,
        model_flops=model_flops,
        attention_flops=attention_flops,
        peak_tflops_per_device=peak_tf,
        peak_source=source,
        assumed_mfu=resource.assumed_mfu,
        pipeline_bubble=bubble,
        world_size=world,
        on_gpu=resource.gpus_per_node > 0,
        wall_seconds=wall,
        time_limit_minutes=resource.time_limit_minutes,
    )


# --------------------------------------------------------------------------- tier


def approval_tier(compute: ComputeEstimate, resource: ResourceSpec) -> Tier:
    """`refused` over `resource.max_gpu_hours`; `small` for CPU runs or up to
    `SMALL_TIER_MAX_GPU_HOURS`; otherwise `large`. Boundaries are inclusive."""
    hours = compute.gpu_hours
    if hours > resource.max_gpu_hours:
        return Tier(
            name="refused",
            required_approvals=None,
            reason=(
                f"estimated {hours:.1f} GPU-hours exceeds resource.max_gpu_hours ({resource.max_gpu_hours:g}); "
                "shorten the run, shrink the model, or raise the budget with sign-off"
            ),
        )
    if not compute.on_gpu:
        return Tier(name="small", required_approvals=SMALL_TIER_APPROVALS, reason="CPU run (no GPU-hours)")
    if hours <= SMALL_TIER_MAX_GPU_HOURS:
        return Tier(
            name="small",
            required_approvals=SMALL_TIER_APPROVALS,
            reason=f"{hours:.2f} GPU-hours <= {SMALL_TIER_MAX_GPU_HOURS:g}",
        )
    return Tier(
        name="large",
        required_approvals=LARGE_TIER_APPROVALS,
        reason=(
            f"{hours:.1f} GPU-hours > {SMALL_TIER_MAX_GPU_HOURS:g} "
            f"(within the budget of {resource.max_gpu_hours:g})"
        ),
    )


# --------------------------------------------------------------------------- plan


def make_plan(
    spec: ExperimentSpec, *, locate: Locator = no_location, capability: ExecutionCapability = TRAINER
) -> Plan:
    """Layout, memory, compute and tier for one spec; raises `SpecError` if no layout fits."""
    parallel = plan_parallel(spec, locate=locate, capability=capability)
    compute = estimate_compute(spec, parallel.layout(), locate=locate)
    tier = approval_tier(compute, spec.resource)
    warnings: list[str] = []
    if parallel.memory.headroom_pct < LOW_HEADROOM_PCT:
        warnings.append(
            f"only {parallel.memory.headroom_pct:.0f}% memory headroom per device; "
            "fragmentation may still run out of memory"
        )
    if not compute.fits_time_limit:
        warnings.append(
            f"estimated wall time {format_duration(compute.wall_seconds)} exceeds "
            f"resource.time_limit_minutes ({spec.resource.time_limit_minutes}); the job will be stopped "
            "and resumed from its last checkpoint, or raise the limit"
        )
    return Plan(
        experiment=spec.name,
        spec_hash=spec.spec_hash(),
        parameters=spec.model.parameter_count(),
        parallel=parallel,
        compute=compute,
        tier=tier,
        resource=spec.resource,
        warnings=tuple(warnings),
        seeds=spec.hypothesis.seeds,
        downstream=downstream_budget(spec),
    )


def downstream_budget(spec: ExperimentSpec) -> str | None:
    """One line: the tasks, their example budget and the time budget of each run's evaluation."""
    if spec.eval is None:
        return None
    from validation.eval_tasks import task_name

    tasks = ", ".join(f"{task_name(t) or t.path} ({t.limit} ex, {t.num_fewshot}-shot)" for t in spec.eval.tasks)
    return (f"{spec.eval.examples()} examples, at most {format_duration(spec.eval.time_budget_s)} per run, "
            f"rank 0 on the exported model: {tasks}")


# --------------------------------------------------------------------------- rendering


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_count(n: float) -> str:
    """6.74 B, 123.2 K: counts of parameters and tokens."""
    for threshold, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= threshold:
            return f"{n / threshold:.2f} {suffix}"
    return f"{n:.0f}"


def format_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _fmt_gb(gb: float) -> str:
    return f"{gb:g} GiB"


def _plan_rows(plan: Plan) -> list[tuple[str, str]]:
    p, m, c, r = plan.parallel, plan.memory, plan.compute, plan.resource
    if p.on_gpu:
        devices = f"{r.nodes} node(s) x {r.gpus_per_node} {r.gpu_type} ({_fmt_gb(r.gpu_memory_gb)} each)"
    else:
        devices = f"{r.nodes} node(s) x {r.cpu_processes} CPU process(es) ({_fmt_gb(r.gpu_memory_gb)} each)"
    time_note = "within" if c.fits_time_limit else "EXCEEDS"
    if plan.tier.required_approvals is None:
        approvals = "no approval can start it"
    else:
        approvals = f"{plan.tier.required_approvals} approval(s)"
    fits = "fits" if m.fits else "DOES NOT FIT"
    return [
        ("layout", f"{p.describe()} ({p.chosen_by})"),
        ("why", _why_layout(p)),
        ("world size", f"{p.world_size} = {devices}"),
        ("parameters", f"{format_count(plan.parameters)} ({plan.parameters:,})"),
        (
            "params/device",
            format_count(m.parameters_per_device)
            + (f" (split {m.sharding_degree} ways)" if m.sharding_degree > 1 else " (not split)"),
        ),
        ("weights", f"{format_bytes(m.weights_bytes)} ({m.state_bytes.weights} B/param)"),
        ("gradients", f"{format_bytes(m.gradients_bytes)} ({m.state_bytes.gradients} B/param)"),
        ("optimizer", f"{format_bytes(m.optimizer_bytes)} ({m.state_bytes.optimizer:g} B/param, "
                      f"{m.state_bytes.optimizer_name})"),
        ("activations", format_bytes(m.activations_bytes)),
        ("logits", format_bytes(m.logits_bytes)),
        ("ddp/fsdp", f"{format_bytes(m.wrapper_bytes)} ({_wrapper_what(plan.parallel)})"),
        ("overhead", format_bytes(m.overhead_bytes)),
        (
            "memory/device",
            f"{format_bytes(m.total_bytes)} of {format_bytes(m.capacity_bytes)} "
            f"({m.headroom_pct:.0f}% free, {fits})",
        ),
        (
            "tokens",
            f"{format_count(c.tokens)} ({c.steps:,} steps x {c.global_batch} rows x {c.seq_len} tokens)",
        ),
        (
            "FLOPs",
            f"{c.total_flops:.3g} (6NT {c.model_flops:.3g} + attention {c.attention_flops:.3g})",
        ),
        ("peak", f"{c.peak_tflops_per_device:g} TFLOPS/device ({c.peak_source}) at MFU {c.assumed_mfu:g}"),
        ("GPU-hours", f"{c.gpu_hours:.2f} (budget {r.max_gpu_hours:g})" if c.on_gpu else "0 (CPU)"),
        (
            "wall time",
            f"{format_duration(c.wall_seconds)} ({time_note} the {r.time_limit_minutes} min limit)",
        ),
        ("tier", f"{plan.tier.name}: {approvals} -- {plan.tier.reason}"),
        ("verdict", _seeds_note(plan.seeds)),
        *([("downstream", plan.downstream)] if plan.downstream else []),
    ]


def _seeds_note(seeds: int) -> str:
    """What `hypothesis.seeds` paired seeds can decide (reports.verdict: a paired t-test needs 2)."""
    if seeds == 1:
        return ("1 seed: cannot decide the hypothesis (the verdict will be inconclusive; "
                "it needs 2 paired seeds, 3 or more for power)")
    if seeds == 2:
        return "2 paired seeds: a test, with little power (3 or more advised)"
    return f"{seeds} paired seeds"


def _why_layout(p: ParallelPlan) -> str:
    """One line: why this layout (the cheaper ones tried first and what they needed)."""
    if p.chosen_by == "explicit":
        return "set in the spec (parallel:); verified to fit"
    if not p.rejected:
        if p.dp == 1 and p.tp == 1 and p.pp == 1:
            return "one process: nothing to split"
        return "fits replicated: plain data parallelism is the cheapest layout"
    tried = "; ".join(p.rejected)
    capacity = format_bytes(p.memory.capacity_bytes)
    return f"the first layout that fits {capacity} per device; cheaper ones need more ({tried})"


def _wrapper_what(p: ParallelPlan) -> str:
    if p.dp == 1:
        return "one replica: nothing to synchronise"
    if p.fsdp:
        return "largest group unsharded + next layer prefetched"
    return "DDP gradient buckets"


def render_plan_text(plan: Plan) -> str:
    """A compact two-column table for the terminal."""
    rows = _plan_rows(plan)
    width = max(len(k) for k, _ in rows)
    lines = [f"plan: {plan.experiment} (spec {plan.spec_hash})"]
    lines += [f"  {key.ljust(width)}  {value}" for key, value in rows]
    lines += [f"  warning: {w}" for w in plan.warnings]
    return "\n".join(lines) + "\n"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def render_plan_markdown(plan: Plan) -> str:
    """The plan as a markdown section for the sticky PR comment."""
    lines = [f"#### Plan: `{plan.experiment}`", "", "| | |", "|---|---|"]
    lines += [f"| {key} | {_md_escape(value)} |" for key, value in _plan_rows(plan)]
    if plan.warnings:
        lines.append("")
        lines += [f"- :warning: {w}" for w in plan.warnings]
    return "\n".join(lines) + "\n"
