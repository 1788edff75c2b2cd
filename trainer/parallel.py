"""Sharded layouts: FSDP2 (`fully_shard`) and tensor parallelism (DTensor) through accelerate.

`ParallelDims` says how the processes are arranged (pipeline x data-parallel x tensor-parallel),
which data each rank reads and how batch sums are de-duplicated, and builds the one device mesh
and every process group (`build`; nothing else in the trainer makes one). `make_accelerator` builds the
Accelerator; for FSDP it applies the CPU patch (accelerate 1.15 silently runs plain DDP
when asked for FSDP on CPU: its state only switches FSDP on for GPU-like devices, so
`distributed_type` is set on both `PartialState()` and `acc.state` and the plugin attached;
see ../shared/STACK-NOTES.md). `build_model` creates the network on the meta device and
materialises only this rank's shards, so no rank ever holds the full model (two halves,
`shard_on_meta` then `materialize`: trainer/dry_run.py runs the second on fake tensors):

  - each decoder layer its own FSDP group, the input embeddings their own, the final norm +
    LM head one more (a tied embedding / LM head stays in the root group), then the root;
  - TP by the architecture's plan (`tensor_parallel_plan()`: module names -> column-wise,
    row-wise, replicate) on the `tp` axis of a 2-D mesh, FSDP on `dp`;
  - with `train.compile`, each block `torch.compile`d in place after activation checkpointing
    and TP, before `fully_shard` (torchtitan's order; `apply_compile`), in every layout;
  - parameters initialised one at a time from a seeded generator (the architecture's
    `init_parameter`) and sliced to the local shard, so every layout (plain, DDP, FSDP, TP)
    starts from identical weights.

What a model *is* (its blocks, embeddings, plan, initialisation) comes from its file under
models/; nothing here branches on the architecture.

The trainer checks after `prepare` that the model really is sharded (`assert_sharded`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from basics.errors import TrainingError

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from torch.distributed.device_mesh import DeviceMesh

    from validation.spec import ExperimentSpec, ParallelLayout

@dataclass(frozen=True)
class ParallelDims:
    """How the processes are arranged, and the one place that builds their mesh and groups.

    World = pp x dp x tp (torchtitan's `ParallelDims`): the stage is the outermost axis and TP the
    innermost, rank = (pp rank x dp + dp index) x tp + tp rank. Ranks are numbered node by node,
    so a TP group stays inside a node, and the stages of a replica go to different nodes once a
    node holds one stage. Ranks of one TP group read the same data; FSDP shards over dp.

    Every rank question (which stage, which replica, which data rows, how sums are de-duplicated)
    is answered here, and `build` creates the device mesh and every process group the trainer
    uses -- the stages' point-to-point group, the tied embedding's ends group, the host-side gloo
    groups of the collectives and of the asynchronous checkpointer -- once, in the same order on
    every rank (group creation is collective). No other module builds a mesh or a group.
    """

    world: int
    rank: int
    dp: int
    tp: int
    fsdp: bool
    replicate: int = 1
    """HSDP: FSDP shards inside each of `replicate` groups (one per node) and replicates across them."""
    pp: int = 1
    """Pipeline stages (trainer/pipeline_parallel.py), the outermost axis."""
    cp: int = 1
    """Context parallelism: room for the axis (no layout sets it yet; it would sit between dp and tp)."""
    ep: int = 1
    """Expert parallelism: room for the axis (no layout sets it yet; it would split dp x tp)."""
    _built: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """What `build` made: the mesh and the groups (filled once)."""

    @property
    def shard(self) -> int:
        """Ranks one FSDP group shards the parameters over."""
        return self.dp // self.replicate if self.fsdp else 1

    @property
    def sharded(self) -> bool:
        return self.world > 1 and (self.fsdp or self.tp > 1 or self.pp > 1)

    @property
    def dp_rank(self) -> int:
        return (self.rank % (self.dp * self.tp)) // self.tp

    @property
    def pp_rank(self) -> int:
        return self.rank // (self.dp * self.tp)

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def replicas(self) -> int:
        """Ranks that read the same rows (a TP group): world-wide sums count each row this often."""
        return self.world // self.dp

    def global_rank(self, pp_rank: int, dp_rank: int | None = None, tp_rank: int | None = None) -> int:
        """The process of stage rank `pp_rank` in replica `dp_rank` at TP rank `tp_rank` (this
        rank's replica and TP rank by default)."""
        d = self.dp_rank if dp_rank is None else dp_rank
        t = self.tp_rank if tp_rank is None else tp_rank
        return (pp_rank * self.dp + d) * self.tp + t

    @staticmethod
    def from_layout(layout: ParallelLayout, world: int, rank: int, nodes: int = 1) -> ParallelDims:
        if layout.pp > 1:
            if world % (layout.pp * layout.tp):
                raise TrainingError(f"parallel.pp={layout.pp} x tp={layout.tp} does not divide the {world} processes")
            dp = world // (layout.pp * layout.tp)
            fsdp = (layout.fsdp and dp > 1) or layout.tp > 1  # TP goes with FSDP, as below
            return ParallelDims(world=world, rank=rank, dp=dp, tp=layout.tp, fsdp=fsdp, pp=layout.pp)
        tp = layout.tp
        if world % tp:
            raise TrainingError(f"parallel.tp={tp} does not divide the {world} processes")
        # TP with several data-parallel replicas shards them with FSDP too (2-D mesh): same
        # numerics as replication, less memory, one code path.
        dp, fsdp = world // tp, layout.fsdp or tp > 1
        # Several nodes: shard inside a node (fast links), replicate across nodes (HSDP).
        replicate = nodes if fsdp and tp == 1 and nodes > 1 and dp % nodes == 0 and dp > nodes else 1
        return ParallelDims(world=world, rank=rank, dp=dp, tp=tp, fsdp=fsdp, replicate=replicate)

    # ------------------------------------------------------------------ the mesh and the groups

    def build(self, device_type: str, *, checkpoint_group: bool = False) -> ParallelDims:
        """Collective (every rank, once, before any other group exists): the device mesh of a
        sharded layout and every process group the trainer uses. `checkpoint_group`: a gloo group
        of its own for the asynchronous sharded checkpointer (its writes never interleave with
        training's collectives). Returns self; calling it again does nothing."""
        if self._built:
            return self
        self._built["device_type"] = device_type
        if self.sharded:
            from torch.distributed.device_mesh import init_device_mesh

            # The axes each layout shards over, named as the code that takes them reads them.
            shape: tuple[int, ...]
            names: tuple[str, ...]
            if self.pp > 1:
                shape, names = (self.pp, self.dp, self.tp), ("pp", "dp", "tp")
            elif self.replicate > 1:  # HSDP: both data-parallel, the ranks of a node adjacent
                shape, names = (self.replicate, self.shard), ("replicate", "shard")
            else:
                shape, names = (self.dp, self.tp), ("dp", "tp")
            self._built["mesh"] = init_device_mesh(device_type, shape, mesh_dim_names=names)
        if self.world > 1:
            import torch.distributed as dist

            if self.pp > 1:
                mesh = self._built["mesh"]
                self._built["pp"], self._built["dp"] = mesh["pp"].get_group(), mesh["dp"].get_group()
                # The first and the last stage of each replica and TP rank: a tied embedding and LM head.
                ends = mesh["pp"].get_group() if self.pp == 2 else None
                if ends is None:
                    for d in range(self.dp):
                        for t in range(self.tp):
                            group = dist.new_group([self.global_rank(0, d, t), self.global_rank(self.pp - 1, d, t)])
                            if (d, t) == (self.dp_rank, self.tp_rank):
                                ends = group
                self._built["ends"] = ends
            # Host values (token counts, flags) over gloo on CPU tensors: on GPUs an NCCL
            # all-reduce of a device tensor plus the read back would wait for the device each step.
            if device_type == "cuda":
                self._built["host"] = dist.new_group(backend="gloo")
            if checkpoint_group and self.sharded:
                self._built["checkpoint"] = dist.new_group(backend="gloo")
        return self

    @property
    def mesh(self) -> DeviceMesh:
        """The device mesh of a sharded layout (`build` first)."""
        assert "mesh" in self._built, "ParallelDims.build() makes the mesh of a sharded layout"
        mesh: DeviceMesh = self._built["mesh"]
        return mesh

    @property
    def pp_group(self) -> Any:
        """This rank's pipeline: its replica's and TP rank's stages (None without stages)."""
        return self._built.get("pp")

    @property
    def dp_group(self) -> Any:
        """This stage's and TP rank's replicas (pipeline layouts; None otherwise)."""
        return self._built.get("dp")

    @property
    def ends_group(self) -> Any:
        """The first and last stage of this rank's replica and TP rank (None without stages)."""
        return self._built.get("ends")

    @property
    def host_group(self) -> Any:
        """The gloo group of the host-side collectives on GPUs (None: the default group serves)."""
        return self._built.get("host")

    @property
    def checkpoint_group(self) -> Any:
        """The gloo group of the asynchronous sharded checkpointer (None when not asked for)."""
        return self._built.get("checkpoint")


Topology = ParallelDims
"""The former name, kept for bench/ scripts that still import it."""


def make_accelerator(precision: str, topo: ParallelDims) -> Accelerator:
    from accelerate import Accelerator

    if not topo.sharded or topo.pp > 1:  # pipeline stages: trainer/pipeline_parallel.py
        return Accelerator(mixed_precision=precision)
    from accelerate import FullyShardedDataParallelPlugin
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    # Sharding is applied by `build_model` (meta init, our groups, TP first); accelerate's own
    # wrapping sees an FSDPModule and leaves it alone. Its plugin still drives backward,
    # clipping (DTensor-aware across meshes), no_sync and state-dict types.
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True,
                                            state_dict_type="SHARDED_STATE_DICT")
    acc = Accelerator(mixed_precision=precision, fsdp_plugin=plugin)
    for state in (PartialState(), acc.state):
        state.distributed_type = DistributedType.FSDP
    acc.state.fsdp_plugin = plugin
    return acc


def make_mesh(topo: ParallelDims, device_type: str) -> DeviceMesh:
    """The layout's device mesh (`ParallelDims.build`, which makes it): (dp, tp); with HSDP
    (replicate, shard); with stages (pp, dp, tp)."""
    return topo.build(device_type).mesh


def apply_tp_plan(arch: Any, model: torch.nn.Module, mesh: DeviceMesh) -> None:
    """The architecture's tensor-parallel plan (data: module names inside a block -> style),
    applied to every block. `replicate` keeps a module's weight whole on every TP rank while its
    input is split by head (dim 2 of [batch, seq, heads, head_dim]): DTensor sums its gradient
    over the TP group (QK-norm's scales). A name that matches nothing in a block is refused."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    styles: dict[str, Any] = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel,
                              "replicate": lambda: SequenceParallel(sequence_dim=2, use_local_output=True)}
    for index, block in enumerate(arch.blocks(model)):
        names = {name for name, _ in block.named_modules()}
        plan: dict[str, Any] = {}
        for name, style in arch.tensor_parallel_plan().items():
            if name not in names:
                raise TrainingError(f"models/{arch.model_type}.py: tp_plan names '{name}', which block {index} "
                                    f"({type(block).__name__}) does not have")
            plan[name] = styles[style]()
            _check_tp_split(arch, block, index, name, style, mesh.size())
        parallelize_module(block, mesh, plan)


def apply_compile(arch: Any, model: torch.nn.Module, backend: str = "inductor") -> None:
    """`torch.compile` each decoder block in place (`Module.compile`: names and state dict keys
    unchanged), after TP and activation checkpointing, before `fully_shard` (torchtitan's
    `apply_compile`). The blocks share one code object, so the first compiles and the others
    reuse its graph. Inductor on a CPU needs a C++ compiler: without one, one line, before any step."""
    check_compiler(backend)
    for block in arch.blocks(model):
        block.compile(backend=backend)


def check_compiler(backend: str) -> None:
    """Inductor on a CPU needs a C++ compiler: without one, one line, before any step."""
    import os
    import shutil

    import torch

    cxx = os.environ.get("CXX", "g++")  # what inductor runs (torch._inductor.config.cpp.cxx)
    if backend == "inductor" and not torch.cuda.is_available() and shutil.which(cxx) is None:
        raise TrainingError(f"train.compile on a CPU needs a C++ compiler: '{cxx}' is not on PATH "
                            "(install g++ or set CXX; or set train.compile: false)")


# What each style splits: (weight dimension, what the dimension is called).
_TP_SPLIT_DIM: dict[str, tuple[int, str]] = {"colwise": (0, "output features"), "rowwise": (1, "input features")}


def _check_tp_split(arch: Any, block: torch.nn.Module, index: int, name: str, style: str, tp: int) -> None:
    """Refuse a weight whose split dimension `tp` does not divide: DTensor would chunk it unevenly and
    the failure would surface later as a bare shape mismatch inside some forward."""
    dim, what = _TP_SPLIT_DIM.get(style, (-1, ""))
    weight = getattr(block.get_submodule(name), "weight", None)
    if dim < 0 or weight is None or weight.dim() <= dim or weight.shape[dim] % tp == 0:
        return
    raise TrainingError(f"models/{arch.model_type}.py: tp_plan splits '{name}' {style} in block {index} "
                        f"({type(block).__name__}), but its {weight.shape[dim]} {what} (weight dim {dim}) "
                        f"do not split over tp={tp}; choose a tp that divides {weight.shape[dim]}")


def mixed_precision_policy(precision: str, reduce_dtype: str) -> Any:
    """bf16/fp16: parameters cast for compute; gradients reduced in fp32 unless the spec says otherwise."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "fp32":
        return MixedPrecisionPolicy()
    param = torch.bfloat16 if precision == "bf16" else torch.float16
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=torch.float32 if reduce_dtype == "fp32" else param)


def build_model(spec: ExperimentSpec, topo: ParallelDims, device: torch.device, seed: int,
                init_from: Path | None = None, mesh: DeviceMesh | None = None,
                compile_backend: str | None = None,
                allocate: Callable[[], Any] = contextlib.nullcontext) -> torch.nn.Module:
    """The causal LM for this rank: plain on one device, or FSDP/TP-sharded on `mesh`; its
    blocks compiled with `compile_backend` (the trainer: inductor when `train.compile`). Its
    parameters are allocated and initialised inside `allocate()` (trainer/dry_run.py: fake
    tensors), after the sharding on the meta device."""
    model, buffers = shard_on_meta(spec, topo, mesh, compile_backend)
    with allocate():
        return materialize(model, buffers, spec.model, device, seed, init_from)


def shard_on_meta(spec: ExperimentSpec, topo: ParallelDims, mesh: DeviceMesh | None = None,
                  compile_backend: str | None = None) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The model on the meta device with activation checkpointing, TP, per-block compile (with
    `compile_backend`; none by default) and FSDP applied, and its buffers' values (real): no
    parameter memory is touched yet (`trainer.dry_run` runs this before entering fake tensors,
    then `materialize` inside them; it measures the eager model)."""
    from accelerate import init_empty_weights

    arch = spec.model
    with init_empty_weights(include_buffers=False):  # parameters on meta, buffers (rotary) real
        model: Any = arch.build()
    if spec.train.activation_checkpointing != "none":
        from trainer.activation_checkpointing import apply_activation_checkpointing

        apply_activation_checkpointing(arch, model, spec.train.activation_checkpointing)
    buffers = {name: buf.clone() for name, buf in model.named_buffers()}
    if topo.sharded and topo.tp > 1:
        assert mesh is not None
        if not arch.tensor_parallel_plan():
            raise TrainingError(f"model_type {arch.model_type} declares no tensor-parallel plan; "
                                "set parallel.tp: 1")
        apply_tp_plan(arch, model, mesh["tp"])
    if compile_backend:  # torchtitan's order: TP -> activation checkpointing -> compile -> FSDP
        apply_compile(arch, model, compile_backend)
    if topo.sharded:
        assert mesh is not None
        from torch.distributed.fsdp import fully_shard

        policy = mixed_precision_policy(spec.train.precision, spec.parallel_layout().reduce_dtype)
        # A 2-D (replicate, shard) mesh makes fully_shard hybrid (HSDP).
        kw: dict[str, Any] = {"mesh": mesh if topo.replicate > 1 else mesh["dp"], "mp_policy": policy}
        for block in arch.blocks(model):
            fully_shard(block, **kw)
        embed, tail = arch.input_embeddings(model), arch.output_modules(model)
        head = tail[-1] if tail else None
        tied = head is not None and getattr(head, "weight", None) is embed.weight
        if not tied:
            fully_shard(embed, **kw)
            fully_shard(tail, **kw, reshard_after_forward=False)  # used at the end of forward, start of backward
        # A tied embedding / LM head (one tensor used first and last) stays in the root group: a
        # group of its own would reduce the head's gradient before the embedding's part arrives
        # (two reductions instead of one: the same sum, another rounding, no longer DDP-exact).
        fully_shard(model, **kw)
    return model, buffers


def materialize(model: torch.nn.Module, buffers: dict[str, torch.Tensor], arch: Any, device: torch.device,
                seed: int, init_from: Path | None = None) -> torch.nn.Module:
    """Allocate this rank's parameters on `device`, restore the buffers, initialise (seeded, or
    `init_from`)."""
    import torch

    model.to_empty(device=device)
    tie = getattr(model, "tie_weights", None)
    if arch.tie_word_embeddings and tie is not None:
        tie()  # `to_empty` swaps each tensor, which unties a shared output weight
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name in buffers:
                buf.copy_(buffers[name])
    if init_from is not None:
        load_full_weights(model, init_from, arch)
    else:
        init_parameters(model, seed, arch)
    built: torch.nn.Module = model
    return built


def tied_model(arch: Any, model: Any) -> Any:
    """`model` (built on the meta device) with its embedding / LM head tied as `materialize` ties the
    trained model: the names a tied tensor goes by (pipeline stages, checkpoints of stages)."""
    model.to_empty(device="meta")  # as `materialize` does: to_empty, then tie
    tie = getattr(model, "tie_weights", None)
    if arch.tie_word_embeddings and tie is not None:
        tie()
    return model


def _copy_full_into(param: torch.Tensor, full: torch.Tensor) -> None:
    """Write this rank's part of `full` into `param` (plain, or a DTensor shard: slicing only)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor):
        local = distribute_tensor(full.to(param.device), param.device_mesh, param.placements,
                                  src_data_rank=None).to_local()
        param.to_local().copy_(local)
    else:
        param.copy_(full.to(param.device))


def init_parameters(model: torch.nn.Module, seed: int, arch: Any) -> None:
    """Seeded init, parameter by parameter in name order (the same draws in every layout); the
    architecture gives each parameter's full initial value (`init_parameter`)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    seen: set[int] = set()
    with torch.no_grad():
        for name, param in model.named_parameters():  # a tied weight is listed once
            if id(param) in seen:
                continue
            seen.add(id(param))
            _copy_full_into(param, arch.init_parameter(model, name, param.shape, gen))


def load_full_weights(model: torch.nn.Module, directory: Path, arch: Any) -> None:
    """`init_from` for any layout: a local Hugging Face checkpoint directory (config.json checked
    against the spec; model.safetensors or the shards of model.safetensors.index.json), each
    tensor read on its own and sliced to this rank's shard (trainer/hf_checkpoint.py)."""
    from trainer.hf_checkpoint import load_checkpoint

    load_checkpoint(model, Path(directory), arch, _copy_full_into)


def local_and_total_params(model: torch.nn.Module) -> tuple[int, int]:
    from torch.distributed.tensor import DTensor

    local = total = 0
    for p in model.parameters():
        total += p.numel()
        local += p.to_local().numel() if isinstance(p, DTensor) else p.numel()
    return local, total


def assert_sharded(model: torch.nn.Module, topo: ParallelDims) -> tuple[int, int]:
    """Fail loudly unless this rank holds about total / shard degree of the parameters."""
    from torch.nn.parallel import DistributedDataParallel

    if not topo.sharded:
        return local_and_total_params(model)
    if isinstance(model, DistributedDataParallel):
        raise TrainingError("parallel layout asks for FSDP/TP but the model was wrapped in DDP (accelerate fell "
                            "back to data parallelism); refusing to train an unsharded model")
    local, total = local_and_total_params(model)
    degree = topo.shard * topo.tp
    # Small tensors (norms, biases) are chunked with padding and, under TP without FSDP,
    # embeddings stay replicated: allow that, but never a full copy.
    upper = total / topo.shard * 1.02 + 64 * topo.world
    if local > upper or (degree > 1 and local >= total):
        raise TrainingError(f"model is not sharded: this rank holds {local} of {total} parameters, expected about "
                            f"{total // degree} (dp={topo.dp} fsdp={topo.fsdp} shard={topo.shard} tp={topo.tp}); refusing to train")
    return local, total
