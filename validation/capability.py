"""What the trainer can execute: declared once, read by `validate`, `plan`, smoke and the trainer.

A layout the trainer cannot run must be refused by `pipeline validate` on the pull request,
with the line of `parallel` and what to change, never on the GPU runner after `/train`.
`parallel: auto` plans only among layouts the capability covers.

Today the trainer runs data parallelism (DDP through accelerate), FSDP2 and tensor
parallelism (DTensor, on a 2-D mesh with FSDP), on GPUs and on CPU processes (gloo):
tests/integration/test_trainer_parallel.py runs each on two CPU ranks. Pipeline parallelism
(trainer/pipeline_parallel.py) runs with plain data parallelism, not yet with FSDP or TP
(tests/integration/test_pipeline_parallel.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from models import Architecture
from validation.spec import ParallelLayout

Axis = Literal["dp", "fsdp", "tp", "pp"]
AXES: tuple[Axis, ...] = ("dp", "fsdp", "tp", "pp")

_AXIS_NAMES: dict[Axis, str] = {
    "dp": "data parallelism",
    "fsdp": "FSDP sharding",
    "tp": "tensor parallelism",
    "pp": "pipeline parallelism",
}


@dataclass(frozen=True)
class ExecutionCapability:
    """The parallel axes the trainer executes, on GPUs and on CPU processes."""

    gpu: frozenset[Axis]
    """Axes usable when `resource.gpus_per_node > 0` (NCCL)."""
    cpu: frozenset[Axis]
    """Axes usable on CPU processes (gloo)."""
    pp_alone: bool = False
    """Pipeline stages run on trainer/pipeline_parallel.py (with DDP or FSDP replicas and TP
    inside each stage), and its schedules need enough micro-batches (validation/rules.py)."""
    plans_pp: bool = True
    """`parallel: auto` may place pipeline stages (the trainer's explicit layouts may use pp either way)."""

    def model_refusals(self, layout: ParallelLayout, model: Architecture) -> list[tuple[Axis, str]]:
        """(axis, what to change) when `layout` needs something the architecture lacks: a
        tensor-parallel plan (its file declares one, or not). How a degree divides the model is
        `validation.rules.parallel_divides_model`'s (it asks the architecture too)."""
        if layout.tp > 1 and not model.tensor_parallel_plan():
            problem = model.tp_problem(layout.tp)
            assert problem is not None
            return [("tp", problem)]
        if layout.pp > 1:
            staged = pipeline_problem(model)
            if staged:
                return [("pp", staged)]
        return []

    def axes(self, on_gpu: bool) -> frozenset[Axis]:
        return self.gpu if on_gpu else self.cpu

    def supports(self, layout: ParallelLayout, on_gpu: bool) -> bool:
        return not self.refusals(layout, on_gpu)

    def refusals(self, layout: ParallelLayout, on_gpu: bool) -> list[tuple[Axis, str]]:
        """(axis, what to change) for every axis of `layout` the trainer cannot run."""
        used: list[tuple[Axis, bool]] = [("fsdp", layout.fsdp), ("tp", layout.tp > 1), ("pp", layout.pp > 1)]
        allowed = self.axes(on_gpu)
        where = "on GPUs" if on_gpu else "on CPU processes"
        runs = ", ".join(_AXIS_NAMES[a] for a in AXES if a in allowed) or "nothing"
        fix: dict[Axis, str] = {"fsdp": "fsdp: false", "tp": "tp: 1", "pp": "pp: 1"}
        out: list[tuple[Axis, str]] = []
        for axis, active in used:
            if active and axis not in allowed:
                extra = "" if on_gpu or axis not in self.gpu else " (it runs on GPUs: set resource.gpus_per_node)"
                out.append((axis, f"{_AXIS_NAMES[axis]} is not executable {where}: the trainer runs {runs} "
                                  f"(validation/capability.py); set {fix[axis]} with dp = the world size, "
                                  f"or parallel: auto{extra}"))
        return out


def pipeline_problem(model: Architecture) -> str | None:
    """Why `model` cannot be cut into pipeline stages (trainer/pipeline_parallel.py), or None.
    A plug-in may answer itself (`pipeline_problem()`); a loss term summed over every block
    inside the model's forward (a router's auxiliary loss) cannot be split across stages, nor
    can an `init_from` checkpoint be loaded into stages yet."""
    own = getattr(model, "pipeline_problem", None)
    if callable(own):
        answer: str | None = own()
        return answer
    if float(getattr(model, "router_aux_loss_coef", 0.0) or 0.0) > 0:
        return (f"model_type {model.model_type} adds a router loss summed over all blocks inside its forward; "
                "a pipeline stage holds only its own blocks: set pp: 1")
    if model.init_from:
        return "model.init_from cannot be loaded into pipeline stages yet: set pp: 1"
    return None


TRAINER = ExecutionCapability(gpu=frozenset({"dp", "fsdp", "tp", "pp"}), cpu=frozenset({"dp", "fsdp", "tp", "pp"}),
                              pp_alone=True)
"""What `python -m trainer` executes today."""

EVERY_LAYOUT = ExecutionCapability(gpu=frozenset(AXES), cpu=frozenset({"dp"}))
"""The planner's full search space (used to study layouts the trainer does not run yet)."""
