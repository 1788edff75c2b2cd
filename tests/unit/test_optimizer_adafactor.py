"""Adafactor on sharded parameters (models/optimizers/adafactor.py): FSDP2 and TP hand the optimizer
DTensor shards, whose row and column statistics are not the matrix's (torch's own step fails on
them: DTensor refuses its in-place square of a norm over the sharded dimension). The step over
shards of rows and of columns must equal torch's step over the whole tensors.

Two ranks as threads of this process (torch's threaded process group: no process, no socket).
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist


def _on_two_threads(fn: Any) -> None:
    from torch.testing._internal.distributed.multi_threaded_pg import (
        _install_threaded_pg,
        _uninstall_threaded_pg,
    )

    _install_threaded_pg()
    store = dist.HashStore()
    errors: list[BaseException] = []
    torch._C._distributed_c10d._set_thread_isolation_mode(True)

    def worker(rank: int) -> None:
        dist.init_process_group("threaded", rank=rank, world_size=2, store=store)
        try:
            fn(rank)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread
            errors.append(exc)
        finally:
            dist.destroy_process_group()

    threads = [threading.Thread(target=worker, args=(rank,)) for rank in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        _uninstall_threaded_pg()
    if errors:
        raise errors[0]


def test_adafactor_over_row_and_column_shards_takes_torchs_step_over_the_whole_matrix():
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    from models.optimizers.adafactor import optimizer_class

    gen = torch.Generator().manual_seed(0)
    # Uneven shards on purpose: 7 rows and 9 columns over 2 ranks.
    full = {"rows": torch.randn(7, 5, generator=gen), "cols": torch.randn(6, 9, generator=gen),
            "vector": torch.randn(5, generator=gen)}
    grads = [{k: torch.randn(v.shape, generator=gen) for k, v in full.items()} for _ in range(3)]

    def groups(params: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"params": [params["rows"], params["cols"]], "weight_decay": 0.1},
                {"params": [params["vector"]], "weight_decay": 0.0}]

    whole = {k: v.clone().requires_grad_() for k, v in full.items()}
    reference = torch.optim.Adafactor(groups(whole), lr=0.01, foreach=False)
    for g in grads:
        for k, p in whole.items():
            p.grad = g[k].clone()
        reference.step()

    sharded: dict[str, torch.Tensor] = {}

    def train(rank: int) -> None:
        mesh = init_device_mesh("cpu", (2,))
        placements = {"rows": [Shard(0)], "cols": [Shard(1)], "vector": [Shard(0)]}
        params = {k: torch.nn.Parameter(distribute_tensor(v.clone(), mesh, placements[k])) for k, v in full.items()}
        optimizer = optimizer_class()(groups(params), lr=0.01, foreach=False)
        for g in grads:
            for k, p in params.items():
                p.grad = distribute_tensor(g[k].clone(), mesh, placements[k])
            optimizer.step()
        gathered = {k: p.full_tensor() for k, p in params.items()}  # every rank takes part
        state = optimizer.state[params["rows"]]
        assert state["row_var"].placements[0].is_replicate() and state["row_var"].shape == (7, 1)
        if rank == 0:
            sharded.update(gathered)

    _on_two_threads(train)
    for name, p in whole.items():
        assert torch.allclose(sharded[name], p.detach(), rtol=0, atol=1e-6), name


def test_plain_tensors_take_torchs_own_step_bitwise():
    from models.optimizers.adafactor import optimizer_class

    gen = torch.Generator().manual_seed(1)
    a, b = (torch.randn(6, 4, generator=gen).requires_grad_() for _ in range(2))
    b.data.copy_(a.data)
    ours, theirs = optimizer_class()([a], lr=0.01, foreach=False), torch.optim.Adafactor([b], lr=0.01, foreach=False)
    for _ in range(2):
        g = torch.randn(6, 4, generator=gen)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    assert torch.equal(a, b)
