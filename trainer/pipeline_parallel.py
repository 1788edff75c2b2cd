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

Schedules (`parallel.pp_schedule`): GPipe, 1F1B (one stage per rank) and Interleaved 1F1B (two
virtual stages per rank, stage k on rank k % pp). Micro-batches are the spec's accumulation
steps; the loss is the same token-weighted sum as trainer/step.py. A tied embedding / LM head
(first and last stage) keeps one copy on each; their gradients are summed across the two
ranks, so both stay equal. Over dp, gradients are summed explicitly (DDP's arithmetic), or,
with `parallel.fsdp`, each stage is FSDP-sharded over its replicas and reduce-scattered after
its last micro-batch (torch.distributed.pipelining drives FSDP's gradient sync).

Rank placement (trainer/parallel.py `Topology`): the stage is the outermost axis and TP the
innermost, rank = (stage rank * dp + dp index) * tp + tp rank. Launchers number ranks node by
node, so a TP group stays inside a node and, with one stage's ranks per node, the stages go
across nodes. With `parallel.tp`, each stage's blocks follow the architecture's TP plan (the
activations between stages stay whole: a block's output is replicated over its TP group).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.state import StepResult
from validation.errors import TrainingError

if TYPE_CHECKING:
    import torch

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

    from trainer.activation_checkpointing import checkpoint_forward
    from validation.plan.memory import checkpointed_blocks

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

        from trainer.parallel import check_compiler

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


def tied_model(arch: Any, model: Any) -> Any:
    """`model` with its embedding / LM head tied as the trained model has them (trainer/parallel.py)."""
    model.to_empty(device="meta")  # as `materialize` does: to_empty, then tie
    tie = getattr(model, "tie_weights", None)
    if arch.tie_word_embeddings and tie is not None:
        tie()
    return model


def build_holder(spec: ExperimentSpec, layout: StageLayout, device: torch.device, seed: int) -> Any:
    """The full model's structure holding this rank's parameters only (names unchanged), seeded
    exactly as the one-process model (every draw made, only the owned ones kept)."""
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
    holder.to_empty(device=device)
    holder.pipeline_stages = True  # checkpoints key the optimizer's param groups per name (trainer/checkpoint/sharded.py)
    aliases: dict[int, list[str]] = {}
    for name, param in full.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    mine = dict(holder.named_parameters(remove_duplicate=False))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in full.named_parameters():
            value = arch.init_parameter(full, name, param.shape, gen)
            for alias in aliases[id(param)]:
                if alias in mine:
                    mine[alias].copy_(value)
    return holder


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
    """One rank's stages, schedule and process groups; `step` is trainer/step.py's counterpart."""

    def __init__(self, spec: ExperimentSpec, world: int, rank: int, device: torch.device, seed: int,
                 compile_backend: str | None = None):
        import torch.distributed as dist

        from trainer.parallel import Topology

        layout = spec.parallel_layout()
        # Stage outermost, TP innermost, and whether the stages are FSDP-sharded: the topology's.
        topo = Topology.from_layout(layout, world, rank)
        self.pp, self.tp, self.dp, self.schedule_name = topo.pp, topo.tp, topo.dp, layout.pp_schedule
        self.rank, self.world, self.device = rank, world, device
        self.pp_rank, self.dp_rank, self.tp_rank = topo.pp_rank, topo.dp_rank, topo.tp_rank
        virtual = 2 if self.schedule_name == "interleaved_1f1b" else 1
        split = stage_split(spec.model.num_layers, self.pp * virtual, layout.pp_split)
        self.layout = StageLayout(self.pp, virtual, split, self.pp_rank)
        self.spec = spec
        # Every rank creates every group, in the same order (new_group is collective).
        self.pp_group: Any = None
        self.dp_group: Any = None
        self.ends_group: Any = None
        for d in range(self.dp):
            for t in range(self.tp):
                g = dist.new_group([self.global_rank(p, d, t) for p in range(self.pp)])
                if (d, t) == (self.dp_rank, self.tp_rank):
                    self.pp_group = g
        for p in range(self.pp):
            for t in range(self.tp):
                g = dist.new_group([self.global_rank(p, d, t) for d in range(self.dp)])
                if (p, t) == (self.pp_rank, self.tp_rank):
                    self.dp_group = g
        for d in range(self.dp):
            for t in range(self.tp):
                g = dist.new_group([self.global_rank(0, d, t), self.global_rank(self.pp - 1, d, t)])
                if (d, t) == (self.dp_rank, self.tp_rank):
                    self.ends_group = g
        self.holder = build_holder(spec, self.layout, device, seed)
        self.tied = tied_names(spec, self.holder)
        self.stages = [build_stage(spec.model, self.layout, s, self.holder, spec.train.activation_checkpointing,
                                   compile_backend) for s in self.layout.my_stages()]
        # TP goes with FSDP over the replicas (`Topology.from_layout`: all parameters DTensors,
        # one optimizer kernel; over one replica a no-op shard).
        self.fsdp = topo.fsdp
        if self.fsdp:
            self._shard(spec)
        self.schedule: Any = None
        self.schedule_micro = 0
        self.global_tokens = 1.0

    def _shard(self, spec: ExperimentSpec) -> None:
        """TP inside each stage, then FSDP over each stage's replicas (torchtitan's order; PP x TP x
        FSDP): the stage's blocks get the architecture's TP plan on the `tp` axis of a (pp, dp, tp)
        mesh; with FSDP every block is a unit and the stage (embeddings, norm, head) the root, on
        the `dp` axis. FSDP averages the gradients over the replicas, so each replica's loss is
        scaled by dp (`step`): the same sum as DDP's (a divide factor of 1 would need gloo's
        missing PREMUL_SUM). The holder then names the sharded parameters (DTensors)."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        from trainer.parallel import apply_tp_plan, mixed_precision_policy

        mesh = init_device_mesh(self.device.type, (self.pp, self.dp, self.tp), mesh_dim_names=("pp", "dp", "tp"))
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

    def global_rank(self, pp_rank: int, dp_rank: int | None = None, tp_rank: int | None = None) -> int:
        """The process of stage rank `pp_rank` in replica `dp_rank` at TP rank `tp_rank` (this
        rank's replica and TP rank by default)."""
        d = self.dp_rank if dp_rank is None else dp_rank
        t = self.tp_rank if tp_rank is None else tp_rank
        return (pp_rank * self.dp + d) * self.tp + t

    def _make_schedule(self, micro: int, accum: int) -> Any:
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

    def parameters(self) -> list[Any]:
        return list(self.holder.parameters())

    def step(self, comm: Any, optimizer: Any, scheduler: Any, batches: list[dict[str, Any]], max_norm: float,
             sigterm: bool, autocast: Any) -> StepResult:
        import numpy as np
        import torch

        accum, micro = len(batches), len(batches[0]["input_ids"])
        if self.schedule is None or self.schedule_micro != micro:
            self.schedule, self.schedule_micro = self._make_schedule(micro, accum), micro
        counts = [int((b["labels"][:, 1:] != -100).sum()) for b in batches]
        (total,) = comm.all_reduce([float(sum(counts))])
        # Every stage and TP rank of a replica counted its rows; FSDP averages over dp.
        self.global_tokens = max(total / (self.pp * self.tp), 1.0) / (self.dp if self.fsdp else 1)
        rows: dict[str, int] = {}
        for b in batches:
            for src in b["sources"]:
                rows[src] = rows.get(src, 0) + 1
        cat = {k: torch.from_numpy(np.concatenate([b[k] for b in batches])).to(self.device)
               for k in ("input_ids", "labels", "position_ids")}
        kwargs = {"ids": cat["input_ids"], "position_ids": cat["position_ids"], "labels": cat["labels"]}
        losses: list[torch.Tensor] = []
        args = (cat["input_ids"],) if self.pp_rank == 0 else ()
        with autocast():
            self.schedule.step(*args, target=cat["labels"], losses=losses, return_outputs=False, **kwargs)
        # The last stage's TP ranks hold the same loss; FSDP's scaling undone.
        local_loss = (float(sum(float(x.detach()) for x in losses)) / ((self.dp if self.fsdp else 1) * self.tp)
                      if losses else 0.0)
        self._sync_grads()
        params = [p for p in self.holder.parameters() if p.grad is not None]
        tied = {id(p) for n, p in self.holder.named_parameters() if n in self.tied}
        counted = [p for p in params if not (id(p) in tied and self.pp_rank != 0)]
        # A tensor whole on every TP rank is counted by each: once per TP group.
        sq = float(sum(float(_local(p.grad).detach().float().pow(2).sum()) / (1 if _tp_split(p) else self.tp)
                       for p in counted))
        loss_value, sq_total, any_term = comm.all_reduce([local_loss, sq, float(sigterm)])
        # Replicated over dp (each replica counted it), or FSDP shards (each counted once).
        grad_norm = math.sqrt(sq_total / (1 if self.fsdp else self.dp))
        coef = min(1.0, max_norm / (grad_norm + 1e-6))
        if coef < 1.0:
            for p in params:
                p.grad.detach().mul_(coef)
        if math.isfinite(loss_value) and math.isfinite(grad_norm):
            optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return StepResult(loss_value, grad_norm, sigterm=any_term > 0, rows=rows)

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


class PipelineStepRunner:
    """trainer/step.py's `StepRunner` interface over a `PipelineEngine` (loss and norm read every step)."""

    def __init__(self, engine: PipelineEngine, optimizer: Any, scheduler: Any, comm: Any, grad_clip: float | None,
                 autocast: Any):
        self.engine, self.optimizer, self.scheduler, self.comm = engine, optimizer, scheduler, comm
        self.max_norm = grad_clip or float("inf")
        self.autocast = autocast
        self.replicas = 1

    @property
    def defer(self) -> bool:
        return False

    @defer.setter
    def defer(self, value: bool) -> None:
        """Deferred device reads are not implemented for pipelines: every step is read."""

    def __call__(self, s: int, batches: list[dict[str, Any]], sigterm: bool) -> StepResult:
        return self.engine.step(self.comm, self.optimizer, self.scheduler, batches, self.max_norm, sigterm,
                                self.autocast)
