"""Where the trainer's time goes, next to the bare loop and HF `Trainer` (issue 12, part 5).

    .venv/bin/python bench/profile_trainer.py [--steps 10] [--precisions fp32,bf16] [--no-append]

The same model, batches and precision as bench/bench_trainer.py. Each system runs under
`torch.profiler` (CPU activities; the first 2 steps are skipped by the profiler schedule) and
the script reports, per optimizer step:
  - self CPU time by operator family (matmul, attention, elementwise, optimizer, copies/casts,
    autocast, reductions) and the operators whose time differs most from the bare loop;
  - host synchronisations: calls of `aten::_local_scalar_dense` (every `.item()`, `float(t)`,
    `.tolist()` on a tensor; on a GPU each one waits for the device);
  - Python-side costs of the trainer measured by wrapping them: the batcher, the token-count
    all-reduce (a no-op on one process; its 2-rank gloo latency is measured separately), the
    monitor (`AnomalyDetector.observe`), per-step logging, the metric sink, and accelerate's
    autocast wrapper (`convert_outputs_to_fp32`);
  - `torch.use_deterministic_algorithms(True)` (the trainer's default, `train.deterministic`): the bare
    loop with and without it.
Appends a section "trainer profile" to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_trainer import _hf_args, bench_spec, packed_batches, prepared_data, reset_accelerate
from scaffold import (
    append_results_md,
    as_tensors,
    child_env,
    examples,
    machine,
    stack_examples,
    torchrun,
    write_results_json,
)

SKIP = 2  # profiler schedule: steps not recorded (warm-up)

FAMILIES = (
    ("matmul", ("mm", "addmm", "bmm", "matmul", "linear", "_mkldnn", "mkldnn")),
    ("attention", ("attention", "sdpa", "softmax", "_flash")),
    ("optimizer", ("_foreach", "adam", "lerp", "_fused")),
    ("copy/cast", ("copy_", "to_copy", "_to_copy", "contiguous", "clone", "_copy")),
    ("embedding/loss", ("embedding", "nll_loss", "log_softmax", "cross_entropy", "index")),
    ("reduction", ("sum", "mean", "norm", "max", "min", "pow", "rsqrt", "sqrt")),
    ("elementwise", ("mul", "add", "div", "sub", "silu", "neg", "cat", "where", "ne", "cos", "sin", "exp")),
)


def family(name: str) -> str:
    short = name.removeprefix("aten::").lower()
    for fam, keys in FAMILIES:
        if any(k in short for k in keys):
            return fam
    return "other"


def summarize(prof: Any, steps: int) -> dict[str, Any]:
    """Self CPU time per step by family and by op (leaf `aten::` ops only), and host syncs per step."""
    by_op: dict[str, float] = {}
    calls: dict[str, int] = {}
    for evt in prof.recorded:
        if not evt.key.startswith("aten::"):
            continue
        by_op[evt.key] = evt.self_cpu_time_total / 1e3 / steps  # ms per step
        calls[evt.key] = evt.count // steps
    fams: dict[str, float] = collections.defaultdict(float)
    for op, ms in by_op.items():
        fams[family(op)] += ms
    return {"ops_ms": by_op, "families_ms": dict(fams), "aten_ms": sum(by_op.values()),
            "syncs_per_step": calls.get("aten::_local_scalar_dense", 0),
            "copies_per_step": calls.get("aten::copy_", 0) + calls.get("aten::_to_copy", 0)}


def profiler(steps: int) -> Any:
    from torch.profiler import ProfilerActivity, profile, schedule

    def keep(p: Any) -> None:  # the recorded cycle's events, before the schedule starts another
        p.recorded = p.key_averages()

    return profile(activities=[ProfilerActivity.CPU], on_trace_ready=keep,
                   schedule=schedule(wait=0, warmup=SKIP, active=steps - SKIP, repeat=1))


# ----------------------------------------------------------------------------- systems


def bare(prepared: Any, precision: str, steps: int, deterministic: bool) -> dict[str, Any]:
    import torch

    from trainer.model import build_model
    from trainer.optim import build_optimizer

    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    spec = bench_spec(precision, steps)
    torch.manual_seed(0)
    model = build_model(spec.model)
    opt = build_optimizer(model, spec.train, spec.model)
    batches = as_tensors(packed_batches(prepared, steps))
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext
    done, cpu = [], []
    with profiler(steps) as prof:
        for batch in batches:
            with ctx():
                loss = model(**batch, use_cache=False).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
            done.append(time.perf_counter())
            cpu.append(time.process_time())
    return summarize(prof, steps - SKIP) | {"step_ms": _per_step(done), "step_cpu_ms": _per_step(cpu)}


def _per_step(stamps: list[float]) -> float:
    return 1e3 * (stamps[-1] - stamps[SKIP - 1]) / (len(stamps) - SKIP)


class Timed:
    """Adds up the seconds spent in a wrapped callable."""

    def __init__(self, fn: Any):
        self.fn, self.seconds, self.calls = fn, 0.0, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1


def trainer(prepared: Any, precision: str, steps: int, work: Path, compile_model: bool = False) -> dict[str, Any]:
    import logging

    import accelerate.utils.operations as acc_ops

    from trainer.loop import Trainer

    reset_accelerate()
    run_dir = work / f"trainer-{precision}-{time.monotonic_ns()}"
    spec = bench_spec(precision, steps, ckpt_every=10**6)
    if compile_model:
        spec = spec.model_copy(update={"train": spec.train.model_copy(update={"compile": True})})
    tr = Trainer(spec, run_dir, prepared.path, tracking_uri=f"sqlite:///{work / 'mlflow.db'}", prepared=prepared)
    timers: dict[str, Timed] = {}

    def wrap(obj: Any, name: str, label: str) -> None:
        timers[label] = Timed(getattr(obj, name))
        setattr(obj, name, timers[label])

    wrap(tr.batcher, "batch", "batcher")
    wrap(tr.comm, "all_reduce", "all_reduce")
    # The detector's state goes into checkpoints: time it through its class, not an instance attribute.
    detector_cls = type(tr.detector)
    observe = Timed(detector_cls.observe)
    timers["monitor"] = observe
    detector_cls.observe = lambda self, *a, **k: observe(self, *a, **k)  # type: ignore[method-assign]
    wrap(tr.sink, "log_metrics", "sink.log_metrics")
    wrap(tr.sink, "flush", "sink.flush")
    wrap(tr.alerts, "drain_to_sink", "alerts.drain")
    per_step_log = Timed(logging.getLogger("trainer").handle)
    logging.getLogger("trainer").handle = per_step_log  # type: ignore[method-assign]
    timers["logging"] = per_step_log
    # Only the output conversion (ConvertOutputsToFp32.__call__ looks the function up at call time).
    convert = Timed(acc_ops.convert_to_fp32)
    acc_ops.convert_to_fp32 = convert
    timers["accelerate.convert_to_fp32"] = convert
    prof = profiler(steps)
    cpu: list[float] = []
    original = tr._faults_after_step

    def after_step() -> None:
        original()
        prof.step()
        cpu.append(time.process_time())

    tr._faults_after_step = after_step  # type: ignore[method-assign]
    try:
        prof.start()
        # Count Python-side time only inside the profiled steps (after the skipped ones).
        tr.run()
        prof.stop()
    finally:
        acc_ops.convert_to_fp32 = convert.fn
        detector_cls.observe = observe.fn  # type: ignore[method-assign]
        del logging.getLogger("trainer").handle
    done = tr.step_done_at
    out = summarize(prof, steps - SKIP) | {"step_ms": _per_step(done), "step_cpu_ms": _per_step(cpu)}
    # Wrapped costs over the whole run (init + steps + final eval), per step: an upper bound.
    out["python_ms"] = {k: 1e3 * t.seconds / steps for k, t in timers.items()}
    out["python_calls"] = {k: t.calls for k, t in timers.items()}
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def hf(prepared: Any, precision: str, steps: int, work: Path) -> dict[str, Any]:
    import torch
    from transformers import Trainer as HFTrainer
    from transformers import TrainerCallback

    from trainer.model import build_model

    reset_accelerate()
    torch.manual_seed(0)
    model = build_model(bench_spec(precision, steps).model)
    prof = profiler(steps)
    done, cpu = [], []

    class Step(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            prof.step()
            done.append(time.perf_counter())
            cpu.append(time.process_time())

    t = HFTrainer(model=model, args=_hf_args(precision, steps, work / "hf"),
                  train_dataset=examples(packed_batches(prepared, steps)), data_collator=stack_examples,
                  callbacks=[Step()])
    prof.start()
    t.train()
    prof.stop()
    return summarize(prof, steps - SKIP) | {"step_ms": _per_step(done), "step_cpu_ms": _per_step(cpu)}


# ----------------------------------------------------------------------------- AdamW implementations


def adamw_impls(precision: str, steps: int = 12, repeats: int = 3) -> dict[str, dict[str, float]]:
    """ms per `optimizer.step()` (wall and CPU, median of interleaved repeats) for the bench model's
    parameters, and the largest parameter difference from the foreach result after `steps` steps."""
    import torch

    from trainer.model import build_model

    torch.manual_seed(0)
    model = build_model(bench_spec(precision, 1).model)
    base = [p.detach().clone() for p in model.parameters()]
    grads = [torch.randn_like(p) for p in base]
    kinds = {"foreach": {"foreach": True}, "for-loop": {"foreach": False}, "fused": {"fused": True}}
    wall: dict[str, list[float]] = collections.defaultdict(list)
    cpu: dict[str, list[float]] = collections.defaultdict(list)
    final: dict[str, list[Any]] = {}
    for _ in range(repeats):
        for kind, kw in kinds.items():
            params = [b.clone().requires_grad_(True) for b in base]
            opt = torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, **kw)
            for i in range(steps):
                for p, g in zip(params, grads, strict=True):
                    p.grad = g * (1.0 + 0.1 * i)
                t0, c0 = time.perf_counter(), time.process_time()
                opt.step()
                if i >= 2:
                    wall[kind].append(time.perf_counter() - t0)
                    cpu[kind].append(time.process_time() - c0)
            final[kind] = [p.detach() for p in params]
    out = {}
    for kind in kinds:
        diff = max(float((a - b).abs().max()) for a, b in zip(final[kind], final["foreach"], strict=True))
        out[kind] = {"wall_ms": 1e3 * sorted(wall[kind])[len(wall[kind]) // 2],
                     "cpu_ms": 1e3 * sorted(cpu[kind])[len(cpu[kind]) // 2], "max_diff_vs_foreach": diff}
    return out


# ----------------------------------------------------------------------------- gloo all-reduce latency


def _allreduce_worker() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.zeros(3, dtype=torch.float64)
    for _ in range(20):
        dist.all_reduce(t)
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    us = 1e6 * (time.perf_counter() - t0) / n
    if dist.get_rank() == 0:
        print(f"ALLREDUCE_US {us:.1f}", flush=True)
    dist.destroy_process_group()


def gloo_allreduce_us() -> float:
    out = subprocess.run(torchrun(__file__, "--allreduce-worker"), env=child_env(OMP_NUM_THREADS="1"),
                         capture_output=True, text=True, timeout=300).stdout
    for line in out.splitlines():
        if line.startswith("ALLREDUCE_US "):
            return float(line.split()[1])
    return float("nan")


# ----------------------------------------------------------------------------- main


def top_differences(a: dict[str, float], b: dict[str, float], n: int = 6) -> list[tuple[str, float]]:
    keys = set(a) | set(b)
    diffs = sorted(((k, a.get(k, 0.0) - b.get(k, 0.0)) for k in keys), key=lambda kv: -abs(kv[1]))
    return [(k, round(v, 2)) for k, v in diffs[:n]]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: least disturbed by neighbours on a shared machine)")
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--allreduce-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.allreduce_worker:
        _allreduce_worker()
        return {}
    import torch

    torch.set_num_threads(args.threads)
    prepared = prepared_data()
    work = Path(tempfile.mkdtemp(prefix="profile-trainer-"))
    out: dict[str, Any] = {"machine": machine(), "steps": args.steps, "threads": args.threads}
    try:
        for precision in args.precisions.split(","):
            res = {
                "bare": bare(prepared, precision, args.steps, deterministic=False),
                "bare_deterministic": bare(prepared, precision, args.steps, deterministic=True),
                "trainer": trainer(prepared, precision, args.steps, work),
                "hf": hf(prepared, precision, args.steps, work),
            }
            torch.use_deterministic_algorithms(False)
            for name, r in res.items():
                print(f"{precision} {name}: step {r['step_ms']:.1f} ms (cpu {r['step_cpu_ms']:.1f}), aten "
                      f"{r['aten_ms']:.1f} ms, syncs {r['syncs_per_step']}, families "
                      + json.dumps({k: round(v, 1) for k, v in sorted(r['families_ms'].items())}), flush=True)
            res["trainer_minus_bare_ops"] = top_differences(res["trainer"]["ops_ms"], res["bare"]["ops_ms"])
            res["trainer_minus_bare_det_ops"] = top_differences(res["trainer"]["ops_ms"],
                                                                res["bare_deterministic"]["ops_ms"])
            print(precision, "python", json.dumps({k: round(v, 2) for k, v in res["trainer"]["python_ms"].items()}))
            print(precision, "trainer-bare ops", res["trainer_minus_bare_ops"])
            print(precision, "trainer-bare(det) ops", res["trainer_minus_bare_det_ops"])
            out[precision] = res
        out["adamw"] = adamw_impls("fp32")
        print("AdamW implementations:", json.dumps(out["adamw"]))
        out["gloo_allreduce_us"] = gloo_allreduce_us()
        print("gloo all-reduce of 3 float64, 2 ranks:", out["gloo_allreduce_us"], "us")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not args.no_append:
        append_results(out)
    write_results_json("trainer_profile", out)
    return out


def append_results(out: dict[str, Any]) -> None:
    m = out["machine"]
    lines = ["", f"## trainer profile ({m['date']})", "",
             f"Machine: {m['nproc']} cores, {m['cpu']}, shared (1-min load {os.getloadavg()[0]:.1f} at the end); "
             f"torch {m['torch']}, transformers {m['transformers']}, accelerate {m['accelerate']}. "
             f"`python bench/profile_trainer.py` ({out['steps']} steps, first {SKIP} not profiled, "
             f"{out['threads']} torch thread(s); same model and "
             "batches as bench_trainer.py). ms per optimizer step; *aten* = self CPU time of all aten ops.", "",
             "| precision | system | step ms (wall) | step ms (cpu) | aten ms | host syncs | matmul | attention | "
             "elementwise | reduction | copy/cast | optimizer | embedding/loss | other |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for precision in ("fp32", "bf16"):
        if precision not in out:
            continue
        for name in ("bare", "bare_deterministic", "trainer", "hf"):
            r = out[precision][name]
            f = r["families_ms"]
            lines.append(f"| {precision} | {name} | {r['step_ms']:.0f} | {r['step_cpu_ms']:.0f} | {r['aten_ms']:.0f} | "
                         f"{r['syncs_per_step']} | " + " | ".join(f"{f.get(k, 0.0):.1f}" for k in (
                             "matmul", "attention", "elementwise", "reduction", "copy/cast", "optimizer",
                             "embedding/loss", "other")) + " |")
    for precision in ("fp32", "bf16"):
        if precision not in out:
            continue
        py = out[precision]["trainer"]["python_ms"]
        lines.append("")
        lines.append(f"- {precision}: trainer Python-side ms per step (whole run / steps, upper bound): "
                     + ", ".join(f"{k} {v:.2f}" for k, v in py.items()))
        lines.append(f"- {precision}: ops where trainer - bare differs most (ms/step): "
                     + ", ".join(f"`{k}` {v:+.2f}" for k, v in out[precision]["trainer_minus_bare_ops"]))
        lines.append(f"- {precision}: ... vs the bare loop with deterministic algorithms: "
                     + ", ".join(f"`{k}` {v:+.2f}" for k, v in out[precision]["trainer_minus_bare_det_ops"]))
    lines.append("- AdamW `step()` on the bench model's 3.7M parameters (median ms, wall / CPU; max |param diff| "
                 "vs foreach after 12 steps): " + ", ".join(
                     f"{k} {v['wall_ms']:.1f} / {v['cpu_ms']:.1f} ({v['max_diff_vs_foreach']:.1e})"
                     for k, v in out["adamw"].items()))
    lines.append(f"- gloo all-reduce of the 3-float step flags, 2 ranks on this host: {out['gloo_allreduce_us']:.0f} us")
    lines.append("")
    append_results_md("\n".join(lines))


if __name__ == "__main__":
    main()
