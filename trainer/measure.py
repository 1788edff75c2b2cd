"""Measure what an architecture declares: parameters on the meta device, FLOPs on fake tensors,
saved activations of one block. Used by the smoke stage (the real model against
`spec.resolved.json`), the contract tests (every file under models/) and the bench.

FLOPs: the formulas of `torch.utils.flop_counter` (what its `FlopCounterMode` sums) under
`FakeTensorMode` (no memory, no compute). Their blind spot is an op without a FLOP formula,
counted as 0 silently (CPU SDPA, `_grouped_mm`): `UncountedOps` lists every executed
matmul-like op that has no formula, and `count_training_flops` refuses to return a number while
that list is not empty. The CPU flash attention op gets the formula of the MFU convention (forward 4 x b x heads x s^2 x head_dim,
backward twice that: the useful work, not the kernel's recomputation).

Data-dependent shapes (a dropless mixture of experts: `torch.where` picks each expert's
tokens) cannot run on fake tensors (`DynamicOutputShapeException: aten.nonzero`):
`measure_training_flops` then counts the same forward + backward on real tensors, on the CPU,
for the (tiny) configuration it is given, and says so (`FlopCount.tensors`, `.reason`). The
count is then the one of that batch's routing: exact when every token does the same work
(dropless top-k), not when it depends on the data (capacity-dropping routers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

MATMUL_LIKE = ("mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "conv", "scaled_dot_product", "_grouped_mm",
               "einsum", "addbmm", "dot", "mv")


class MeasureError(Exception):
    """A count that cannot be trusted (an op without a FLOP formula)."""


def parameter_count_on_meta(arch: Any) -> int:
    """Parameters of `arch.build()` on the meta device (a tied weight counted once)."""
    with torch.device("meta"):
        model = arch.build()
    return sum(p.numel() for p in model.parameters())


_REGISTERED = False


def _register_cpu_attention_formulas() -> None:
    global _REGISTERED
    if _REGISTERED:
        return
    from torch.utils.flop_counter import register_flop_formula, sdpa_flop_count

    aten = torch.ops.aten

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu, get_raw=True)  # type: ignore[untyped-decorator]
    def _cpu_flash_fwd(query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
        return int(sdpa_flop_count(query.shape, key.shape, value.shape))

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward, get_raw=True)  # type: ignore[untyped-decorator]
    def _cpu_flash_bwd(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_val: Any = None,
                       **kwargs: Any) -> int:
        return 2 * int(sdpa_flop_count(query.shape, key.shape, value.shape))

    _REGISTERED = True


class UncountedOps(TorchDispatchMode):
    """Records every executed matmul-like op that torch's FLOP counter has no formula for."""

    def __init__(self) -> None:
        super().__init__()
        from torch.utils.flop_counter import flop_registry

        self.registry = flop_registry
        self.missing: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        packet = getattr(func, "overloadpacket", func)
        name = str(getattr(packet, "__name__", packet))
        if any(k in name for k in MATMUL_LIKE) and packet not in self.registry:
            self.missing.add(name)
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class FlopCount:
    """Training FLOPs per token as torch counted them, and on what."""

    per_token: float
    tensors: str
    """"fake" (no memory, no compute) or "real" (the forward has data-dependent shapes)."""
    reason: str | None = None
    """Why fake tensors could not run it (the op), when `tensors` is "real"."""

    def describe(self) -> str:
        """One phrase for smoke.json and the logs."""
        return "fake tensors" if self.tensors == "fake" else f"real tensors on the CPU ({self.reason})"


def _data_dependent(exc: BaseException) -> bool:
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    return isinstance(exc, (DynamicOutputShapeException, DataDependentOutputException))


class _CountFlops(UncountedOps):
    """torch's FLOP formulas summed over every executed op (what `FlopCounterMode` totals, without
    its per-module tracking, which costs seconds on real tensors), plus `UncountedOps`' guard."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = super().__torch_dispatch__(func, types, args, kwargs)
        formula = self.registry.get(getattr(func, "overloadpacket", func))
        if formula is not None:
            self.total += int(formula(*args, **kwargs, out_val=out))
        return out


def _count(arch: Any, seq_len: int, batch: int, fake: bool) -> float:
    import contextlib

    from torch._subclasses.fake_tensor import FakeTensorMode

    _register_cpu_attention_formulas()
    with FakeTensorMode() if fake else torch.random.fork_rng(devices=[]):
        if not fake:
            torch.manual_seed(0)
        with contextlib.nullcontext() if fake else torch.device("cpu"):
            model = arch.build()
        model.train()
        # Real tensors: varied tokens (routing sees a realistic mix); fake ones have no values.
        ids = (torch.zeros(batch, seq_len, dtype=torch.long) if fake
               else torch.randint(0, arch.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(0)))
        pos = torch.arange(seq_len).expand(batch, seq_len)
        labels = ids.clone()
        counter = _CountFlops()
        with counter:
            out = model(input_ids=ids, position_ids=pos, labels=labels, use_cache=False)
            out.loss.backward()
    if counter.missing:
        raise MeasureError(f"ops without a FLOP formula ran (counted as 0): {sorted(counter.missing)}")
    return float(counter.total) / (batch * seq_len)


def measure_training_flops(arch: Any, seq_len: int, batch: int = 1) -> FlopCount:
    """FLOPs of one forward + backward of `arch.build()` on `batch` rows of `seq_len` tokens,
    per token: on fake tensors, or on real CPU tensors when the forward has a data-dependent
    shape (keep `arch` tiny then: it is built and run for real). Raises `MeasureError` when an
    executed matmul-like op has no FLOP formula."""
    try:
        return FlopCount(_count(arch, seq_len, batch, fake=True), "fake")
    except Exception as exc:  # noqa: BLE001 - only data-dependent shapes fall back; the rest re-raises
        if not _data_dependent(exc):
            raise
        op = str(exc).split()[0] if str(exc) else type(exc).__name__
        reason = f"{type(exc).__name__}: {op} has a data-dependent output shape"
    # One thread: a tiny model's ops are too small to split, and on a busy CPU every parallel
    # region waits for a free core (measured: models/moe.py's contract check 23.6 s -> 2.0 s at
    # load 10 on 2 cores).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return FlopCount(_count(arch, seq_len, batch, fake=False), "real", reason)
    finally:
        torch.set_num_threads(threads)


def count_training_flops(arch: Any, seq_len: int, batch: int = 1) -> float:
    """`measure_training_flops(...).per_token`."""
    return measure_training_flops(arch, seq_len, batch).per_token


@dataclass(frozen=True)
class SavedActivations:
    per_block: list[int]
    """Bytes each block's forward saved for backward (distinct storages)."""

    @property
    def mean(self) -> float:
        return sum(self.per_block) / max(1, len(self.per_block))


def saved_activation_bytes(arch: Any, seq_len: int, micro_batch: int, dtype: Any = None) -> SavedActivations:
    """Bytes the forward of each block saves for its backward (real tensors, CPU, packed hooks
    keyed by storage so a tensor saved twice counts once). Under `dtype` bf16 the forward runs
    in autocast, like the trainer."""
    import contextlib

    torch.manual_seed(0)
    model = arch.build()
    blocks = arch.blocks(model)
    current: dict[str, Any] = {"index": None, "seen": set()}
    totals = [0] * len(blocks)

    def pack(t: torch.Tensor) -> torch.Tensor:
        i = current["index"]
        if i is not None and not isinstance(t, torch.nn.Parameter):
            storage = t.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            if key not in current["seen"] and t.requires_grad is not None:
                current["seen"].add(key)
                totals[i] += storage.nbytes()
        return t

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack_filtered(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() in params:
            return t
        return pack(t)

    handles = []
    for i, block in enumerate(blocks):
        def pre(_m: Any, _a: Any, i: int = i) -> None:
            current["index"], current["seen"] = i, set()

        def post(_m: Any, _a: Any, _o: Any) -> None:
            current["index"] = None

        handles += [block.register_forward_pre_hook(pre), block.register_forward_hook(post)]
    ids = torch.randint(0, arch.vocab_size, (micro_batch, seq_len))
    pos = torch.arange(seq_len).expand(micro_batch, seq_len)
    autocast = (torch.autocast("cpu", dtype=dtype) if dtype is not None and dtype != torch.float32
                else contextlib.nullcontext())
    with torch.autograd.graph.saved_tensors_hooks(pack_filtered, lambda t: t), autocast:
        out = model(input_ids=ids, position_ids=pos, labels=ids, use_cache=False)
    del out
    for h in handles:
        h.remove()
    return SavedActivations(totals)
