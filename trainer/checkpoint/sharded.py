"""The sharded layout (FSDP, TP, pipeline stages): torch.distributed.checkpoint (DCP) save, load (resharding),
round-trip validation without gathering, and a streamed safetensors export.

  __<rank>_0.distcp  every rank's shard of model and optimizer
  .metadata          DCP's index (written by rank 0)
  scheduler.pt       {"scheduler": ...}

beside every rank's `rng_rank<N>.pt` and `train_state.json`. DCP files hold the model and
optimizer under the keys `model` and `optim` (flattened to `model.<fqn>` /
`optim.state.<fqn>.<name>` / `optim.param_groups.<fqn>.<name>` in `.metadata`). Loading goes through
`get_state_dict`/`set_state_dict`, so the same files load into a plain model (one process,
no process group), DDP replicas, another FSDP/TP layout or pipeline stages: DCP reads each rank's part of
each tensor from whichever shards hold it.
"""

from __future__ import annotations

import json
import shutil
import struct
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from basics.errors import TrainingError
from trainer.checkpoint.format import (
    MODEL,
    OPTIMIZER,
    SCHEDULER,
    file_entry,
    rng_file,
    shard_prefix,
    tmp_dir_for,
    train_state_record,
    write_train_state,
)
from trainer.checkpoint.rng import write_rank_rng

if TYPE_CHECKING:
    import torch

    from trainer.checkpoint.manager import Live
    from trainer.model_parts import ModelParts
    from trainer.state import TrainState


def _optimizer(opt: Any) -> torch.optim.Optimizer:
    inner: torch.optim.Optimizer = getattr(opt, "optimizer", opt)  # accelerate's AcceleratedOptimizer wraps it
    return inner


# How every sharded checkpoint keys its optimizer: `optim.state.<fqn>.<name>` and
# `optim.param_groups.<fqn>.<name>` (DCP's `flatten_optimizer_state_dict`), one key per parameter
# name, so that any layout reads any other's, pipeline stages included (their ranks hold
# different parameters: group indices would collide). Checkpoints written before it keyed param
# groups by index (`optim.param_groups.0.lr`); `load_shards` reads those too.


def _options(flatten: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=flatten)


def state_dicts(model: torch.nn.Module, optimizer: Any, flatten: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(model, _optimizer(optimizer), options=_options(flatten))


NOT_WRITTEN = "not written: "
"""How a rank's reason says its write raised (as opposed to a save that does not read back)."""


def write_failure(exc: BaseException) -> str:
    """Why a DCP write failed, as a rank's reason says it. DCP gathers every rank's failure into
    one `CheckpointException` -- a BaseException, not an Exception, whose text is only the ranks'
    numbers -- so the first OSError among them is named (a full disk on one rank shows on the
    others as a torn file: its ENOSPC is what trainer/monitor.py must see to stop), else the first."""
    failures = getattr(exc, "failures", None)
    cause: Any = exc
    if isinstance(failures, dict) and failures:
        causes = [f[0] if isinstance(f, tuple) else f for f in failures.values()]  # (exception, its stack)
        cause = next((c for c in causes if isinstance(c, OSError)), causes[0])
    return f"{NOT_WRITTEN}{cause}"


def save_shards(directory: Path, model: torch.nn.Module, optimizer: Any) -> None:
    """Collective: every rank writes `__<rank>_0.distcp`; rank 0 also `.metadata`."""
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    model_sd, optim_sd = state_dicts(model, optimizer)
    dcp_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(directory))


def checkpoint_keys(directory: Path) -> set[str]:
    """Every key of a DCP checkpoint's index (`model.<fqn>`, `optim.state.<fqn>.<name>`, ...)."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    return set(FileSystemReader(str(directory)).read_metadata().state_dict_metadata)


def indexed_groups(keys: set[str]) -> bool:
    """Written before the optimizer was keyed by name: param groups keyed by index (`optim.param_groups.0.lr`)."""
    import re

    return any(re.match(r"optim\.param_groups\.\d+\.", k) for k in keys)


def _aliased(key: str, keys: set[str], aliases: dict[str, str]) -> str | None:
    """Where `key` (flattened, `model.`/`optim.` prefixed) is in a checkpoint with `keys`."""
    if key in keys:
        return key
    for alias, name in aliases.items():
        for prefix in ("model.", "optim.state.", "optim.param_groups."):
            if key.startswith(prefix + alias + "."):
                moved = prefix + name + key[len(prefix + alias):]
                if moved in keys:
                    return moved
            elif key == prefix + alias and prefix + name in keys:
                return prefix + name
    return None


def load_shards(directory: Path, parts: ModelParts, optimizer: Any) -> None:
    """Load the model parts and the optimizer from a DCP checkpoint written by any layout (reshards).

    Pipeline stages read their own parameters' keys; a tied LM head on the last stage reads the
    input embedding's keys when the checkpoint was written by a layout that holds them as one
    tensor (`parts.tied_aliases`; the other way round, the one-model layouts ignore the head's copy)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    keys = checkpoint_keys(directory)
    old = indexed_groups(keys)
    model, staged = parts.owner, parts.staged
    if old and staged:
        raise TrainingError(f"{directory}: written before checkpoints keyed the optimizer by parameter name; "
                            "pipeline stages cannot read it: continue it with parallel.pp 1")
    model_sd, optim_sd = state_dicts(model, optimizer, flatten=not old)
    aliases = parts.tied_aliases
    wanted: dict[str, Any] = {}
    where: dict[str, str] = {}
    for prefix, part in (("model.", model_sd), ("optim.", optim_sd)):
        for name, value in part.items():
            found = _aliased(prefix + name, keys, aliases) if (staged and not old) else prefix + name
            if found is None:
                raise TrainingError(f"{directory}: the checkpoint has no {prefix}{name}")
            wanted[found] = value
            where[prefix + name] = found
    single = not (dist.is_available() and dist.is_initialized())
    with warnings.catch_warnings():
        # One process without a process group is the intended 2 -> 1 resharding case, not a mistake.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        # DCP joins nested keys with ".": dotted keys name the same entries, loaded in place.
        dcp_load(wanted, checkpoint_id=str(directory), no_dist=single)
    model_sd = {name: wanted[where["model." + name]] for name in model_sd}
    optim_sd = {name: wanted[where["optim." + name]] for name in optim_sd}
    set_state_dict(model, _optimizer(optimizer), model_state_dict=model_sd, optim_state_dict=optim_sd,
                   options=_options(not old))


def live_model_state(model: torch.nn.Module) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model)


def staged_copy(model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """This rank's model + optimizer shards copied to CPU memory (what an async save writes
    while training goes on). DCP's own staging helpers: they keep DTensor sharding."""
    from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

    model_sd, optim_sd = state_dicts(model, optimizer)
    live = {"model": model_sd, "optim": optim_sd}
    staged: dict[str, Any] = _copy_state_dict(live, _create_cpu_state_dict(live))
    return staged


def verify_roundtrip(directory: Path, live: dict[str, Any]) -> str | None:
    """Collective: read this rank's part of the weights back and compare bitwise with `live`
    (the model state dict that was saved). No rank ever holds more than its own shard twice."""
    import torch
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
    from torch.distributed.tensor import DTensor

    fresh = {k: torch.empty_like(v) for k, v in live.items()}
    try:
        dcp_load({"model": fresh}, checkpoint_id=str(directory))
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - any read failure makes the checkpoint invalid
        return f"shards do not load: {str(exc).splitlines()[0][:300]}"
    for key, value in live.items():
        other = fresh[key]
        a = value.to_local() if isinstance(value, DTensor) else value
        b = other.to_local() if isinstance(other, DTensor) else other
        if not torch.equal(a, b):
            return f"{key} differs after reload"
    return None


_SAFETENSORS_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64"}


def model_tensors(directory: Path) -> dict[str, tuple[list[int], Any]]:
    """name -> (shape, torch dtype) of every model tensor in a DCP checkpoint (from `.metadata`)."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(str(directory)).read_metadata()
    out = {}
    for key, item in meta.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(item, TensorStorageMetadata):
            out[key[len("model."):]] = (list(item.size), item.properties.dtype)
    return out


def read_tensor(directory: Path, name: str, shape: list[int], dtype: Any) -> torch.Tensor:
    """One full model tensor from the shards (no process group needed)."""
    import torch
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    tensor = torch.empty(shape, dtype=dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp_load({"model": {name: tensor}}, checkpoint_id=str(directory), no_dist=True)
    return tensor


def export_safetensors(directory: Path, out_file: Path, skip: set[str] | None = None) -> int:
    """Write one `model.safetensors` from a DCP checkpoint, streamed: the header is computed
    from `.metadata`, then each tensor is read from the shards and appended, so at most one
    full tensor is in memory (the safetensors library only writes whole dicts). Returns bytes."""
    tensors = {k: v for k, v in sorted(model_tensors(directory).items()) if k not in (skip or set())}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (shape, dtype) in tensors.items():
        nbytes = _numel(shape) * dtype.itemsize
        header[name] = {"dtype": _SAFETENSORS_DTYPE[str(dtype).removeprefix("torch.")], "shape": shape,
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    with open(out_file, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for name, (shape, dtype) in tensors.items():
            tensor = read_tensor(directory, name, shape, dtype)
            fh.write(tensor.contiguous().view(-1).view(_byte_dtype()).numpy().tobytes())
            del tensor
    return 8 + len(raw) + offset


def _byte_dtype() -> Any:
    import torch

    return torch.uint8


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def load_legacy(directory: Path, parts: ModelParts, optimizer: Any, arch: Any, train: Any) -> None:
    """A one-process / DDP checkpoint (model.safetensors + optimizer.pt) into a sharded model or
    pipeline stages: weights streamed tensor by tensor; the optimizer state (indexed by parameter
    position, in the order `build_optimizer` lists the whole model's) re-keyed by name and
    distributed. A pipeline stage takes its own parameters' state (a tied LM head the embedding's)."""
    import torch
    from accelerate import init_empty_weights
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    from torch.distributed.tensor import DTensor, distribute_tensor

    from trainer.optim import build_optimizer
    from trainer.parallel import _copy_full_into, load_full_weights, tied_model

    model, staged, aliases = parts.owner, parts.staged, parts.tied_aliases
    load_full_weights(model, directory, arch)
    saved = torch.load(Path(directory) / OPTIMIZER, map_location="cpu", weights_only=False)
    opt = _optimizer(optimizer)
    names = {id(p): n for n, p in model.named_parameters()}
    if staged:  # the file omits a tied LM head: the last stage's copy is the embedding's tensor
        from safetensors import safe_open

        mine = dict(model.named_parameters())
        with safe_open(str(Path(directory) / MODEL), framework="pt") as fh, torch.no_grad():
            for alias, name in aliases.items():
                if alias in mine and alias not in fh.keys():
                    _copy_full_into(mine[alias], fh.get_tensor(name))
    if staged:  # the position of each name in the whole model's optimizer (built on meta tensors)
        with init_empty_weights(include_buffers=False):
            full: Any = arch.build()
        full = tied_model(arch, full)
        full_opt = build_optimizer(full, train, arch)
        full_names = {id(p): n for n, p in full.named_parameters()}
        order = [full_names[id(p)] for group in full_opt.param_groups for p in group["params"]]
        group_of = {full_names[id(p)]: i for i, group in enumerate(full_opt.param_groups) for p in group["params"]}
    else:
        order = [names[id(p)] for group in opt.param_groups for p in group["params"]]
    state = {order[int(i)]: v for i, v in saved["state"].items()}
    if staged:
        params = dict(model.named_parameters())
        state = {n: state[aliases.get(n, n)] for n in params if aliases.get(n, n) in state}
        flat: dict[str, Any] = {}
        for name, param in sorted(params.items()):
            for key, value in state.get(name, {}).items():
                if isinstance(param, DTensor) and isinstance(value, torch.Tensor) and value.shape == param.shape:
                    value = distribute_tensor(value.to(param.device), param.device_mesh, param.placements,
                                              src_data_rank=None)  # this rank's FSDP shard, sliced locally
                flat[f"state.{name}.{key}"] = value
            group = saved["param_groups"][group_of[aliases.get(name, name)]]
            for key, value in group.items():
                if key != "params":
                    flat[f"param_groups.{name}.{key}"] = value
        set_optimizer_state_dict(model, opt, flat,
                                 options=StateDictOptions(flatten_optimizer_state_dict=True))
        return
    groups = []
    for group, saved_group in zip(opt.param_groups, saved["param_groups"], strict=True):
        groups.append({k: v for k, v in saved_group.items() if k != "params"}
                      | {"params": [names[id(p)] for p in group["params"]]})
    set_optimizer_state_dict(model, opt, {"state": state, "param_groups": groups},
                             options=StateDictOptions(full_state_dict=True))


class ShardedStorage:
    """FSDP / TP: every rank writes its own shard with torch.distributed.checkpoint.

    Same rules as the unsharded layout: a temporary directory, validated (each rank reads
    its part back and compares it with what it saved: nothing is gathered), a MANIFEST.json
    with the sha256 of every file (each rank hashes what it wrote; rank 0 writes the
    manifest), then an atomic rename.

    `async_checkpoint`: training waits only while every rank copies its shards to CPU memory;
    the writer's thread writes them (DCP over a process group of its own, so its collectives
    never interleave with training's); the save is validated and published at the next save
    or `complete()` (end of run, rollback, preemption), which all ranks reach together.
    A process killed before that leaves a temporary directory: never a checkpoint.
    """

    def __init__(self, live: Live):
        self.live = live
        self._pending: tuple[int, Path, dict[str, Any], float] | None = None
        self._bg_error: str | None = None
        # Its own gloo group (`ParallelDims.checkpoint_group`): background writes never interleave
        # with training's collectives.
        self._group: Any = live.dims.checkpoint_group if live.writer.async_save else None
        assert self._group is not None or not live.writer.async_save, "ParallelDims.build(checkpoint_group=True)"

    def describe(self) -> str:
        return f"sharded, {self.live.comm.world} ranks, {'async' if self._group is not None else 'sync'}"

    def save(self, state: TrainState) -> None:
        """Collective. In async mode every rank returns once its shards are staged in CPU memory."""
        import torch
        from torch.distributed.checkpoint.api import CheckpointException

        live = self.live
        t0 = time.perf_counter()
        self.complete()  # publishing the previous background save is part of this stall
        step = state.step
        root = live.writer.root
        tmp = tmp_dir_for(root, step)
        if live.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        live.comm.barrier()
        reason: str | None = None
        try:
            write_rank_rng(root, step, live.rank)
            if live.is_main:
                torch.save({"scheduler": live.scheduler.state_dict()}, tmp / SCHEDULER)
                write_train_state(tmp, train_state_record(state.to_json(), live.layout))
            if self._group is not None:
                staged = staged_copy(live.model, live.optimizer)
                self._bg_error = None
                live.writer.submit(lambda: self._write_in_background(tmp, staged))
                self._pending = (step, tmp, staged, t0)
                return
            save_shards(tmp, live.model, live.optimizer)
            reason = verify_roundtrip(tmp, live_model_state(live.model))
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - disk full, quota: reported, previous state intact
            reason = write_failure(exc)
        self._complete(step, tmp, reason, t0)

    def _write_in_background(self, tmp: Path, staged: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        try:
            dcp_save(staged, checkpoint_id=str(tmp), process_group=self._group)
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - reported when the save is completed
            self._bg_error = write_failure(exc)

    def complete(self) -> None:
        """Collective: validate and publish the background save (every rank calls this together)."""
        if self._pending is None:
            return
        step, tmp, staged, t0 = self._pending
        self._pending = None
        self.live.writer.wait()
        reason = self._bg_error
        if reason is None:
            try:
                reason = verify_roundtrip(tmp, staged["model"])
            except Exception as exc:  # noqa: BLE001
                reason = f"not readable: {exc}"
        self._complete(step, tmp, reason, t0)

    def _complete(self, step: int, tmp: Path, reason: str | None, t0: float) -> None:
        """Collective: every rank hashes its files; rank 0 writes the manifest and renames."""
        live = self.live
        live.comm.barrier()  # every rank's files are complete before anyone hashes
        files: dict[str, dict[str, Any]] = {}
        if reason is None:
            for path in sorted(tmp.iterdir()):
                mine = path.name.startswith(shard_prefix(live.rank)) or path.name == rng_file(live.rank)
                rank0 = live.is_main and not path.name.startswith(("__", "rng_rank"))
                if path.is_file() and (mine or rank0):
                    files[path.name] = file_entry(path)
        reasons = live.comm.gather(reason)
        all_files = live.comm.gather(files)
        if live.is_main:
            problems = [r for r in reasons if r]
            # A write that raised (disk full, quota) is a failed save, like the one-process
            # layout's: trainer/monitor.py stops on a full disk and at the third failure. A save
            # that was written but does not read back is an invalid one.
            failed = [r.removeprefix(NOT_WRITTEN) for r in problems if r.startswith(NOT_WRITTEN)]
            if failed:
                live.writer.fail(step, tmp, OSError(failed[0]), t0)
            elif problems:
                live.writer.reject(step, tmp, problems[0], t0)
            else:
                merged: dict[str, dict[str, Any]] = {}
                for part in all_files:
                    merged |= part
                live.writer.publish(step, tmp, t0, merged, {"format": "dcp", "world_size": live.comm.world})
        live.comm.barrier()

    def load_unsharded(self, path: Path) -> None:
        """A checkpoint written by one process or DDP into this sharded model."""
        load_legacy(path, self.live.parts, self.live.optimizer, self.live.spec.model, self.live.spec.train)
