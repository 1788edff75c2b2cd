"""Measure what an architecture declares: parameters on the meta device, FLOPs on fake tensors,
saved activations of one block. Used by the smoke stage (the real model against
`spec.resolved.json`), the contract tests (every file under models/) and the bench.

FLOPs: `torch.utils.flop_counter.FlopCounterMode` under `FakeTensorMode` (no memory, no
compute). Its blind spot is an op without a FLOP formula, counted as 0 silently (CPU SDPA,
`_grouped_mm`): `UncountedOps` lists every executed matmul-like op that has no formula, and
`count_training_flops` refuses to return a number while that list is not empty. The CPU flash
attention op gets the formula of the MFU convention (forward 4 x b x heads x s^2 x head_dim,
backward twice that: the useful work, not the kernel's recomputation).
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


def count_training_flops(arch: Any, seq_len: int, batch: int = 1) -> float:
    """FLOPs of one forward + backward of `arch.build()` on `batch` rows of `seq_len` tokens,
    per token. Raises `MeasureError` when an executed matmul-like op has no FLOP formula."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    _register_cpu_attention_formulas()
    with FakeTensorMode():
        model = arch.build()
        ids = torch.zeros(batch, seq_len, dtype=torch.long)
        pos = torch.arange(seq_len).expand(batch, seq_len)
        labels = ids.clone()
        uncounted = UncountedOps()
        counter = FlopCounterMode(display=False)
        with counter, uncounted:
            out = model(input_ids=ids, position_ids=pos, labels=labels, use_cache=False)
            out.loss.backward()
    if uncounted.missing:
        raise MeasureError(f"ops without a FLOP formula ran (counted as 0): {sorted(uncounted.missing)}")
    return float(counter.get_total_flops()) / (batch * seq_len)


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
