"""Pipeline parallelism: stages cut from the plug-in contract, run by torch.distributed.pipelining.

A stage is the architecture's own model (`build()`) with only some of its parameters: stage k
keeps the blocks `split[k]` (`blocks()`), the first stage also the input embeddings and every
other parameter outside the blocks and the output modules (position embeddings, ...), the last
stage the final norm + head (`output_modules()`) and the loss. Everything else is pruned: the
blocks of other stages leave the block container, other parameters become zero buffers (an
expanded scalar, no memory, not saved). Parameter names stay the model's own, so checkpoints
(DCP, one key per tensor) load into any pp, and seeded initialisation draws the same values.

Running a stage runs the model's own forward: a hook on the stage's first block swaps its input
for the received activation (what the pruned embeddings computed is discarded), a hook on its
last block ends the forward with that block's output. Every micro-batch carries its
`input_ids`, `position_ids` and `labels` to every stage, so document masking (positions
restart at each packed document) is rebuilt identically on each one.

Schedules (`parallel.pp_schedule`): GPipe, 1F1B (one stage per rank) and Interleaved 1F1B
(`validation.rules.virtual_stages_per_rank`: two virtual stages per rank, stage k on rank k % pp).
The schedule is only how a step's forward and backward run (`PipelineSchedule`, the layout's
`ForwardBackward`): the step itself -- stop and out-of-memory consensus, clipping, non-finite
skip, scheduler, deferred reads -- is trainer/step.py's, the same for every layout; the stages
are the rank's model parts (`Stages`, trainer/model_parts.py). Micro-batches are the spec's
accumulation steps; the loss is the same token-weighted sum as trainer/step.py. A tied embedding / LM head
(first and last stage) keeps one copy on each; their gradients are summed across the two
ranks, so both stay equal. Over dp, gradients are summed explicitly (DDP's arithmetic), or,
with `parallel.fsdp`, each stage is FSDP-sharded over its replicas and reduce-scattered after
its last micro-batch (torch.distributed.pipelining drives FSDP's gradient sync).

Rank placement (trainer/parallel.py `ParallelDims`, which also builds the (pp, dp, tp) mesh and the
stages' groups): the stage is the outermost axis and TP the
innermost, rank = (stage rank * dp + dp index) * tp + tp rank. Launchers number ranks node by
node, so a TP group stays inside a node and, with one stage's ranks per node, the stages go
across nodes. With `parallel.tp`, each stage's blocks follow the architecture's TP plan (the
activations between stages stay whole: a block's output is replicated over its TP group).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from basics.errors import TrainingError
from trainer.activation_checkpointing import checkpoint_forward
from trainer.parallel import (
    apply_tp_plan,
    check_compiler,
    local_and_total_params,
    mixed_precision_policy,
    tied_model,
)
from validation.plan.memory import checkpointed_blocks
from validation.rules import virtual_stages_per_rank

if TYPE_CHECKING:
    import torch

    from trainer.parallel import ParallelDims
    from validation.spec import ExperimentSpec

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


def stage_split(num_layers: int, stages: int, explicit: list[int] | None = None) -> list[list[int]]:
    """Block indices of each stage: `explicit` sizes, or equal parts."""
    sizes = list(explicit) if explicit else [num_layers // stages] * stages
    if len(sizes) != stages or sum(sizes) != num_layers or min(sizes) < 1:
        raise TrainingError(f"pipeline split {sizes} does not cut {num_layers} layers into {stages} stages")
    out, start = [], 0
    for n in sizes:
        out.append(list(range(start, start + n)))
        start += n
    return out


class _StageOutput(Exception):  # noqa: N818 - control flow, not an error
    def __init__(self, hidden: torch.Tensor):
        self.hidden = hidden


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, tuple | list) else value


def _owner(module: Any, root: Any) -> str:
    for name, m in root.named_modules():
        if m is module:
            return name
    raise TrainingError(f"module {type(module).__name__} is not inside the model")


def _block_container(arch: Any, model: Any) -> tuple[Any, list[str]]:
    """The container whose children are exactly the blocks, in order (ModuleList)."""
    import torch

    blocks = arch.blocks(model)
    names = [_owner(b, model) for b in blocks]
    parent = names[0].rsplit(".", 1)[0] if "." in names[0] else ""
    container = model.get_submodule(parent) if parent else model
    if not isinstance(container, torch.nn.ModuleList) or list(container) != blocks:
        raise TrainingError(f"models/{arch.model_type}.py: blocks() are not the children of one ModuleList "
                            "in order; this architecture cannot be cut into pipeline stages")
    return container, names


@dataclass
class StageLayout:
    """Which rank runs which stage, and where each parameter lives."""

    pp: int
    virtual: int
    split: list[list[int]]
    pp_rank: int

    @property
    def num_stages(self) -> int:
        return self.pp * self.virtual

    def my_stages(self) -> list[int]:
        return [self.pp_rank + v * self.pp for v in range(self.virtual)]

    def stage_of_rank(self, stage: int) -> int:
        return stage % self.pp


def _classify(arch: Any, model: Any, layout: StageLayout) -> dict[str, int]:
    """Module name -> the stage that owns its own (non-recursive) parameters."""
    _, block_names = _block_container(arch, model)
    outputs = [_owner(m, model) for m in arch.output_modules(model)]
    block_stage = {}
    for stage, indices in enumerate(layout.split):
        for i in indices:
            block_stage[block_names[i]] = stage
    owner: dict[str, int] = {}
    for name, _ in model.named_modules():
        stage = 0
        for prefix, s in block_stage.items():
            if name == prefix or name.startswith(prefix + "."):
                stage = s
        for prefix in outputs:
            if name == prefix or name.startswith(prefix + "."):
                stage = layout.num_stages - 1
        owner[name] = stage
    return owner


def _prune(arch: Any, model: Any, layout: StageLayout, keep: set[int]) -> None:
    """Leave in `model` the parameters of the stages `keep` only (others: zero buffers)."""
    import torch

    owner = _classify(arch, model, layout)
    for name, module in list(model.named_modules()):
        if owner[name] in keep:
            continue
        for pname, param in list(module._parameters.items()):
            if param is None:
                continue
            del module._parameters[pname]
            module.register_buffer(pname, torch.zeros((), dtype=param.dtype).expand(param.shape), persistent=False)


def build_stage(arch: Any, layout: StageLayout, stage: int, holder: Any, checkpointing: str = "none",
                compile_backend: str | None = None) -> Any:
    """A model shell running stage `stage`, sharing the holder's parameters; its blocks among
    those `train.activation_checkpointing` names (of the whole model) recompute in backward, and
    each block's forward is compiled with `compile_backend` (`train.compile`: inductor)."""
    from accelerate import init_empty_weights


    with init_empty_weights(include_buffers=False):
        shell: Any = arch.build()
    container, _ = _block_container(arch, shell)
    owned = layout.split[stage]
    # The block's forward is wrapped (inside its hooks): the stage's input swap and stop run
    # outside the recomputed region. `full` the same way, not through the architecture's own
    # switch, whose recomputation would replay the hooks too.
    for index in set(owned) & set(checkpointed_blocks(len(container), checkpointing)):
        checkpoint_forward(container[index])
    if compile_backend:  # torchtitan's order: AC, then compile (TP and FSDP come after, in `_shard`)
        import torch

        check_compiler(compile_backend)
        for index in owned:  # the forward only: the stage's hooks stay outside the graph
            block = container[index]
            block.forward = torch.compile(block.forward, backend=compile_backend)
    first_block, last_block = container[owned[0]], container[owned[-1]]
    _prune(arch, shell, layout, {stage})
    holder_params = dict(holder.named_parameters(remove_duplicate=False))
    for name, module in shell.named_modules():
        for pname, param in list(module._parameters.items()):
            if param is not None:
                module._parameters[pname] = holder_params[f"{name}.{pname}" if name else pname]
    # Only this stage's blocks stay in the container, under their own indices (names unchanged).
    kept = {str(i): container[i] for i in owned}
    container._modules.clear()
    container._modules.update(kept)
    is_first, is_last = stage == 0, stage == layout.num_stages - 1
    if not is_first:
        def swap_input(module: Any, args: tuple, kwargs: dict) -> Any:
            received = shell._pp_received
            if args:
                return (received, *args[1:]), kwargs
            key = next(iter(kwargs))
            return args, {**kwargs, key: received}
        first_block.register_forward_pre_hook(swap_input, with_kwargs=True)
    if not is_last:
        def stop(module: Any, args: tuple, output: Any) -> None:
            raise _StageOutput(_first(output))
        last_block.register_forward_hook(stop)
    return _stage_module(shell, is_first, is_last)


def _stage_module(shell: Any, is_first: bool, is_last: bool) -> Any:
    import torch

    class Stage(torch.nn.Module):
        """forward(x, ids, position_ids, labels): x is input_ids on the first stage, else the
        received activation; returns the activation, or (last) the summed token loss as [1]."""

        def __init__(self) -> None:
            super().__init__()
            self.shell = shell

        def forward(self, x: torch.Tensor, ids: torch.Tensor, position_ids: torch.Tensor,
                    labels: torch.Tensor) -> torch.Tensor:
            if not is_first:
                shell._pp_received = x
            try:
                out = shell(input_ids=ids, position_ids=position_ids, labels=labels if is_last else None,
                            use_cache=False)
            except _StageOutput as done:
                return done.hidden
            finally:
                shell._pp_received = None
            n = (labels[:, 1:] != -100).sum()
            if int(n) == 0:
                return (out.logits.sum() * 0.0).reshape(1)
            return (out.loss.float() * n).reshape(1)

    return Stage()


def build_holder(spec: ExperimentSpec, layout: StageLayout, device: torch.device, seed: int,
                 materialize: Callable[[], Any] = contextlib.nullcontext) -> Any:
    """The full model's structure holding this rank's parameters only (names unchanged), seeded
    exactly as the one-process model (every draw made, only the owned ones kept). The parameters
    are allocated and drawn inside `materialize()` (trainer/dry_run.py: fake tensors); the
    structure is made on the meta device before."""
    import torch
    from accelerate import init_empty_weights

    arch = spec.model
    if spec.model.init_from:
        raise TrainingError("model.init_from with parallel.pp > 1 is not supported yet; set pp: 1")
    with init_empty_weights(include_buffers=False):
        full: Any = arch.build()
        holder: Any = arch.build()
    full = tied_model(arch, full)  # outside init_empty_weights, which would re-register a fresh parameter
    _prune(arch, holder, layout, set(layout.my_stages()))
    # Untie: each module gets its own parameter object (a tied head on the last stage).
    seen: set[int] = set()
    for _, module in holder.named_modules():
        for pname, param in list(module._parameters.items()):
            if param is not None:
                if id(param) in seen:
                    module._parameters[pname] = torch.nn.Parameter(torch.empty_like(param, device="meta"))
                seen.add(id(param))
    aliases: dict[int, list[str]] = {}
    for name, param in full.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    with materialize():
        _draw(arch, full, holder, aliases, device, seed)
    return holder


def _draw(arch: Any, full: Any, holder: Any, aliases: dict[int, list[str]], device: torch.device, seed: int) -> None:
    """Allocate the holder's parameters on `device` and draw every parameter of the full model in
    order, keeping the holder's."""
    import torch

    holder.to_empty(device=device)
    mine = dict(holder.named_parameters(remove_duplicate=False))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in full.named_parameters():
            value = arch.init_parameter(full, name, param.shape, gen)
            for alias in aliases[id(param)]:
                if alias in mine:
                    mine[alias].copy_(value)


def tied_groups(arch: Any) -> list[list[str]]:
    """The names of each tensor the built model holds under more than one name (a tied input
    embedding and LM head), the first as the model lists it (the embedding)."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        full: Any = arch.build()
    groups: dict[int, list[str]] = {}
    for name, param in tied_model(arch, full).named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def tied_names(spec: ExperimentSpec, holder: Any) -> list[str]:
    """This rank's parameters that are one tensor with another stage's (tied embedding / head)."""
    mine = dict(holder.named_parameters())
    return [n for names in tied_groups(spec.model) for n in names if n in mine]


class PipelineEngine:
    """One rank's stages and their schedule, on the mesh and groups of `ParallelDims`; the step
    itself is trainer/step.py's (`PipelineSchedule` is how its forward and backward run)."""

    def __init__(self, spec: ExperimentSpec, dims: ParallelDims, device: torch.device, seed: int,
                 compile_backend: str | None = None, materialize: Callable[[], Any] = contextlib.nullcontext):
        """`materialize`: the context the parameters are allocated and drawn in (`build_holder`)."""
        layout = spec.parallel_layout()
        self.dims = dims
        self.pp, self.tp, self.dp, self.schedule_name = dims.pp, dims.tp, dims.dp, layout.pp_schedule
        self.rank, self.world, self.device = dims.rank, dims.world, device
        self.pp_rank, self.dp_rank, self.tp_rank = dims.pp_rank, dims.dp_rank, dims.tp_rank
        virtual = virtual_stages_per_rank(self.schedule_name)
        split = stage_split(spec.model.num_layers, self.pp * virtual, layout.pp_split)
        self.layout = StageLayout(self.pp, virtual, split, self.pp_rank)
        self.spec = spec
        dims.build(device.type)  # the mesh and the groups (a no-op when the trainer built them)
        self.pp_group, self.dp_group, self.ends_group = dims.pp_group, dims.dp_group, dims.ends_group
        self.holder = build_holder(spec, self.layout, device, seed, materialize)
        self.tied = tied_names(spec, self.holder)
        self.stages = [build_stage(spec.model, self.layout, s, self.holder, spec.train.activation_checkpointing,
                                   compile_backend) for s in self.layout.my_stages()]
        # TP goes with FSDP over the replicas (`ParallelDims.from_layout`: all parameters DTensors,
        # one optimizer kernel; over one replica a no-op shard).
        self.fsdp = dims.fsdp
        if self.fsdp:
            self._shard(spec)
        self.schedule: Any = None
        self.schedule_shape = (0, 0)
        self.global_tokens = 1.0

    def _shard(self, spec: ExperimentSpec) -> None:
        """TP inside each stage, then FSDP over each stage's replicas (torchtitan's order; PP x TP x
        FSDP): the stage's blocks get the architecture's TP plan on the `tp` axis of the (pp, dp, tp)
        mesh (`ParallelDims`); with FSDP every block is a unit and the stage (embeddings, norm, head)
        the root, on the `dp` axis. FSDP averages the gradients over the replicas, so each replica's loss is
        scaled by dp (`step`): the same sum as DDP's (a divide factor of 1 would need gloo's
        missing PREMUL_SUM). The holder then names the sharded parameters (DTensors)."""
        from torch.distributed.fsdp import fully_shard

        mesh = self.dims.mesh
        for stage in self.stages:
            if self.tp > 1:
                apply_tp_plan(spec.model, stage.shell, mesh["tp"])
            kw: dict[str, Any] = {"mesh": mesh["dp"], "mp_policy": mixed_precision_policy(
                spec.train.precision, spec.parallel_layout().reduce_dtype)}
            container, _ = _block_container(spec.model, stage.shell)
            for block in container.children():
                fully_shard(block, **kw)
            fully_shard(stage, **kw)
        modules = dict(self.holder.named_modules())
        for stage in self.stages:
            for name, module in stage.shell.named_modules():
                for pname, param in module._parameters.items():
                    if param is not None:
                        modules[name]._parameters[pname] = param

    def global_rank(self, pp_rank: int) -> int:
        """The process of stage rank `pp_rank` in this rank's replica and TP rank."""
        return self.dims.global_rank(pp_rank)

    def make_schedule(self, micro: int, accum: int) -> Any:
        """This rank's stages under the spec's schedule for `accum` micro-batches of `micro` rows."""
        import torch
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
        )

        seq, hidden = self.spec.data.seq_len, self.spec.model.hidden_size
        stages = []
        for stage_index, module in zip(self.layout.my_stages(), self.stages, strict=True):
            first, last = stage_index == 0, stage_index == self.layout.num_stages - 1
            # Metadata given up front (no shape inference); activations carry gradients.
            act = torch.empty(micro, seq, hidden, device="meta", requires_grad=True)
            inp = torch.empty(micro, seq, dtype=torch.long, device="meta") if first else act
            out = torch.empty(1, device="meta", requires_grad=True) if last else act
            stages.append(PipelineStage(module, stage_index, self.layout.num_stages, self.device,
                                        input_args=(inp,), output_args=(out,), group=self.pp_group))

        def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return output.sum() / self.global_tokens  # summed over dp (FSDP: its average undone, see step)

        kw: dict[str, Any] = {"n_microbatches": accum, "loss_fn": loss_fn, "scale_grads": False}
        if self.schedule_name == "interleaved_1f1b":
            return ScheduleInterleaved1F1B(stages, **kw)
        return (ScheduleGPipe if self.schedule_name == "gpipe" else Schedule1F1B)(stages[0], **kw)

    def _sync_grads(self) -> None:
        import torch
        import torch.distributed as dist

        named = dict(self.holder.named_parameters())
        if self.tied and self.pp > 1:  # under FSDP both ends hold the same shard of the tied tensor
            for name in sorted(self.tied):
                p = named[name]
                grad = p.grad if p.grad is not None else torch.zeros_like(p)
                dist.all_reduce(_local(grad), group=self.ends_group)
                p.grad = grad
        if self.dp > 1 and not self.fsdp:  # FSDP reduce-scattered them in the schedule's last backward
            for p in self.holder.parameters():
                grad = p.grad if p.grad is not None else torch.zeros_like(p)
                dist.all_reduce(_local(grad), group=self.dp_group)
                p.grad = grad

    def eval_forward(self, ids: torch.Tensor, position_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The mean loss of one batch, forward only (point-to-point), the same on every pp rank."""
        import torch
        import torch.distributed as dist

        hidden = self.spec.model.hidden_size
        result = torch.zeros(1, device=self.device)
        x: torch.Tensor = ids
        n = (labels[:, 1:] != -100).sum().clamp(min=1)
        for stage in range(self.layout.num_stages):
            if self.layout.stage_of_rank(stage) != self.pp_rank:
                continue
            module = self.stages[stage // self.pp]
            if stage > 0:
                x = torch.empty(ids.shape[0], ids.shape[1], hidden, device=self.device)
                dist.recv(x, src=self.global_rank(self.layout.stage_of_rank(stage - 1)))
            out = module(x, ids, position_ids, labels)
            if stage == self.layout.num_stages - 1:
                result = (out.float() / n).reshape(1)
            else:
                dist.send(out.float().contiguous(), dst=self.global_rank(self.layout.stage_of_rank(stage + 1)))
        dist.broadcast(result, src=self.global_rank(self.layout.stage_of_rank(self.layout.num_stages - 1)),
                       group=self.pp_group)
        return result[0]


def _tp_split(param: Any) -> bool:
    """Split over the TP ranks (each holds its own part): a DTensor sharded on the `tp` axis."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(param, DTensor):
        return False
    names = param.device_mesh.mesh_dim_names or ()
    return any(isinstance(pl, Shard) and name == "tp" for name, pl in zip(names, param.placements, strict=False))


def _local(tensor: Any) -> Any:
    """This rank's part of a DTensor (an FSDP shard), or the tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class EvalModel:
    """What trainer/evaluation.py calls: `model(**batch).loss`, `.eval()`, `.train()`."""

    def __init__(self, engine: PipelineEngine):
        self.engine = engine

    def __call__(self, input_ids: Any, labels: Any, position_ids: Any, **_: Any) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(loss=self.engine.eval_forward(input_ids, position_ids, labels))

    def eval(self) -> None:
        for s in self.engine.stages:
            s.eval()

    def train(self) -> None:
        for s in self.engine.stages:
            s.train()


class PipelineSchedule:
    """trainer/step.py's `ForwardBackward` for pipeline stages: every micro-batch's forward and
    backward run by the schedule; the gradients of a tied embedding / LM head summed across the
    two ends and, over DDP replicas, across the replicas; the norm de-duplicated over TP and the
    tied copy. The step around it (consensus, clipping, skip, scheduler) is the one step."""

    def __init__(self, engine: PipelineEngine, comm: Any, autocast: Any):
        self.engine, self.comm, self.autocast = engine, comm, autocast
        self.loss_divisor = 1  # the last stage's shares are divided by their duplicates already

    def global_tokens(self, total: float) -> float:
        e = self.engine
        # Every stage and TP rank of a replica counted its rows; FSDP averages over dp.
        e.global_tokens = max(total / (e.pp * e.tp), 1.0) / (e.dp if e.fsdp else 1)
        return e.global_tokens

    def run(self, s: int, batches: list[dict[str, Any]], counts: list[int], global_tokens: float) -> list[Any]:
        import numpy as np
        import torch

        e = self.engine
        shape = (len(batches[0]["input_ids"]), len(batches))
        if e.schedule is None or e.schedule_shape != shape:  # a new micro batch (out-of-memory fallback)
            e.schedule, e.schedule_shape = e.make_schedule(*shape), shape
        cat = {k: torch.from_numpy(np.concatenate([b[k] for b in batches])).to(e.device)
               for k in ("input_ids", "labels", "position_ids")}
        kwargs = {"ids": cat["input_ids"], "position_ids": cat["position_ids"], "labels": cat["labels"]}
        losses: list[torch.Tensor] = []
        args = (cat["input_ids"],) if e.pp_rank == 0 else ()
        with self.autocast():
            e.schedule.step(*args, target=cat["labels"], losses=losses, return_outputs=False, **kwargs)
        return losses

    def _duplicates(self) -> int:
        """The last stage's TP ranks hold the same loss; FSDP's scaling undone."""
        e = self.engine
        return (e.dp if e.fsdp else 1) * e.tp

    def loss_share(self, contributions: list[Any], host: bool) -> Any:
        import torch

        if host:
            return (float(sum(float(x.detach()) for x in contributions)) / self._duplicates()
                    if contributions else 0.0)
        if not contributions:
            return torch.zeros((), device=self.engine.device)
        return torch.stack([x.detach().float().reshape(()) for x in contributions]).sum() / self._duplicates()

    def discard(self) -> None:
        """Nothing is pending: the schedule ran every backward."""

    def finish_backward(self) -> None:
        self.engine._sync_grads()

    def clip(self, max_norm: float, host: bool) -> Any:
        import torch
        import torch.distributed as dist

        e = self.engine
        params = [p for p in e.holder.parameters() if p.grad is not None]
        tied = {id(p) for n, p in e.holder.named_parameters() if n in e.tied}
        counted = [p for p in params if not (id(p) in tied and e.pp_rank != 0)]
        if host:
            # A tensor whole on every TP rank is counted by each: once per TP group.
            sq = float(sum(float(_local(p.grad).detach().float().pow(2).sum()) / (1 if _tp_split(p) else e.tp)
                           for p in counted))
            (sq_total,) = self.comm.all_reduce([sq])
            # Replicated over dp (each replica counted it), or FSDP shards (each counted once).
            grad_norm = math.sqrt(sq_total / (1 if e.fsdp else e.dp))
            coef = min(1.0, max_norm / (grad_norm + 1e-6))
            if coef < 1.0:
                for p in params:
                    p.grad.detach().mul_(coef)
            return grad_norm
        # The same sums on the device (no host read): one all-reduce of the squared norm.
        sq_t = torch.zeros((), dtype=torch.float32, device=e.device)
        for p in counted:
            sq_t += _local(p.grad).detach().float().pow(2).sum() / (1 if _tp_split(p) else e.tp)
        if e.world > 1:
            dist.all_reduce(sq_t)
        norm = (sq_t / (1 if e.fsdp else e.dp)).sqrt()
        coef_t = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for p in params:
            p.grad.detach().mul_(coef_t)
        return norm


class Stages:
    """The model parts of a pipeline rank (trainer/model_parts.py): one part per stage it runs.

    `owner` is the holder, this rank's parameters under the model's own names (what the
    optimizer, the checkpoint and the export read); a tied LM head on the last stage is its own
    tensor, keyed in checkpoints by the embedding's name (`tied_aliases`)."""

    staged = True

    def __init__(self, engine: PipelineEngine):
        self.engine = engine
        self.parts: list[Any] = list(engine.stages)
        self.owner: Any = engine.holder
        arch = engine.spec.model
        self.tied_aliases: dict[str, str] = ({alias: names[0] for names in tied_groups(arch) for alias in names[1:]}
                                             if arch.tie_word_embeddings else {})

    def prepare(self, accelerator: Any, optimizer: Any) -> Any:
        """Nothing to wrap: the stages are sharded already (`PipelineEngine`)."""
        return optimizer

    def forward_backward(self, accelerator: Any, comm: Any, faults: Any) -> PipelineSchedule:
        return PipelineSchedule(self.engine, comm, accelerator.autocast)

    def eval_model(self) -> EvalModel:
        return EvalModel(self.engine)

    def parameter_count(self, comm: Any) -> int:
        """The whole model's parameters, counted on the stages: each rank's (a tied head's copy
        not twice), summed over the stages (every replica and TP rank holds the same counts)."""
        local = sum(p.numel() for n, p in self.owner.named_parameters() if n not in self.tied_aliases)
        (total,) = comm.all_reduce([float(local)])
        return int(total) // (self.engine.dp * self.engine.tp)

    def local_params(self, dims: Any) -> int:
        return local_and_total_params(self.owner)[0]  # this rank's stages (FSDP: their shards)
