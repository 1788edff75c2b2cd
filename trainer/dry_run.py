"""Full-scale dry run: the experiment's real model, at full size, on fake tensors, sharded by the
trainer's own code over a fake process group of the planned world size, one training step under
torch's memory tracker. What `pipeline plan FILE --dry-run` and the pull-request check run.

    result = dry_run(spec)        # DryRun: peak per device by category, beside the analytic plan
    result.problems()             # [] or one line per failed check

How (torchtitan's scripts/estimate/estimation.py, taken further):

- the layout is the plan's (`validation.preflight.make_plan`: `parallel: auto` resolved, with the
  micro batch, accumulation and checkpointing the plan chose);
- `dist.init_process_group("fake")` of that world size (FakeStore: no peer, collectives return at
  once) and the CPU device mesh of `trainer.parallel.ParallelDims`; the model parts are the
  trainer's own (`trainer.model_parts.build_model_parts`): built and sharded on the meta device
  (`trainer.parallel.shard_on_meta`: TP plan, FSDP groups, mixed-precision policy, activation
  checkpointing; or the pipeline's stages), then allocated and initialised under `FakeTensorMode`:
  shapes, dtypes and placements are real, no byte is;
- the forward runs under autocast as accelerate runs it (FSDP layouts keep its fp32 copy of the
  outputs); DDP cannot wrap fake parameters (it reads them to compare shapes across ranks), so its
  buckets (accelerate leaves gradient_as_bucket_view off: one gradient copy per parameter, alive
  for the whole run) are counted from the parameters; a mixture of experts' routing counts, read
  on the host, are answered with a balanced count (fake tensors have no values to route by);
- one untracked warm-up step (it creates the optimizer state, and fills DTensor's sharding cache,
  whose propagation runs on global-shape fake tensors the tracker would count: in a first try the
  optimizer state read 9x its size), then one tracked step: forward, backward, gradient clipping,
  optimizer step, over `grad_accum_steps` micro-batches (at most 2: under DDP the first without gradient
  sync, as accelerate's `no_sync` runs it; FSDP reduce-scatters each, as trainer/step.py does). `FSDPMemTracker` for FSDP/TP layouts, `MemTracker` for
  plain and DDP ones; the peak snapshot is split into the plan's categories (`CATEGORY_OF`);
- an optimizer that reads a scalar on the host inside its step (torch's Adafactor: its step count
  and norms, `.item()`) gets 1 back (`_ScalarReads`; fake tensors have no values, and no shape or
  allocation depends on them), noted in the result.

Ranks: data and tensor parallelism give every rank the same role (rank 0's shards are the largest
under torch.chunk), so one rank is simulated. Pipeline stages differ: the ranks of the first stage
(the most micro-batches in flight) and of the last (the LM head, logits and loss) of replica 0 are
simulated, each on its own fake group, with the trainer's own `PipelineEngine` (its parameters
drawn under fake tensors) and the real schedule of torch.distributed.pipelining over every
micro-batch of the step (the fake group's transfers return at once); `stage_peaks` reports each,
the larger is the layout's. A failure while sharding or stepping names the module that was running, or,
after the backward, the gradient clipping or the optimizer step (`DryRunFailed`);
`trainer.parallel.apply_tp_plan` names the weight dimension a TP degree does not split.

What it cannot see, added as named constants (`unseen_bytes`): the CUDA context, NCCL's buffers,
kernels' workspaces (cuBLAS, attention) and the caching allocator's fragmentation. Nor the dense
document mask of the attention paths that take one (CPU processes, a GPU in fp32:
models/_attention.py): the fake kernel builds none, as the GPU's flash path; the plan counts it.
The check that
analytic and tracked agree compares like with like: the tracker's total against the plan's total
without its framework overhead.

It runs in the calling process (one interpreter start saved: the PR check runs it per experiment)
and leaves no process group behind: it refuses to start when one is initialised, and destroys its
fake one however it ends.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from basics.errors import DryRunFailed, TrainingError
from trainer.collectives import Collectives
from trainer.model_parts import build_model_parts
from trainer.parallel import ParallelDims
from trainer.pipeline_parallel import PipelineSchedule, StageLayout, Stages
from validation.plan.common import GIB, MIB
from validation.plan.memory import (
    ALLOCATOR_FRAGMENTATION,
    CATEGORIES,
    CPU_PROCESS_BYTES,
    CUDA_CONTEXT_BYTES,
    KERNEL_WORKSPACE_BYTES,
    NCCL_BUFFER_BYTES,
)
from validation.rules import virtual_stages_per_rank

if TYPE_CHECKING:
    from validation.spec import ExperimentSpec

AGREEMENT = 0.15
"""Analytic and tracked totals must agree within this fraction of the tracked one."""
MAX_MICRO_BATCHES = 2
"""Micro-batches simulated per step: the first (no gradient sync) and the last (sync) differ."""

# What the tracker cannot see (it counts tensors torch allocates, nothing else), per device, and
# the plan's categories the tracked peak is split into: the memory model's own constants
# (validation/plan/memory.py), imported above, so the plan and its dry run share one copy.
CATEGORY_OF: dict[str, str] = {
    # FSDPMemTracker (_FSDPRefType values) and MemTracker (_MemRefType values).
    "Sharded Param": "parameters", "Unsharded Param": "parameters", "All Gather": "parameters",
    "Buffer": "parameters", "Parameter": "parameters",
    "Sharded Grad": "gradients", "Unsharded Grad": "gradients", "Reduce Scatter": "gradients",
    "Gradient": "gradients",
    "OptState": "optimizer_state", "Optstate": "optimizer_state",
    "Activation": "activations", "Inputs": "activations",
    "Temp": "logits_temporaries", "Other": "logits_temporaries",
    "DDP buckets": "gradients",
}
"""Tracker category -> plan category: FSDP's gathered parameters and the all-gather buffer are
parameters, its unsharded gradients and reduce-scatter input gradients (as the plan counts its
wrapper), backward temporaries (the logits' gradient first) are the plan's logits/temporaries."""


@dataclass(frozen=True)
class DryRun:
    """One rank's tracked peak beside the analytic plan, in bytes per device."""

    layout: str
    world_size: int
    ranks_simulated: list[int]
    tracker: str
    tracked_bytes: int
    """The tracker's peak: every tensor torch allocated, alive at the same time."""
    by_category: dict[str, int]
    """`tracked_bytes` split into `CATEGORIES` (overhead: the unseen constants)."""
    tracker_categories: dict[str, int]
    """The tracker's own categories at the peak, unmapped."""
    unseen: dict[str, int]
    analytic_bytes: int
    """The plan's total, framework overhead included."""
    analytic_by_category: dict[str, int]
    capacity_bytes: int
    seconds: float
    micro_batches: int
    notes: list[str] = field(default_factory=list)
    stage_peaks: dict[str, int] = field(default_factory=dict)
    """Pipeline layouts: the tracked peak of each simulated rank, named by the stages it runs
    (`stage 0`, `stage 1`; interleaved: `stages 0+2`); `tracked_bytes` is the largest. Empty without stages."""

    @property
    def peak_bytes(self) -> int:
        """What the device must hold: the tracked peak plus what the tracker cannot see."""
        return self.tracked_bytes + sum(self.unseen.values())

    @property
    def analytic_tracked_bytes(self) -> int:
        """The plan's total without its overhead: what a tracker could see of it."""
        return self.analytic_bytes - self.analytic_by_category.get("overhead", 0)

    @property
    def ratio(self) -> float:
        """Analytic (without overhead) over tracked."""
        return self.analytic_tracked_bytes / max(1, self.tracked_bytes)

    def problems(self, agreement: float = AGREEMENT) -> list[str]:
        """One line per failed check: the peak over the device, analytic and tracked apart."""
        out = []
        if self.peak_bytes > self.capacity_bytes:
            out.append(f"dry run: {self.layout} needs {self.peak_bytes / GIB:.2f} GiB per device "
                       f"({self.tracked_bytes / GIB:.2f} tracked + {sum(self.unseen.values()) / GIB:.2f} unseen), "
                       f"more than resource.gpu_memory_gb {self.capacity_bytes / GIB:g}")
        if abs(self.ratio - 1) > agreement:
            out.append(f"dry run: the analytic plan says {self.analytic_tracked_bytes / GIB:.2f} GiB per device "
                       f"without overhead, the tracked step {self.tracked_bytes / GIB:.2f} GiB "
                       f"(ratio {self.ratio:.2f}, allowed 1 +- {agreement:.2f}); the memory model needs recalibrating")
        return out

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(peak_bytes=self.peak_bytes, analytic_tracked_bytes=self.analytic_tracked_bytes,
                    ratio=round(self.ratio, 4), seconds=round(self.seconds, 2), problems=self.problems())
        return data

    def render_text(self) -> str:
        unit, size = ("GiB", GIB) if self.peak_bytes >= GIB else ("MiB", MIB)
        rows = [f"dry run ({self.layout} over {self.world_size} fake ranks, rank(s) "
                f"{', '.join(map(str, self.ranks_simulated))} simulated, {self.tracker}, {self.seconds:.1f} s):",
                f"  {'category':<20}{'tracked ' + unit:>12}{'analytic ' + unit:>14}"]
        for name in CATEGORIES:
            rows.append(f"  {name:<20}{self.by_category.get(name, 0) / size:>12.2f}"
                        f"{self.analytic_by_category.get(name, 0) / size:>14.2f}")
        rows.append(f"  {'total':<20}{self.peak_bytes / size:>12.2f}{self.analytic_bytes / size:>14.2f}"
                    f"   (device {self.capacity_bytes / GIB:g} GiB; analytic/tracked without overhead "
                    f"{self.ratio:.2f})")
        for name, value in self.stage_peaks.items():
            rows.append(f"  tracked peak of {name}: {value / size:.2f} {unit}")
        rows.append("  unseen, added as constants: "
                    + ", ".join(f"{k} {v / size:.2f} {unit}" for k, v in self.unseen.items()))
        rows += [f"  note: {n}" for n in self.notes]
        rows += [f"  FAIL {p}" for p in self.problems()]
        return "\n".join(rows)


def unseen_bytes(tracked: int, on_gpu: bool, world: int) -> dict[str, int]:
    """What the tracker cannot see, per device (the constants above)."""
    if not on_gpu:
        return {"cpu_process": CPU_PROCESS_BYTES, "allocator_fragmentation": int(tracked * ALLOCATOR_FRAGMENTATION)}
    return {"cuda_context": CUDA_CONTEXT_BYTES, "nccl_buffers": NCCL_BUFFER_BYTES if world > 1 else 0,
            "kernel_workspaces": KERNEL_WORKSPACE_BYTES,
            "allocator_fragmentation": int(tracked * ALLOCATOR_FRAGMENTATION)}


def planned_spec(spec: ExperimentSpec) -> tuple[ExperimentSpec, Any]:
    """The spec as the trainer would run it (the plan's layout, micro batch, accumulation and
    checkpointing made explicit), and the plan. Raises `SpecError` when nothing fits."""
    from validation.preflight import make_plan
    from validation.resolved import rebuild
    from validation.spec import ParallelLayout

    plan = make_plan(spec)
    p = plan.parallel
    layout = spec.parallel if isinstance(spec.parallel, ParallelLayout) else p.layout()
    train = spec.train
    updates: dict[str, Any] = {
        "parallel": layout.model_dump(mode="json"),
        "train.micro_batch_size": getattr(p, "micro_batch_size", train.micro_batch_size) or train.micro_batch_size,
        "train.grad_accum_steps": getattr(p, "grad_accum_steps", train.grad_accum_steps) or train.grad_accum_steps,
    }
    mode = getattr(p, "activation_checkpointing", None)
    if mode is not None and mode != train.activation_checkpointing:
        updates["train.activation_checkpointing"] = mode
    return rebuild(spec, updates), plan


class DryRunUnavailable(Exception):  # noqa: N818 - a state, not a failure of the layout
    """The layout is one the dry run does not simulate: said, not failed (the plan stands alone).
    Every layout the trainer executes is simulated today; callers still say so when one is not."""


def dry_run(spec: ExperimentSpec, rank: int = 0) -> DryRun:
    """Simulate rank `rank` of the planned layout for one training step (pipeline stages: the
    ranks of the first and the last stage of replica 0); see the module doc. Raises
    `DryRunFailed` when the layout fails at full size, `SpecError` when the plan refuses."""
    import torch.distributed as dist

    t0 = time.perf_counter()
    run_spec, plan = planned_spec(spec)
    layout = run_spec.parallel_layout()
    world = layout.dp * layout.tp * layout.pp
    if dist.is_initialized():
        raise DryRunFailed("dry run: a process group is already initialised in this process; run it on its own")
    ranks = [rank]
    if layout.pp > 1:  # the first stage holds the most micro-batches in flight, the last the head and loss
        dims = ParallelDims.from_layout(layout, world, 0, spec.resource.nodes)
        ranks = sorted({dims.global_rank(0, 0, 0), dims.global_rank(layout.pp - 1, 0, 0)})
    runs = {r: _on_fake_group(run_spec, world, r) for r in ranks}
    peak_rank = max(runs, key=lambda r: runs[r][0])
    tracked, categories, tracker, micro, balanced, scalar_reads = runs[peak_rank]
    stage_peaks = {_stage_name(run_spec, world, r): runs[r][0] for r in ranks} if layout.pp > 1 else {}
    on_gpu = spec.resource.gpus_per_node > 0
    unseen = unseen_bytes(tracked, on_gpu, world)
    by_category = dict.fromkeys(CATEGORIES, 0)
    for name, value in categories.items():
        if name in CATEGORY_OF:
            by_category[CATEGORY_OF[name]] += value
    by_category["overhead"] = sum(unseen.values())
    memory = plan.memory
    analytic = _analytic_categories(memory)
    notes = []
    if balanced:
        notes.append("mixture of experts: tokens assumed spread evenly over the experts (fake tensors have no "
                      "values to route by)")
    if scalar_reads:
        notes.append(f"optimizer {spec.train.optimizer.name}: {scalar_reads} scalar reads inside its step answered "
                     "with 1 (fake tensors have no values; no shape depends on them)")
    if not on_gpu:
        notes.append("CPU run: resource.gpu_memory_gb is read as each process's memory")
    if stage_peaks:
        notes.append(f"pipeline stages: the ranks of {' and '.join(stage_peaks)} simulated, each running its "
                     f"stages' part of the {layout.pp_schedule} schedule (all {micro} micro-batches); the larger "
                     "peak is the layout's")
    return DryRun(
        layout=plan.parallel.describe(), world_size=world, ranks_simulated=ranks, tracker=tracker,
        tracked_bytes=tracked, by_category=by_category, tracker_categories=categories, unseen=unseen,
        analytic_bytes=int(memory.total_bytes), analytic_by_category=analytic,
        capacity_bytes=int(memory.capacity_bytes), seconds=time.perf_counter() - t0, micro_batches=micro,
        notes=notes, stage_peaks=stage_peaks,
    )


def _on_fake_group(spec: ExperimentSpec, world: int, rank: int) -> tuple[int, dict[str, int], str, int, bool, int]:
    """`_simulate` (or `_simulate_stages`) rank `rank` inside a fake process group of `world`
    ranks, destroyed however it ends."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    # DTensor warns that clipping's norm over a 2-D mesh takes two all-reduces: true on a GPU,
    # noise on a fake process group.
    quiet = logging.getLogger("torch.distributed.tensor._redistribute")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        if spec.parallel_layout().pp > 1:
            return _simulate_stages(spec, world, rank)
        return _simulate(spec, world, rank)
    finally:
        dist.destroy_process_group()
        quiet.setLevel(level)


def _stage_name(spec: ExperimentSpec, world: int, rank: int) -> str:
    """`stage 0`, or `stages 0+2` for a rank of an interleaved schedule."""
    layout = spec.parallel_layout()
    dims = ParallelDims.from_layout(layout, world, rank, spec.resource.nodes)
    virtual = virtual_stages_per_rank(layout.pp_schedule)
    stages = StageLayout(layout.pp, virtual, [], dims.pp_rank).my_stages()
    return ("stage " if len(stages) == 1 else "stages ") + "+".join(map(str, stages))


def _analytic_categories(memory: Any) -> dict[str, int]:
    """The plan's categories (`MemoryEstimate.by_category`, or its fields where it has none)."""
    split = getattr(memory, "by_category", None)
    if callable(split):
        return {k: int(v) for k, v in split().items()}
    return {"parameters": memory.weights_bytes, "gradients": memory.gradients_bytes + memory.wrapper_bytes,
            "optimizer_state": memory.optimizer_bytes, "activations": memory.activations_bytes,
            "logits_temporaries": memory.logits_bytes, "overhead": memory.overhead_bytes}


def _fake_parts(spec: ExperimentSpec, world: int, rank: int, what: str) -> tuple[Any, Any, Any, str]:
    """Rank `rank`'s parallel dimensions on the fake group and its model parts, built on the meta
    device and allocated under fake tensors; (dims, parts, the fake mode, the layout's name).
    A failure is `DryRunFailed` naming `what` was being done."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    parallel = spec.parallel_layout()
    layout = f"dp={parallel.dp} tp={parallel.tp} pp={parallel.pp} fsdp={parallel.fsdp}"
    cpu = torch.device("cpu")
    fake = FakeTensorMode(allow_non_fake_inputs=True)  # the device mesh keeps real rank tensors
    try:
        dims = ParallelDims.from_layout(parallel, world, rank, spec.resource.nodes).build(cpu.type)
        parts = build_model_parts(spec, dims, cpu, spec.train.seed, allocate=lambda: fake)
    except TrainingError as exc:
        raise DryRunFailed(f"dry run ({layout}): {exc}") from None
    except (RuntimeError, ValueError, AssertionError, IndexError) as exc:
        raise DryRunFailed(f"dry run ({layout}): {what} failed: {_first_line(exc)}") from None
    return dims, parts, fake, layout


def _simulate(spec: ExperimentSpec, world: int, rank: int) -> tuple[int, dict[str, int], str, int, bool, int]:
    """Build, shard and step rank `rank` under fake tensors; the tracked peak (bytes), its
    categories, the tracker's name, the micro-batches stepped, whether routing was assumed, and
    how many scalar reads of the optimizer step were answered."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    from trainer.optim import build_optimizer

    arch, train = spec.model, spec.train
    # Sharded on the meta device, then allocated and initialised under fake tensors.
    topo, parts, fake, layout = _fake_parts(spec, world, rank, "sharding the model")
    model = parts.owner
    micro = max(1, min(train.grad_accum_steps, MAX_MICRO_BATCHES))
    routing = _balanced_routing_mode()
    with fake, routing:
        model.train()
        optimizer = build_optimizer(model, train, arch)
        batch = _batch(spec)
        step = _Step(model, optimizer, spec, topo.sharded, micro)
        _named_failure(step, batch, layout, "warm-up step")
        if topo.sharded:
            tracker: Any = FSDPMemTracker(mod=model, optm=optimizer)
            tracker.track_inputs(tuple(batch.values()))
        else:
            tracker = MemTracker()
            tracker.track_external(model, optimizer, *batch.values())
        step.between = tracker.reset_mod_stats  # a second micro-batch is not a second iteration to it
        with tracker:
            _named_failure(step, batch, layout, "tracked step")
        snapshot = tracker.get_tracker_snapshot("peak")
        # DDP cannot wrap fake parameters (it reads their data to compare shapes across ranks): its
        # buckets, one gradient copy per parameter alive for the whole run (accelerate leaves
        # gradient_as_bucket_view off), are counted from the parameters themselves.
        buckets = 0 if topo.sharded or world == 1 else sum(
            p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    device_snap: dict[Any, int] = next(iter(snapshot.values()), {}) if snapshot else {}
    total = int(device_snap.get("Total", 0)) + buckets
    categories = {str(getattr(k, "value", k)): int(v) for k, v in device_snap.items() if k != "Total"}
    if buckets:
        categories["DDP buckets"] = buckets
    return total, categories, type(tracker).__name__, micro, routing.used, step.scalar_reads


def _simulate_stages(spec: ExperimentSpec, world: int, rank: int) -> tuple[int, dict[str, int], str, int, bool, int]:
    """`_simulate` for a pipeline rank: its stages built by the trainer's own `PipelineEngine` on
    the fake group (TP and FSDP inside each stage as the trainer applies them), the parameters
    drawn under fake tensors, then the real schedule of torch.distributed.pipelining runs every
    micro-batch of one step (the fake group's transfers return at once, so this rank's in-flight
    activations are the schedule's own), the stages' gradient sync, clipping and optimizer step."""

    from trainer.optim import build_optimizer

    arch, train = spec.model, spec.train
    _, parts, fake, layout = _fake_parts(spec, world, rank, "building the stages")
    routing = _balanced_routing_mode()
    with fake, routing:
        optimizer = build_optimizer(parts.owner, train, arch)
        batch = _batch(spec)
        step = _StageStep(parts, optimizer, spec)
        _named_failure(step, batch, layout, "warm-up step")
        tracker = _micro_batch_tracker()
        tracker.track_external(parts.owner, optimizer, *batch.values())
        with tracker:
            _named_failure(step, batch, layout, "tracked step")
        snapshot = tracker.get_tracker_snapshot("peak")
    device_snap: dict[Any, int] = next(iter(snapshot.values()), {}) if snapshot else {}
    categories = {str(getattr(k, "value", k)): int(v) for k, v in device_snap.items() if k != "Total"}
    return (int(device_snap.get("Total", 0)), categories, "MemTracker", train.grad_accum_steps, routing.used,
            step.scalar_reads)


def _micro_batch_tracker() -> Any:
    from torch.distributed._tools.mem_tracker import MemTracker

    class MicroBatchTracker(MemTracker):
        """torch's `MemTracker`, letting a stage (a root module) run several micro-batches' forwards
        in one step, as a pipeline schedule does: the tracker refuses a root's second forward as a
        second iteration. The peak snapshot is global and unaffected; the stage's own statistics
        keep its latest forward's input, as for a module used twice."""

        def _pre_fw_hook(self, module: Any, inputs: Any) -> None:
            if module not in self.memory_tracking or self._mod_tracker.is_bw:
                super()._pre_fw_hook(module, inputs)
                return
            stats = self.memory_tracking[module]
            stats.input_mem = self._track_inputs_or_outputs(inputs)
            snapshot = self.get_tracker_snapshot()
            stats.local_peak = {dev: snap["Total"] for dev, snap in snapshot.items()}

    return MicroBatchTracker()


class _StageStep:
    """One optimizer step of a pipeline rank as trainer/step.py runs it with `PipelineSchedule`:
    the schedule over every micro-batch, the stages' gradient sync, clipping (the norm kept on
    the device), optimizer step, zero_grad(set_to_none)."""

    def __init__(self, parts: Stages, optimizer: Any, spec: ExperimentSpec):
        engine = parts.engine
        self.engine, self.optimizer = engine, optimizer
        self.micro, self.accum = spec.train.micro_batch_size, spec.train.grad_accum_steps
        self.precision = spec.train.precision
        self.max_norm = spec.train.grad_clip or float("inf")
        self.optimizer_name = spec.train.optimizer.name
        self.schedule = PipelineSchedule(engine, Collectives(1), self._autocast)
        self.where: str | None = None
        self.scalar_reads = 0

    def _autocast(self) -> Any:
        import contextlib

        import torch

        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()

    def __call__(self, batch: dict[str, Any]) -> None:
        import torch

        e = self.engine
        if e.schedule is None:
            e.schedule, e.schedule_shape = e.make_schedule(self.micro, self.accum), (self.micro, self.accum)
        full = {k: torch.cat([v] * self.accum) for k, v in batch.items()}
        kwargs = {"ids": full["input_ids"], "position_ids": full["position_ids"], "labels": full["labels"]}
        args = (full["input_ids"],) if e.pp_rank == 0 else ()
        self.where = None
        # The schedule's warm-up vote and the last stage's token count read scalars on the host.
        with self._autocast(), _ScalarReads():
            e.schedule.step(*args, target=full["labels"], losses=[], return_outputs=False, **kwargs)
        self.where = "the stages' gradient sync"
        self.schedule.finish_backward()
        self.where = "gradient clipping"
        self.schedule.clip(self.max_norm, host=False)
        self.where = f"the optimizer step ({self.optimizer_name})"
        with _ScalarReads() as step_reads:
            self.optimizer.step()
        self.scalar_reads += step_reads.answered
        self.optimizer.zero_grad(set_to_none=True)
        self.where = None


class _ScalarReads:
    """Answers the scalar reads (`Tensor.item()`, i.e. `aten._local_scalar_dense`) of fake tensors
    inside the optimizer step: fake tensors have no values, and an optimizer that reads its step
    count or a norm on the host (torch's Adafactor: `step_t.item()`, `param.norm().item()`) would
    otherwise stop the dry run. Each read is answered with 1 of the tensor's kind (a constant that
    fake tensor mode still knows is answered with itself): the value changes no shape and no
    allocation, which is all the dry run measures. The number of reads answered is noted."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                import torch
                from torch._subclasses.fake_tensor import FakeTensor

                # A DTensor (FSDP, TP) reads its local shard: a fake tensor too.
                tensor = getattr(args[0], "_local_tensor", args[0]) if args else None
                if func is torch.ops.aten._local_scalar_dense.default and isinstance(tensor, FakeTensor):
                    if tensor.constant is not None:
                        return tensor.constant.item()
                    outer.answered += 1
                    if tensor.dtype == torch.bool:
                        return True
                    return 1.0 if tensor.dtype.is_floating_point else 1
                return func(*args, **(kwargs or {}))

        self.answered = 0
        self.mode = Mode()

    def __enter__(self) -> _ScalarReads:
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)


def _balanced_routing_mode() -> Any:
    """A dispatch mode that answers `aten.bincount` (a mixture of experts counting the tokens each
    expert receives, then reading the counts on the host) with a real, balanced count: fake tensors
    have no values, and balanced routing is what a memory plan assumes."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._python_dispatch import TorchDispatchMode

    class BalancedRouting(TorchDispatchMode):
        used = False

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is torch.ops.aten.bincount.default and kwargs.get("weights", None) is None:
                total = args[0].numel()
                bins = max(int(kwargs.get("minlength", args[2] if len(args) > 2 else 0)), 1)
                type(self).used = True
                with unset_fake_temporarily():
                    counts = torch.full((bins,), total // bins, dtype=torch.int64)
                    counts[: total % bins] += 1
                return counts
            return func(*args, **kwargs)

    return BalancedRouting()


def _batch(spec: ExperimentSpec) -> dict[str, Any]:
    import torch

    shape = (spec.train.micro_batch_size, spec.data.seq_len)
    ids = torch.randint(0, spec.model.vocab_size, shape)
    positions = torch.arange(spec.data.seq_len).expand(shape).contiguous()
    return {"input_ids": ids, "labels": ids.clone(), "position_ids": positions}


class _Step:
    """One optimizer step as `trainer.step.StepRunner` takes it: forward, loss, backward per
    micro-batch (DDP: gradient sync on the last only; FSDP: on each), clip, optimizer step, zero_grad(set_to_none)."""

    def __init__(self, model: Any, optimizer: Any, spec: ExperimentSpec, sharded: bool, micro: int):
        self.model, self.optimizer, self.sharded, self.micro = model, optimizer, sharded, micro
        self.precision = spec.train.precision
        self.max_norm = spec.train.grad_clip or float("inf")
        self.optimizer_name = spec.train.optimizer.name
        self.between: Any = None
        """Called between micro-batches (the tracker forgets per-module stats; its peak stays)."""
        self.where: str | None = None
        """The part of the step after the model's backward that is running (clipping, the
        optimizer step), named by a failure instead of the last module the backward visited."""
        self.scalar_reads = 0
        """Scalar reads inside the optimizer step answered by `_ScalarReads`."""

    def __call__(self, batch: dict[str, Any]) -> None:
        import contextlib

        import torch

        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        autocast = torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()
        self.where = None
        for m in range(self.micro):
            last = m == self.micro - 1
            with self._sync(last), autocast:
                out = self.model(**batch, use_cache=False)
            if dtype is not None and self.sharded:  # accelerate's convert_outputs_to_fp32 (FSDP keeps it)
                out.logits = out.logits.float()
            loss = out.loss
            del out
            loss.backward()
            if not last and self.between is not None:
                self.between()
        self.where = "gradient clipping"
        clip_grad_norm(list(self.model.parameters()), self.max_norm)
        self.where = f"the optimizer step ({self.optimizer_name})"
        with _ScalarReads() as reads:
            self.optimizer.step()
        self.scalar_reads += reads.answered
        self.optimizer.zero_grad(set_to_none=True)
        self.where = None

    def _sync(self, last: bool) -> Any:
        import contextlib

        from torch.distributed.fsdp import FSDPModule

        # FSDP2 reduce-scatters every micro-batch (trainer/step.py); DDP skips the sync but the last.
        if last or isinstance(self.model, FSDPModule):
            return contextlib.nullcontext()
        no_sync = getattr(self.model, "no_sync", None)
        return no_sync() if no_sync is not None else contextlib.nullcontext()


def clip_grad_norm(parameters: list[Any], max_norm: float) -> None:
    """accelerate's clipping as the trainer calls it: one norm over parameters on several meshes
    (FSDP+TP puts the norms' and the blocks' weights on different ones). Its method uses nothing of
    the Accelerator, so it is called unbound rather than copied."""
    from accelerate import Accelerator

    Accelerator._clip_grad_norm_dtensor_aware(None, parameters, max_norm)


def _named_failure(step: _Step, batch: dict[str, Any], layout: str, what: str) -> None:
    """Run `step`; a failure names the module whose forward (or backward) started last, where the
    failing op ran (the tracker's own `parents` are already unwound when the exception arrives)."""
    from torch.distributed._tools.mod_tracker import ModTracker

    tracker = ModTracker()
    last = ["", "forward"]

    def entered(phase: str) -> Any:
        def hook(module: Any, _: Any) -> None:
            if module is not None:
                name = tracker.get_known_fqn(module) or type(module).__name__
                last[:] = [name.split(".", 1)[-1], phase]  # without the root class
        return hook

    tracker.register_user_hooks(pre_fw_hook=entered("forward"), pre_bw_hook=entered("backward"))
    try:
        with tracker:
            step(batch)
    except (RuntimeError, ValueError, AssertionError, IndexError, TypeError) as exc:
        where = f"in {last[0]} ({last[1]})" if last[0] else "outside any module"
        if step.where is not None:  # after the backward: clipping or the optimizer, not a module
            where = f"in {step.where}"
        raise DryRunFailed(f"dry run ({layout}): the {what} fails at full size {where}: "
                           f"{_first_line(exc)}") from None
    finally:
        tracker.clear_user_hooks()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
