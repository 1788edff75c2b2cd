"""Eager and per-block compiled training of the tiny llama under FSDP and TP on 2 gloo processes.

`run_layouts` spawns two ranks; each builds the model through `trainer.parallel.shard_on_meta`
(TP -> compile -> FSDP, as the trainer does) for every (layout, compile backend) pair, takes a few
AdamW steps on seeded random tokens and returns rank 0's view: losses, the seconds each run
took, dynamo's graph and graph-break counts, which blocks are compiled and FSDP-wrapped.
No accelerate, no data preparation: a few seconds of imports instead of a trainer launch.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

LAYOUTS: dict[str, dict[str, Any]] = {"fsdp": {"dp": 2, "fsdp": True}, "tp": {"tp": 2}}


def _spec(parallel: dict[str, Any], train: dict[str, Any]) -> Any:
    from tests.infra.trainer_runs import spec_dict
    from validation.spec import ExperimentSpec

    raw = spec_dict(**train)
    raw["model"]["tie_word_embeddings"] = False
    raw["resource"] = {"cpu_processes": 2}
    raw["parallel"] = parallel
    return ExperimentSpec.model_validate(raw)


def _train(spec: Any, backend: str | None, rank: int, steps: int, batch: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from trainer.parallel import ParallelDims, materialize, shard_on_meta

    topo = ParallelDims.from_layout(spec.parallel_layout(), 2, rank).build("cpu")
    mesh = topo.mesh
    model, buffers = shard_on_meta(spec, topo, mesh, compile_backend=backend)
    model = materialize(model, buffers, spec.model, torch.device("cpu"), spec.train.seed)
    blocks = spec.model.blocks(model)
    seen = {"blocks_compiled": [b._compiled_call_impl is not None for b in blocks],
            "blocks_fsdp": [isinstance(b, FSDPModule) for b in blocks], "state_dict": list(model.state_dict())}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    # FSDP: each rank its own rows; TP: both ranks of the group read the same rows.
    rows = slice(rank * 2, rank * 2 + 2) if topo.dp > 1 else slice(0, 4)
    losses = []
    for _ in range(steps):
        loss = model(**{k: v[rows] for k, v in batch.items()}, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / 2)
    return seen | {"losses": losses}


def _worker(rank: int, init_file: str, runs: list[tuple[str, str | None]], steps: int, out: str,
            train: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 384, (4, 32), generator=gen)
    batch = {"input_ids": ids, "labels": ids.clone(),
             "position_ids": torch.arange(32).repeat(4, 1)}
    results: dict[str, Any] = {}
    from torch._dynamo.utils import counters

    for layout, backend in runs:
        torch._dynamo.reset()
        started = time.perf_counter()
        seen = _train(_spec(LAYOUTS[layout], train), backend, rank, steps, batch)
        results[f"{layout}/{backend or 'eager'}"] = seen | {
            "seconds": time.perf_counter() - started,
            "graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": sum(counters["graph_break"].values())}
        counters.clear()
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def run_layouts(tmp: Path, runs: list[tuple[str, str | None]], steps: int = 3, **train: Any) -> dict[str, Any]:
    """{"fsdp/eager": {"losses": [...], "seconds": s, "graphs": n, "graph_breaks": n, "blocks_compiled":
    [bool per block], "blocks_fsdp": [...], "state_dict": [names]}, "fsdp/inductor": ...} for each
    (layout, compile backend or None) in `runs`, as rank 0 saw it; `train` overrides spec fields."""
    import torch.multiprocessing as mp

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(tmp / "inductor-cache"))
    out = tmp / "losses.json"
    mp.spawn(_worker, args=(str(tmp / "pg-init"), runs, steps, str(out), train), nprocs=2, join=True)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


if __name__ == "__main__":
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        backend = os.environ.get("COMPILE_BACKEND", "inductor")
        pairs = [(layout, c) for layout in sys.argv[1:] or list(LAYOUTS) for c in (None, backend)]
        print(json.dumps(run_layouts(Path(tmp), pairs), indent=1))
