"""Pipeline stages against the one-process model, in one 2-rank launch (no trainer start-up).

Run under `torch.distributed.run --nproc_per_node 2`; argv[1] is a JSON list of cases
`{"model": {...}, "schedule": ..., "accum": n, "checkpointing": "none" | "selective" | "full",
"compile": backend or absent}` (the pipeline's activation checkpointing and per-block compile;
the reference runs eagerly without). A compiled case also reports how many graphs dynamo made. For each case both ranks build the
pipeline engine, rank 0 also the one-process model (same seed); two optimizer steps over
the same packed micro-batches (positions restart mid-row, some labels -100), then one
evaluation batch. Rank 0 prints one JSON line: per case, the pairs (pipeline, reference)
of loss, gradient norm and eval loss.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from typing import Any


def _batches(accum: int, micro: int, seq: int, vocab: int, step: int) -> list[dict[str, Any]]:
    import numpy as np

    rng = np.random.default_rng(100 + step)
    out = []
    for _ in range(accum):
        ids = rng.integers(0, vocab, (micro, seq), dtype=np.int64)
        pos = np.tile(np.arange(seq, dtype=np.int64), (micro, 1))
        pos[:, seq // 2:] -= seq // 2  # a second packed document: document masking must cross stages
        labels = ids.copy()
        labels[:, :3] = -100
        out.append({"input_ids": ids, "position_ids": pos, "labels": labels, "sources": ["code"] * micro})
    return out


def _reference_step(model: Any, optimizer: Any, batches: list[dict[str, Any]], max_norm: float) -> tuple[float, float]:
    """trainer/step.py's arithmetic on one process: token-weighted micro-batch losses."""
    import torch

    counts = [int((b["labels"][:, 1:] != -100).sum()) for b in batches]
    total, loss_value = float(sum(counts)), 0.0
    for b, n in zip(batches, counts, strict=True):
        inputs = {k: torch.from_numpy(b[k]) for k in ("input_ids", "labels", "position_ids")}
        part = model(**inputs, use_cache=False).loss * (n / total)
        part.backward()
        loss_value += float(part.detach())
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_value, norm


def _block_path(spec: Any, shell: Any) -> str:
    from trainer.pipeline_parallel import _block_container

    container, _ = _block_container(spec.model, shell)
    return next(name for name, module in shell.named_modules() if module is container)


def run_case(case: dict[str, Any], rank: int) -> dict[str, Any]:
    import torch

    from tests.infra.trainer_runs import spec_dict
    from trainer.collectives import Collectives
    from trainer.faults import FaultPlan
    from trainer.optim import build_optimizer, build_scheduler
    from trainer.parallel import ParallelDims, build_model
    from trainer.pipeline_parallel import PipelineEngine, PipelineSchedule
    from trainer.step import StepRunner
    from validation.plan.memory import checkpointed_blocks
    from validation.spec import ExperimentSpec

    d = spec_dict(grad_accum_steps=case["accum"], micro_batch_size=2, warmup_steps=0, grad_clip=0.5,
                  activation_checkpointing=case.get("checkpointing", "none"))
    d["model"] = case["model"]
    d["resource"] = {"cpu_processes": 2}
    d["parallel"] = {"dp": 1, "pp": 2, "pp_schedule": case["schedule"]}
    spec = ExperimentSpec.model_validate(d)
    seq, vocab, seed = spec.data.seq_len, spec.model.vocab_size, spec.train.seed
    device = torch.device("cpu")
    dims = ParallelDims.from_layout(spec.parallel_layout(), 2, rank).build(device.type)
    engine = PipelineEngine(spec, dims, device, seed, compile_backend=case.get("compile"))
    # The blocks this rank recomputes are those the spec's checkpointing names among its own.
    mine = {i for s in engine.layout.my_stages() for i in engine.layout.split[s]}
    wrapped = {int(i) for stage in engine.stages for i, block in stage.shell.get_submodule(
        _block_path(spec, stage.shell))._modules.items()
        if getattr(getattr(block.forward, "_torchdynamo_orig_callable", block.forward), "recomputes", False)}
    assert wrapped == mine & set(checkpointed_blocks(spec.model.num_layers, case.get("checkpointing", "none"))), wrapped
    optimizer = build_optimizer(engine.holder, spec.train, spec.model)
    scheduler = build_scheduler(optimizer, spec.train, 10)
    comm = Collectives(2, device)
    runner = StepRunner(PipelineSchedule(engine, comm, contextlib.nullcontext), optimizer, scheduler, comm,
                        FaultPlan(), 0.5)
    ref = ref_opt = ref_sched = None
    if rank == 0:
        ref = build_model(spec, ParallelDims(world=1, rank=0, dp=1, tp=1, fsdp=False), device, seed)
        ref_opt = build_optimizer(ref, spec.train, spec.model)
        ref_sched = build_scheduler(ref_opt, spec.train, 10)
    out: dict[str, Any] = {"loss": [], "grad_norm": []}
    for step in range(2):
        batches = _batches(case["accum"], 2, seq, vocab, step)
        res = runner(step, batches, False)
        if rank == 0:
            loss, norm = _reference_step(ref, ref_opt, batches, 0.5)
            ref_sched.step()
            out["loss"].append((res.loss, loss))
            out["grad_norm"].append((res.grad_norm, norm))
    batch = _batches(1, 4, seq, vocab, 9)[0]
    tensors = {k: torch.from_numpy(batch[k]) for k in ("input_ids", "labels", "position_ids")}
    with torch.no_grad():
        staged = float(engine.eval_forward(tensors["input_ids"], tensors["position_ids"], tensors["labels"]))
        if rank == 0:
            out["eval"] = [(staged, float(ref(**tensors, use_cache=False).loss))]
    if case.get("compile"):
        from torch._dynamo.utils import counters

        out["graphs"] = int(counters["stats"]["unique_graphs"])
        counters.clear()
    return out


def main() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = [run_case(case, rank) for case in json.loads(sys.argv[1])]
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    dist.destroy_process_group()


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12) if math.isfinite(a) and math.isfinite(b) else math.inf


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
