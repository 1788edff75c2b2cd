"""Planner vs executor: per-rank memory and step time of DDP, FSDP2 and FSDP+TP on CPU.

    .venv/bin/python bench/bench_parallel_memory.py [--steps 6] [--layouts ddp,fsdp,fsdp_tp_1x2,fsdp_tp_2x1]
                                                    [--micro 4] [--seq 256] [--no-append]

A ~50M-parameter Llama (hidden 512, 10 layers, 8 heads, vocab 16384, untied embeddings:
48.9M parameters) trains a few AdamW steps (fp32, clip 1.0) on 2 CPU processes started by
`torchrun` (gloo, OMP_NUM_THREADS=1), once per layout:

  ddp          the model replicated, `DistributedDataParallel` (accelerate's defaults: gradients
               copied into separate 25 MiB buckets, `gradient_as_bucket_view=False`);
  fsdp         FSDP2 `fully_shard` on every decoder layer, on `embed_tokens` and on `lm_head`
               (their own groups), then the root; parameters created on the meta device and
               materialised shard by shard (`to_empty` + init), so no rank holds the full model;
  fsdp_tp_AxB  a 2-D mesh (dp=A, tp=B): DTensor `parallelize_module` (q/k/v/gate/up column-wise,
               o/down row-wise, embedding row-wise, LM head column-wise with replicated logits),
               then FSDP2 over the dp dimension.

Every rank reports its RSS (from /proc/self/status, with `MALLOC_MMAP_THRESHOLD_=65536` so
that glibc returns freed tensors to the OS instead of keeping them in its heap) at three
points: after imports + process group (the *import baseline*), between steps (*steady*: weights,
optimizer state and whatever the wrapper keeps), and the high-water mark during the timed steps
(*peak*, VmHWM reset with /proc/self/clear_refs after the first step). The planner's estimate
comes from `validation.plan.estimate_memory` for the same spec and layout; the comparison
is `peak above baseline` vs `estimate - framework overhead` (the overhead constant models the
interpreter, torch and gloo, which the baseline contains) and `absolute peak` vs `estimate`.
Appends a section "parallel memory" to bench/RESULTS.md.

The parallel functions live here until the trainer has its own (trainer/parallel*.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from scaffold import (
    REPO,
    RESULTS_DIR,
    append_results_md,
    child_env,
    cpu_model,
    experiment,
    torchrun,
    utc_stamp,
    write_results_json,
)

MIB = 2**20
AGREEMENT = 0.30
"""The planner's estimate must be within +-30 % of the measured per-rank peak (issue 12, part 4)."""
RESULTS_JSON = RESULTS_DIR / "parallel_memory.json"
LAYOUTS = ("ddp", "fsdp", "fsdp_tp_1x2", "fsdp_tp_2x1")
MODEL = {"model_type": "llama", "hidden_size": 512, "num_layers": 10, "num_heads": 8, "vocab_size": 16384,
         "tie_word_embeddings": False, "max_position_embeddings": 1024}


def bench_spec(layout: str, micro: int, seq: int, world: int = 2) -> Any:
    from validation.spec import ExperimentSpec

    return ExperimentSpec.model_validate(experiment(
        "bench-parallel-memory", "The planner's memory estimate matches what each rank really holds.",
        "perf/peak_mem_gb", "decrease",
        model=MODEL | {"max_position_embeddings": max(seq, 16)},
        data={"sources": [{"name": "code", "path": "data/demo/code.jsonl", "weight": 1.0}], "seq_len": seq},
        train={"max_steps": 10, "micro_batch_size": micro, "precision": "fp32"},
        parallel=layout_dict(layout, world),
        resource={"cpu_processes": world, "gpu_memory_gb": 64},
    ))


def layout_dict(layout: str, world: int) -> dict[str, Any]:
    if layout == "ddp":
        return {"dp": world}
    if layout == "fsdp":
        return {"dp": world, "fsdp": True}
    dp, tp = (int(x) for x in layout.rsplit("_", 1)[1].split("x"))
    return {"dp": dp, "tp": tp, "fsdp": True}


# ----------------------------------------------------------------------------- worker (one rank)


def rss_bytes(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not permitted."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def init_rope_buffers(model: Any) -> None:
    """`to_empty` leaves non-persistent buffers uninitialised: recompute the rotary frequencies
    with the function each rotary module was built with (its `rope_type`'s, as transformers picks
    it). Until issue 41 the body sat under the `continue` and never ran; no measured figure was
    wrong for it, because transformers 5.x's `_init_weights`, which the benches apply first,
    recomputes the rotary buffers itself (bench/RESULTS.md, "init_rope_buffers"). This keeps the
    benches right without that (transformers 4.x, or no `_init_weights`):
    tests/unit/test_gpu_check.py holds it."""
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for module in model.modules():
        default = getattr(module, "compute_default_rope_parameters", None)
        if default is None or not hasattr(module, "inv_freq"):
            continue
        rope_type = getattr(module, "rope_type", "default")
        fn = default if rope_type == "default" else ROPE_INIT_FUNCTIONS[rope_type]
        inv_freq, module.attention_scaling = fn(module.config)
        with torch.no_grad():
            module.inv_freq.copy_(inv_freq)
            if hasattr(module, "original_inv_freq"):
                module.original_inv_freq.copy_(inv_freq)


def apply_tp(model: Any, tp_mesh: Any) -> None:
    """Megatron-style tensor parallelism with DTensor (torchtitan's plan for Llama)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    parallelize_module(model, tp_mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "lm_head": ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
    })
    plan = {
        "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel(),
    }
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, plan)


def apply_fsdp(model: Any, dp_mesh: Any) -> None:
    """FSDP2: one group per decoder layer, the embedding and the LM head their own, then the root."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(model.model.embed_tokens, mesh=dp_mesh)
    fully_shard(model.lm_head, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)


def clip_grad_norm(params: list[Any], max_norm: float) -> Any:
    """Global gradient-norm clip over DTensors on different meshes (TP'd matrices live on the 2-D
    mesh, norms on the dp mesh only): `torch.nn.utils.clip_grad_norm_` stacks the per-tensor
    norms and DTensor refuses to stack across meshes, so reduce each mesh's group separately."""
    import torch

    groups: dict[Any, list[Any]] = {}
    for p in params:
        if p.grad is not None:
            groups.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
    squares = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], 2.0)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        squares.append(norm**2)
    total = torch.stack(squares).sum().sqrt()
    for group in groups.values():  # the foreach multiply refuses mixed meshes too
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


def build_with_trainer(layout: str, micro: int, seq: int, world: int) -> Any:
    """The trainer's own executor (trainer/parallel.py): what `python -m trainer` runs."""
    import torch
    import torch.distributed as dist

    from trainer.parallel import Topology, make_mesh
    from trainer.parallel import build_model as trainer_build_model

    spec = bench_spec(layout, micro, seq, world)
    topo = Topology.from_layout(spec.parallel_layout(), world, dist.get_rank())
    mesh = make_mesh(topo, "cpu") if topo.sharded else None
    model = trainer_build_model(spec, topo, torch.device("cpu"), seed=0, mesh=mesh)
    if not topo.sharded:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model), model  # accelerate's defaults (no bucket views)
    return model, model


def build(layout: str, micro: int, seq: int, world: int) -> Any:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    spec = bench_spec(layout, micro, seq, world)
    torch.manual_seed(0)
    if layout == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = spec.model.build()
        return DistributedDataParallel(model), model
    lay = layout_dict(layout, world)
    dp, tp = lay["dp"], lay.get("tp", 1)
    with torch.device("meta"):
        model = spec.model.build()
    if tp > 1:
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        apply_tp(model, mesh["tp"])
        apply_fsdp(model, mesh["dp"])
    elif layout == "fsdp":
        apply_fsdp(model, init_device_mesh("cpu", (world,), mesh_dim_names=("dp",)))
    else:  # fsdp_tp_2x1: the same 2-D mesh code path with a trivial tp dimension
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        apply_fsdp(model, mesh["dp"])
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.apply(model._init_weights)
    init_rope_buffers(model)
    return model, model


def worker(args: argparse.Namespace) -> None:
    import accelerate  # noqa: F401 - trainer/parallel.py imports it lazily
    import torch
    import torch.distributed as dist
    import torch.distributed.fsdp  # noqa: F401 - every module the run imports is part of the baseline
    import torch.distributed.tensor.parallel  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401

    import trainer.parallel  # noqa: F401
    from trainer.optim import build_optimizer

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    baseline = rss_bytes()

    builder = build_with_trainer if args.executor == "trainer" else build
    wrapped, inner = builder(args.layout, args.micro, args.seq, world)
    local_params = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in inner.parameters())
    spec = bench_spec(args.layout, args.micro, args.seq, world)
    opt = build_optimizer(inner, spec.train, spec.model)
    after_build = rss_bytes()
    gen = torch.Generator().manual_seed(1000 + (rank if args.layout in ("ddp", "fsdp", "fsdp_tp_2x1") else 0))
    steady, times, losses = [], [], []
    peak_reset = False
    for step in range(args.steps):
        ids = torch.randint(0, MODEL["vocab_size"], (args.micro, args.seq), generator=gen)
        dist.barrier()
        t0 = time.perf_counter()
        loss = wrapped(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        clip_grad_norm(list(inner.parameters()), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = float(loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss.detach())
        times.append(time.perf_counter() - t0)
        losses.append(loss_value)
        steady.append(rss_bytes())
        if step == 0:
            peak_reset = reset_peak()
    peak = rss_bytes("VmHWM") if peak_reset else max(steady)
    out = {"rank": rank, "baseline": baseline, "after_build": after_build, "steady": statistics.median(steady[1:]),
           "peak": peak, "peak_exact": peak_reset, "step_s": statistics.median(times[1:]),
           "local_params": local_params, "losses": losses}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, out)
    if rank == 0:
        print("RESULT " + json.dumps(gathered), flush=True)
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- driver


def run_layout(layout: str, steps: int, micro: int, seq: int, executor: str = "trainer") -> list[dict[str, Any]]:
    env = child_env(OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536")
    cmd = torchrun(__file__, "--worker", "--layout", layout, "--steps", str(steps), "--micro", str(micro),
                   "--seq", str(seq), "--executor", executor)
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return list(json.loads(line[len("RESULT "):]))
    raise RuntimeError(f"{layout}: no result (exit {proc.returncode})\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")


def planner(layout: str, micro: int, seq: int) -> Any:
    from validation.plan import estimate_memory

    spec = bench_spec(layout, micro, seq)
    return estimate_memory(spec, spec.parallel_layout())


def compare(layout: str, ranks: list[dict[str, Any]], micro: int, seq: int) -> dict[str, Any]:
    est = planner(layout, micro, seq)
    states = est.weights_bytes + est.gradients_bytes + est.optimizer_bytes
    without_overhead = est.total_bytes - est.overhead_bytes
    worst = max(ranks, key=lambda r: r["peak"] - r["baseline"])
    peak_above = worst["peak"] - worst["baseline"]
    return {
        "layout": layout,
        "local_params": [r["local_params"] for r in ranks],
        "baseline_mib": max(r["baseline"] for r in ranks) / MIB,
        "steady_above_mib": max(r["steady"] - r["baseline"] for r in ranks) / MIB,
        "peak_above_mib": peak_above / MIB,
        "peak_abs_mib": max(r["peak"] for r in ranks) / MIB,
        "peak_exact": all(r["peak_exact"] for r in ranks),
        "step_s": max(r["step_s"] for r in ranks),
        "est_states_mib": states / MIB,
        "est_wrapper_mib": est.wrapper_bytes / MIB,
        "est_activations_mib": est.activations_bytes / MIB,
        "est_logits_mib": est.logits_bytes / MIB,
        "est_above_mib": without_overhead / MIB,
        "est_total_mib": est.total_bytes / MIB,
        "ratio_above": without_overhead / peak_above,
        "ratio_total": est.total_bytes / max(r["peak"] for r in ranks),
        "losses_rank0": [round(x, 4) for x in ranks[0]["losses"]],
    }


def machine() -> dict[str, str]:
    import torch
    import transformers

    return {"nproc": str(os.cpu_count()), "cpu": cpu_model(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "kernel": platform.release(),
            "date": utc_stamp()}


def append_results(rows: list[dict[str, Any]], args: argparse.Namespace, n_params: int) -> None:
    m = machine()
    lines = [
        "",
        f"## parallel memory: planner vs executor ({m['date']})",
        "",
        f"Machine: {m['nproc']} CPUs, {m['cpu']}, Linux {m['kernel']}, shared with other sessions (1-min load "
        f"{os.getloadavg()[0]:.1f} at the end); Python {m['python']}, torch {m['torch']}, transformers "
        f"{m['transformers']}. 2 ranks (torchrun, gloo, OMP_NUM_THREADS=1, MALLOC_MMAP_THRESHOLD_=65536).",
        f"Llama hidden 512 x 10 layers, vocab 16384 untied ({n_params / 1e6:.1f}M parameters), fp32, AdamW, "
        f"micro batch {args.micro} x seq {args.seq}, {args.steps} steps (first not timed); "
        "`python bench/bench_parallel_memory.py`. Memory per rank (the larger of the two), MiB; *above* = above "
        "the import baseline (interpreter + torch + transformers + gloo process group); estimate = "
        "`validation.plan.estimate_memory` for the same spec and layout (*above*: without its "
        "framework-overhead constant).",
        "",
        "| layout | params/rank | baseline | steady above | peak above | est. above (states + ddp/fsdp + act + logits) | "
        "est/measured above | peak abs | est. total | est/measured total | step s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['layout']} | {max(r['local_params']) / 1e6:.1f}M | {r['baseline_mib']:.0f} | "
            f"{r['steady_above_mib']:.0f} | {r['peak_above_mib']:.0f} | {r['est_above_mib']:.0f} "
            f"({r['est_states_mib']:.0f} + {r['est_wrapper_mib']:.0f} + {r['est_activations_mib']:.0f} + "
            f"{r['est_logits_mib']:.0f}) | "
            f"{r['ratio_above']:.2f} | {r['peak_abs_mib']:.0f} | {r['est_total_mib']:.0f} | {r['ratio_total']:.2f} | "
            f"{r['step_s']:.2f} |")
    lines.append("")
    lines.append("Agreement rule (tests/unit/test_preflight_memory.py, on the figures in bench/results/parallel_memory.json): "
                 f"estimate / measured peak above the baseline within 1 +- {AGREEMENT}.")
    lines.append("")
    path = append_results_md("\n".join(lines))
    print(f"appended to {path}")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--layout", default="ddp")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--executor", choices=("trainer", "bench"), default="trainer",
                        help="trainer: trainer/parallel.py builds the sharded model (what runs); "
                             "bench: this script's own FSDP/TP functions")
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return []
    rows = []
    for layout in args.layouts.split(","):
        ranks = run_layout(layout, args.steps, args.micro, args.seq, args.executor)
        row = compare(layout, ranks, args.micro, args.seq)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if not args.no_append:
        append_results(rows, args, bench_spec("ddp", args.micro, args.seq).model.parameter_count())
        write_results_json(RESULTS_JSON.stem, {"machine": machine(), "micro": args.micro, "seq": args.seq,
                                               "steps": args.steps, "rows": rows})
    return rows


if __name__ == "__main__":
    main()
