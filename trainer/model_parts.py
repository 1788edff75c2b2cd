"""The model as this rank holds it: a list of parts (torchtitan's `model_parts`).

One process, DDP, FSDP and TP hold one part, the whole model (`OneModel`); a pipeline rank holds
one part per stage it runs (trainer/pipeline_parallel.py `Stages`). Both answer the same
questions, so the loop, the step, evaluation, checkpoints and export never ask which layout runs:

  parts            what runs: the model (accelerate-prepared once `prepare` ran), or the stages
  owner            this rank's parameters under the model's own names (the unwrapped model, or
                   the pipeline's holder): what the optimizer, the checkpoint and the export read
  staged           the parts are pipeline stages (each rank holds some of the parameters)
  tied_aliases     a stage's own copy of a tied tensor -> the name one-model layouts key it by
  prepare          wrap for the layout (accelerate: DDP, FSDP's plugin); returns the optimizer to use
  forward_backward the layout's half of the one optimizer step (trainer/step.py `ForwardBackward`)
  eval_model       what trainer/evaluation.py calls: `model(**batch).loss`, `.eval()`, `.train()`
  parameter_count  the whole model's parameters, as built (checked against the declared count)
  local_params     this rank's share (FSDP/TP: its shards), refusing a layout that is not sharded
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trainer.collectives import Collectives
from trainer.faults import FaultPlan
from trainer.model import parameter_count
from trainer.parallel import ParallelDims, assert_sharded, build_model
from trainer.pipeline_parallel import PipelineEngine, Stages
from trainer.step import ForwardBackward, MicroBatches

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

    from validation.spec import ExperimentSpec


class ModelParts(Protocol):
    """What every layout's model answers (the module docstring lists it)."""

    parts: list[Any]
    owner: Any
    staged: bool
    tied_aliases: dict[str, str]

    def prepare(self, accelerator: Accelerator, optimizer: Any) -> Any: ...

    def forward_backward(self, accelerator: Accelerator, comm: Collectives, faults: FaultPlan) -> ForwardBackward: ...

    def eval_model(self) -> Any: ...

    def parameter_count(self, comm: Collectives) -> int: ...

    def local_params(self, dims: ParallelDims) -> int: ...


class OneModel:
    """The whole model as one part: one process, DDP replicas, FSDP or TP shards."""

    staged = False

    def __init__(self, model: torch.nn.Module, dims: ParallelDims):
        self.owner: Any = model
        self.parts: list[Any] = [model]
        self.tied_aliases: dict[str, str] = {}
        self.dp = dims.dp

    def prepare(self, accelerator: Accelerator, optimizer: Any) -> Any:
        self.parts[0], optimizer = accelerator.prepare(self.owner, optimizer)
        return optimizer

    def forward_backward(self, accelerator: Accelerator, comm: Collectives, faults: FaultPlan) -> MicroBatches:
        return MicroBatches(accelerator, self.parts[0], comm, faults, dp=self.dp)

    def eval_model(self) -> Any:
        return self.owner

    def parameter_count(self, comm: Collectives) -> int:
        return parameter_count(self.owner)

    def local_params(self, dims: ParallelDims) -> int:
        # The silent DDP fallback must be impossible: a sharded layout holds ~1/degree per rank.
        return assert_sharded(self.parts[0], dims)[0]


def build_model_parts(spec: ExperimentSpec, dims: ParallelDims, device: torch.device, seed: int,
                      init_from: Path | None = None, compile_backend: str | None = None,
                      allocate: Callable[[], Any] = contextlib.nullcontext) -> ModelParts:
    """This rank's parts of the model, seeded identically in every layout, on `dims`' mesh
    (built first: `ParallelDims.build`). Built on the meta device, then allocated and
    initialised inside `allocate()` (trainer/dry_run.py: fake tensors)."""
    if dims.pp > 1:
        return Stages(PipelineEngine(spec, dims, device, seed, compile_backend=compile_backend, materialize=allocate))
    mesh = dims.mesh if dims.sharded else None
    return OneModel(build_model(spec, dims, device, seed, init_from, mesh, compile_backend=compile_backend,
                                allocate=allocate), dims)
