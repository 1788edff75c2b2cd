"""The plan of one spec: layout, memory, compute and tier together."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from validation.capability import TRAINER, ExecutionCapability
from validation.eval_tasks import task_name
from validation.plan.common import Locator, format_duration, no_location
from validation.plan.compute import ComputeEstimate, RunCost, estimate_compute
from validation.plan.cpu_speed import MeasuredCpu
from validation.plan.layout import ParallelPlan, plan_parallel
from validation.plan.memory import LOW_HEADROOM_PCT, MemoryEstimate
from validation.plan.tier import Tier, approval_tier
from validation.spec import ExperimentSpec, ResourceSpec


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
    active_parameters: int = 0
    """Parameters one token passes through (equal to `parameters` for a dense model)."""
    cost: RunCost | None = None
    """Every run the plan trains (all seeds, the baseline's): what `tier` judges."""

    @property
    def memory(self) -> MemoryEstimate:
        return self.parallel.memory

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (plain str/int/float/bool/list/dict)."""
        return {
            "experiment": self.experiment,
            "spec_hash": self.spec_hash,
            "parameters": self.parameters,
            "active_parameters": self.active_parameters,
            "parallel": self.parallel.to_dict(),
            "memory": self.memory.to_dict(),
            "compute": self.compute.to_dict(),
            "tier": self.tier.to_dict(),
            "cost": self.cost.to_dict() if self.cost is not None else None,
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


def make_plan(
    spec: ExperimentSpec,
    *,
    locate: Locator = no_location,
    capability: ExecutionCapability = TRAINER,
    baseline: ExperimentSpec | None = None,
    measured_cpu: Sequence[MeasuredCpu] = (),
) -> Plan:
    """Layout, memory, compute and tier for one spec; raises `SpecError` if no layout fits.

    `compute` is one run; `cost` and `tier` count every run the plan trains: `hypothesis.seeds`
    runs, and `baseline` (the spec of `hypothesis.baseline` when it is another experiment) on
    the same seeds. Without it a named baseline is not priced and the cost says so.
    `measured_cpu`: this machine's speed on the specs' shapes (`validation.plan.cpu_speed`),
    pricing a CPU spec instead of the recorded utilisation (the demo, `pipeline run`, `--measure`)."""
    parallel = plan_parallel(spec, locate=locate, capability=capability)
    compute = estimate_compute(spec, parallel.layout(), locate=locate, global_batch=parallel.global_batch,
                               grad_accum_steps=parallel.grad_accum_steps, measured_cpu=measured_cpu)
    cost = run_cost(spec, compute, baseline, capability=capability, measured_cpu=measured_cpu)
    tier = approval_tier(compute, spec.resource, device_hours=cost.total_device_hours)
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
        active_parameters=spec.model.active_parameter_count(),
        cost=cost,
    )


def run_cost(spec: ExperimentSpec, compute: ComputeEstimate, baseline: ExperimentSpec | None, *,
             capability: ExecutionCapability = TRAINER, measured_cpu: Sequence[MeasuredCpu] = ()) -> RunCost:
    """Every seed of `spec` and its baseline on the same seeds (the sweep's rule,
    `pipelines.sweep.sweep_cost`, for a plain experiment)."""
    seeds, name = spec.hypothesis.seeds, spec.hypothesis.baseline
    per_base, base_runs = 0.0, 0
    if name == "champion":
        note = "champion: its attested runs are reused (nothing trained)"
    elif name == spec.name:
        note = "none (the experiment is its own baseline)"
    elif baseline is None or baseline.name != name:
        note = f"{name}: not priced (its spec was not given to the planner)"
    else:
        per_base = make_plan(baseline, capability=capability, measured_cpu=measured_cpu).compute.device_hours
        base_runs = seeds
        note = f"{name} on the same {seeds} seed(s), counted (nothing is spent when its attested runs exist)"
    return RunCost(seeds=seeds, per_run_device_hours=compute.device_hours, baseline_runs=base_runs,
                   baseline_per_run_device_hours=per_base, baseline_note=note, on_gpu=compute.on_gpu)


def downstream_budget(spec: ExperimentSpec) -> str | None:
    """One line: the tasks, their example budget and the time budget of each run's evaluation."""
    if spec.eval is None:
        return None
    tasks = ", ".join(f"{task_name(t) or t.path} ({t.limit} ex, {t.num_fewshot}-shot)" for t in spec.eval.tasks)
    return (f"{spec.eval.examples()} examples, at most {format_duration(spec.eval.time_budget_s)} per run, "
            f"rank 0 on the exported model: {tasks}")
