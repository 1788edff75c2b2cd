"""Layout search: the parallel layout a run uses, verified if explicit, searched if `auto`.

A layout never changes the experiment: the global batch (rows x seq_len per optimizer step)
is the spec's (`fixed_global_batch`), and a searched layout absorbs its data-parallel degree
with the micro batch and gradient accumulation (`absorb`), or is not proposed. It may turn on
activation checkpointing (the same numbers, recomputed). The plan carries the micro batch,
accumulation and checkpointing it chose (`ParallelPlan.train_overrides()`), which the resolve
step writes into each run's spec, so the trainer runs exactly what was planned.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from basics.errors import Issue, SpecError
from validation.capability import TRAINER, ExecutionCapability
from validation.plan.common import (
    Locator,
    _describe_layout,
    _devices_per_node,
    _fmt_gb,
    _raise,
    format_bytes,
    no_location,
)
from validation.plan.memory import MemoryEstimate, _memory
from validation.rules import layout_violations
from validation.spec import ExperimentSpec, ParallelLayout
from validation.yaml_source import dotted

# How far `plan_parallel` looks for a node count that would fit, to suggest it.
MAX_SUGGESTED_NODES = 4096

# Checkpointing the auto search may add, cheapest recomputation first.
CHECKPOINTING_ORDER = ("none", "selective", "full")


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
    micro_batch_size: int = 1
    grad_accum_steps: int = 1
    activation_checkpointing: str = "none"

    @property
    def global_batch(self) -> int:
        """Rows per optimizer step: micro batch x accumulation x dp (the spec's, whatever the layout)."""
        return self.micro_batch_size * self.grad_accum_steps * self.dp

    def layout(self) -> ParallelLayout:
        """The plan as the spec's explicit layout (what the trainer should run with)."""
        return ParallelLayout(dp=self.dp, tp=self.tp, pp=self.pp, fsdp=self.fsdp)

    def train_overrides(self) -> dict[str, Any]:
        """`train.*` fields (dotted) each run's spec needs so the trainer runs this plan."""
        return {"train.micro_batch_size": self.micro_batch_size, "train.grad_accum_steps": self.grad_accum_steps,
                "train.activation_checkpointing": self.activation_checkpointing}

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
            "micro_batch_size": self.micro_batch_size,
            "grad_accum_steps": self.grad_accum_steps,
            "global_batch": self.global_batch,
            "activation_checkpointing": self.activation_checkpointing,
        }


@dataclass(frozen=True)
class Candidate:
    """One layout the search tries: degrees, how it absorbs dp, and its checkpointing."""

    dp: int
    tp: int
    pp: int
    fsdp: bool
    micro: int
    accum: int
    checkpointing: str

    def describe(self, spec: ExperimentSpec | None = None) -> str:
        """`dp=8 tp=1 pp=1 fsdp`, plus the checkpointing, plus micro x accumulation when they
        differ from `spec`'s."""
        text = _describe_layout(self.dp, self.tp, self.pp, self.fsdp)
        if self.checkpointing != "none":
            text += f" + {self.checkpointing} checkpointing"
        if spec is None or (self.micro, self.accum) != (spec.train.micro_batch_size, spec.train.grad_accum_steps):
            text += f" (micro batch {self.micro} x {self.accum} accumulated)"
        return text

    def memory(self, spec: ExperimentSpec) -> MemoryEstimate:
        return _memory(spec, self.dp, self.tp, self.pp, self.fsdp, self.micro, self.checkpointing,
                       reduce_dtype=_reduce_dtype(spec), grad_accum=self.accum)


def _reduce_dtype(spec: ExperimentSpec) -> str:
    return spec.parallel.reduce_dtype if isinstance(spec.parallel, ParallelLayout) else "fp32"


def plan_parallel(
    spec: ExperimentSpec, *, locate: Locator = no_location, capability: ExecutionCapability = TRAINER
) -> ParallelPlan:
    """The layout to train with: verified if explicit, searched if `parallel: auto`.

    Only layouts `capability` covers are searched or accepted (by default what the
    trainer executes today, `validation.capability.TRAINER`).

    Auto search order (what the field runs): fewest pipeline stages; then tensor parallelism
    only when needed (tp 1 first; across nodes the whole node's width first, so TP's
    all-reduces stay inside a node and FSDP crosses nodes with 1/tp of the parameters; inside
    one node the smallest degree first); for each, plain DP, then FSDP, then FSDP with
    selective, then full activation checkpointing (never weaker than the spec's). Each
    candidate keeps the spec's global batch (`absorb`). The first that fits in memory wins.
    On CPU (`gpus_per_node: 0`) only DP (and FSDP where the trainer runs it) over
    `cpu_processes` per node is considered.
    """
    if isinstance(spec.parallel, ParallelLayout):
        return _verify_explicit(spec, spec.parallel, locate, capability)
    return _search_auto(spec, locate, capability)


def fixed_global_batch(spec: ExperimentSpec) -> int:
    """Rows per optimizer step the spec trains with, whatever the layout: `train.global_batch_size`
    when given, else micro batch x accumulation x the dp of `spec.parallel_layout()` (for
    `parallel: auto`, plain data parallelism over every process)."""
    wanted = spec.train.global_batch_size
    return wanted if wanted is not None else spec.global_batch(spec.parallel_layout().dp)


def absorb(spec: ExperimentSpec, dp: int) -> tuple[int, int] | None:
    """(micro batch, accumulation) giving the spec's global batch over `dp` replicas: the largest
    micro batch up to `train.micro_batch_size` dividing the rows of one replica; None when dp
    does not divide the global batch (the layout would change the experiment) or the micro batch
    would fall below `train.min_micro_batch_size`."""
    rows, remainder = divmod(fixed_global_batch(spec), dp)
    if remainder or rows < 1:
        return None
    micro = max(m for m in range(1, min(rows, spec.train.micro_batch_size) + 1) if rows % m == 0)
    if micro < spec.train.min_micro_batch_size:
        return None  # below the floor the spec allows (`train.min_micro_batch_size`)
    return micro, rows // micro


def _checkpointing_options(spec: ExperimentSpec) -> tuple[str, ...]:
    """The spec's checkpointing and the stronger ones after it."""
    return CHECKPOINTING_ORDER[CHECKPOINTING_ORDER.index(spec.train.activation_checkpointing):]


def _candidates(
    spec: ExperimentSpec, nodes: int, capability: ExecutionCapability
) -> Iterator[tuple[int, int, int, bool]]:
    """(dp, tp, pp, fsdp) honouring the divisibility rules and `capability`, most preferred first."""
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
    split = [t for t in range(2, gpn + 1) if gpn % t == 0 and spec.model.tp_problem(t) is None]
    tps = [1] + (sorted(split, reverse=True) if nodes > 1 else split) if "tp" in axes else [1]
    # Pipeline stages are tried after every layout without them, fewest first (the trainer's
    # ranks put them outermost: across nodes once there is a stage per node).
    pps = [p for p in range(1, layers + 1) if layers % p == 0] if "pp" in axes and capability.plans_pp else [1]
    for pp in pps:
        for tp in tps:
            if world % (tp * pp):
                continue
            dp = world // (tp * pp)
            # tp > 1 over several replicas is always sharded by the trainer (Topology.from_layout).
            if not (tp > 1 and dp > 1 and "fsdp" in axes):
                yield (dp, tp, pp, False)
            if dp > 1 and "fsdp" in axes:
                yield (dp, tp, pp, True)


def _searched(
    spec: ExperimentSpec, nodes: int, capability: ExecutionCapability, *, honour_global_batch: bool = True,
    micro_batch: int | None = None,
) -> Iterator[Candidate]:
    """Layouts in search order, each with its micro batch, accumulation and checkpointing.

    `honour_global_batch=False` (suggestions for other node counts) keeps the spec's micro batch
    (or `micro_batch`) and accumulation instead."""
    for dp, tp, pp, fsdp in _candidates(spec, nodes, capability):
        if honour_global_batch:
            found = absorb(spec, dp)
            if found is None:
                continue
            micro, accum = found
            if pp > 1 and accum < pp:  # 1F1B needs a micro-batch per stage in flight
                continue
        else:
            micro, accum = micro_batch or spec.train.micro_batch_size, spec.train.grad_accum_steps
        # Plain DP tries checkpointing only when FSDP is not available to shard it instead.
        options = _checkpointing_options(spec)
        if not fsdp and dp > 1 and "fsdp" in capability.axes(on_gpu=spec.resource.gpus_per_node > 0):
            options = options[:1]
        for mode in options:
            yield Candidate(dp, tp, pp, fsdp, micro, accum, mode)


def _first_fit(
    spec: ExperimentSpec,
    nodes: int,
    micro_batch: int,
    capability: ExecutionCapability,
    *,
    honour_global_batch: bool = True,
) -> Candidate | None:
    for candidate in _searched(spec, nodes, capability, honour_global_batch=honour_global_batch,
                                 micro_batch=micro_batch):
        if candidate.memory(spec).fits:
            return candidate
    return None


def _plan(spec: ExperimentSpec, c: Candidate, memory: MemoryEstimate, chosen_by: Literal["auto", "explicit"],
          rejected: tuple[str, ...] = ()) -> ParallelPlan:
    resource = spec.resource
    return ParallelPlan(
        dp=c.dp, tp=c.tp, pp=c.pp, fsdp=c.fsdp, world_size=resource.world_size,
        devices_per_node=_devices_per_node(resource), on_gpu=resource.gpus_per_node > 0, chosen_by=chosen_by,
        memory=memory, rejected=rejected, micro_batch_size=c.micro, grad_accum_steps=c.accum,
        activation_checkpointing=c.checkpointing,
    )


def _search_auto(spec: ExperimentSpec, locate: Locator, capability: ExecutionCapability) -> ParallelPlan:
    resource = spec.resource
    rejected: list[str] = []
    smallest: tuple[Candidate, MemoryEstimate] | None = None
    for candidate in _searched(spec, resource.nodes, capability):
        memory = candidate.memory(spec)
        if memory.fits:
            return _plan(spec, candidate, memory, "auto", tuple(rejected))
        rejected.append(f"{candidate.describe(spec)}: {format_bytes(memory.total_bytes)}")
        if smallest is None or memory.total_bytes < smallest[1].total_bytes:
            smallest = (candidate, memory)

    if smallest is None:
        # Every divisibility-valid layout would change the global batch.
        _raise(
            locate,
            "train.global_batch_size",
            f"no parallel layout over {resource.world_size} devices keeps the global batch of "
            f"{fixed_global_batch(spec)} rows (its data-parallel degree must divide it); "
            "adjust the batch or the devices",
        )
    candidate, memory = smallest
    message = (
        f"no parallel layout fits {resource.world_size} x {_fmt_gb(resource.gpu_memory_gb)}: the smallest, "
        f"{candidate.describe(spec)}, needs {format_bytes(memory.total_bytes)} per device "
        f"({_breakdown(memory)}); {_what_to_change(spec, capability)}"
    )
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
    resource = spec.resource
    dp, tp, pp = layout.dp, layout.tp, layout.pp
    violations = layout_violations(spec, capability)
    if violations:
        issues = []
        for violation in violations:
            field_path = dotted(violation.path)
            file, line, col = locate(field_path)
            issues.append(Issue(file=file, line=line, col=col, field=field_path, message=violation.message))
        raise SpecError(issues)

    given = Candidate(dp, tp, pp, layout.fsdp, spec.train.micro_batch_size, spec.train.grad_accum_steps,
                      spec.train.activation_checkpointing)
    memory = _memory(spec, dp, tp, pp, layout.fsdp, given.micro, given.checkpointing,
                     reduce_dtype=layout.reduce_dtype)
    if not memory.fits:
        found = _first_fit(spec, resource.nodes, spec.train.micro_batch_size, capability)
        if found:
            hint = f"; {found.describe(spec)} fits (or set parallel: auto)"
        else:
            hint = "; " + _what_to_change(spec, capability)
        _raise(
            locate,
            "resource.gpu_memory_gb",
            f"layout {_describe_layout(dp, tp, pp, layout.fsdp)} needs {format_bytes(memory.total_bytes)} "
            f"per device ({_breakdown(memory)}) but a device has {_fmt_gb(resource.gpu_memory_gb)}{hint}",
        )
    return _plan(spec, given, memory, "explicit")


def _breakdown(memory: MemoryEstimate) -> str:
    states = memory.weights_bytes + memory.gradients_bytes + memory.optimizer_bytes
    return (
        f"states {format_bytes(states)}, wrapper {format_bytes(memory.wrapper_bytes)}, "
        f"activations {format_bytes(memory.activations_bytes)}, "
        f"logits {format_bytes(memory.logits_bytes)}, overhead {format_bytes(memory.overhead_bytes)}"
    )
