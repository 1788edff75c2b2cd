"""The parts of `bench/gpu_check.py`, each run in its own process with its own time limit.

Every part is a function of a `PartContext` (the prepared plan, the carried data, the device, a
deadline) that records its figures as it goes (`ctx.record`): a part killed at its limit leaves
what it had measured. Nothing here branches on the profile: the rehearsal (a tiny model on a CPU)
and the GPU run differ only by the device and the plan's numbers.

  device      the device, the stack's versions, a matrix-product ceiling (and the fork check: it is
              the first part, and the CUDA context it makes must come up in a forked process)
  memory      one layout of the ~1.3B model: the trainer's own loop for a few steps, then the
              allocator's peak (max_memory_allocated, max_memory_reserved, device used) beside the
              dry run's tracked peak and the analytic plan computed on the CPU machine beforehand
  resume      `python -m trainer`'s entry point three times: a reference run, a run killed with
              SIGKILL mid-training, and its resumption; losses and parameters compared bitwise
  export      a short trainer run to its export (RUN/model), loaded by transformers'
              AutoModelForCausalLM / AutoTokenizer on the device: logits against the trainer's
  throughput  bench/gpu_bench.py's five systems, interleaved repeats, medians, MFU
  compile     the trainer with `train.compile` against eager: tokens/s, compile time, losses
"""

from __future__ import annotations

import json
import math
import os
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GB = 1e9


def clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities as None, tuples as lists, numbers as numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(clean(data), indent=1, default=str))
    os.replace(tmp, path)


@dataclass
class PartContext:
    """What a part gets: its name and arguments, the plan, the carried folder, a scratch folder,
    the device, and the moment (time.monotonic) its process will be killed."""

    name: str
    args: dict[str, Any]
    plan: dict[str, Any]
    carry: Path
    work: Path
    result_path: Path
    deadline: float
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> str:
        return str(self.plan["device"])

    def record(self, **figures: Any) -> None:
        """Merge `figures` into this part's result and write it (atomically) now."""
        self.figures.update(figures)
        write_json(self.result_path, self.figures)

    def spec(self, key: str) -> Any:
        from validation.spec import ExperimentSpec

        return ExperimentSpec.model_validate(self.plan["specs"][key])

    def prepared(self) -> Any:
        from validation.data.prepared import PreparedData

        return PreparedData.open(self.carry / self.plan["data_dir"], verify=False)

    def left(self) -> float:
        return self.deadline - time.monotonic()


def packed_rows(prepared: Any, spec: Any, steps: int | None = None) -> list[dict[str, Any]]:
    """The rows the trainer reads for `spec` (its batcher, its seed, rank 0 of 1): the same rows
    for every system."""
    from trainer.batches import MixtureBatcher

    tr = spec.train
    batcher = MixtureBatcher(prepared, spec.data.weights(), spec.data.seq_len, tr.micro_batch_size, 1, tr.seed, 0, 1)
    return [batcher.batch(s, 0) for s in range(steps or tr.max_steps)]


def peak_flops(device: str, precision: str) -> tuple[float, str]:
    """The device's dense peak FLOP/s for MFU, and where the number comes from (validation/flops.py)."""
    import torch

    from validation.flops import CPU_BF16_PEAK_FACTOR, CPU_PEAK_TFLOPS_PER_THREAD, peak_tflops_for_device_name

    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        tflops = peak_tflops_for_device_name(name)
        if tflops is None:
            return float("nan"), f"unknown device {name!r}: not in validation.flops.PEAK_TFLOPS_BF16"
        return tflops * 1e12, f"{name}: {tflops:g} TFLOPS bf16 dense (validation.flops)"
    factor = CPU_BF16_PEAK_FACTOR if precision == "bf16" else 1.0
    threads = torch.get_num_threads()
    return (CPU_PEAK_TFLOPS_PER_THREAD * factor * threads * 1e12,
            f"cpu: {CPU_PEAK_TFLOPS_PER_THREAD * factor:g} TFLOPS per thread x {threads}")


def device_memory(device: str) -> dict[str, Any]:
    """The allocator's and the device's view after the steps (nothing freed yet). On a CPU: the
    process's peak and current resident memory."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return {"max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved(),
                "allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
                "device_used": total - free, "device_total": total}
    rss = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return {"max_allocated": None, "max_reserved": None, "allocated": None, "reserved": None,
            "device_used": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "rss": rss,
            "device_total": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")}


# ----------------------------------------------------------------------------- device


def part_device(ctx: PartContext) -> None:
    import platform

    import accelerate
    import torch
    import transformers

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "cuda": torch.version.cuda, "transformers": transformers.__version__,
                            "accelerate": accelerate.__version__, "pid": os.getpid(), "cpus": os.cpu_count()}
    precision = ctx.plan["precision"]
    peak, source = peak_flops(ctx.device, precision)
    info |= {"peak_flops": peak, "peak_source": source}
    if ctx.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        info |= {"name": torch.cuda.get_device_name(0), "capability": f"{props.major}.{props.minor}",
                 "multiprocessors": props.multi_processor_count, "memory_total": total, "memory_free": free,
                 "bf16": torch.cuda.is_bf16_supported(),
                 "nccl": _nccl_version(),
                 "allocator_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
        info["smi"] = _nvidia_smi()
    else:
        from scaffold import cpu_model

        info |= {"name": cpu_model(), "threads": torch.get_num_threads()}
    ctx.record(**info)
    n = int(ctx.args.get("matmul_n", 8192))
    ctx.record(matmul=_matmul_ceiling(ctx.device, n, precision))


def _nccl_version() -> str | None:
    import torch

    try:
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a fact for the record, not a failure
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _nvidia_smi() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        return out.stdout.strip() or out.stderr.strip()[:200]
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}"


def _matmul_ceiling(device: str, n: int, precision: str) -> dict[str, Any]:
    """Dense matrix products of n x n in the run's precision: 3 untimed, 10 timed."""
    import torch

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / 10
    return {"n": n, "dtype": str(dtype), "tflops": 2 * n**3 / seconds / 1e12}


# ----------------------------------------------------------------------------- memory


def part_memory(ctx: PartContext) -> None:
    from gpu_bench import _build_trainer, skip_end_of_run

    layout = ctx.args["layout"]
    dry = ctx.plan["dry_runs"].get(layout)
    ctx.record(layout=layout, dry_run=dry)
    spec = ctx.spec(f"memory-{layout}")
    import torch

    if ctx.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer, init_s = _build_trainer(spec, ctx.prepared(), ctx.work)
    ctx.record(init_s=init_s, sharded=trainer.topo.sharded, activation_checkpointing=spec.train.activation_checkpointing,
               micro_batch_size=spec.train.micro_batch_size, seq_len=spec.data.seq_len,
               after_build=device_memory(ctx.device))
    t0 = time.perf_counter()
    skip_end_of_run(trainer, lambda tr: {"memory": device_memory(ctx.device)})
    result, _ = trainer.run()
    real = result["memory"]
    losses = [loss for _, loss in trainer.step_losses]
    # An out-of-memory step halves the micro batch and goes on: then the peak is not the planned step's.
    ctx.record(real=real, steps=len(losses), losses=losses, step_s=(time.perf_counter() - t0) / max(1, len(losses)),
               micro_batch_size_at_end=trainer.state.micro_batch_size, oom_fallbacks=trainer.state.oom_fallbacks,
               comparison=compare_memory(dry, real) if dry and not trainer.state.oom_fallbacks else None)


def compare_memory(dry: dict[str, Any], real: dict[str, Any]) -> dict[str, Any]:
    """Prediction / measurement, like with like: tensors (the dry run's tracked peak and the plan
    without its overhead) against the allocator's allocated peak; what the device must hold (the
    dry run's peak with its unseen constants, the plan's total) against the device's used memory."""

    def ratio(a: Any, b: Any) -> float | None:
        return a / b if a and b else None

    allocated, used = real.get("max_allocated"), real.get("device_used")
    out = {
        "tracked/allocated": ratio(dry["tracked_bytes"], allocated),
        "analytic/allocated": ratio(dry["analytic_tracked_bytes"], allocated),
        "dry_peak/device_used": ratio(dry["peak_bytes"], used),
        "analytic_total/device_used": ratio(dry["analytic_bytes"], used),
        "reserved/allocated": ratio(real.get("max_reserved"), allocated),
    }
    if real.get("max_reserved") and used:
        out["outside_allocator_bytes"] = used - real["max_reserved"]  # context, NCCL, workspaces
        out["planned_outside_allocator_bytes"] = sum(v for k, v in dry["unseen"].items()
                                                     if k != "allocator_fragmentation")
    return out


# ----------------------------------------------------------------------------- resume


def part_resume(ctx: PartContext) -> None:
    """Reference run; the same run SIGKILLed after step `kill_at` (the trainer's fault injection
    kills its own process: no handler runs, as with kill -9) between checkpoints; resumed. The
    three are `python -m trainer`'s entry point (`trainer.entry.main`) in forked processes."""
    resolved = ctx.plan["resolved"]["resume"]
    kill_at = int(ctx.args["kill_at"])
    data_dir = ctx.carry / ctx.plan["data_dir"]
    runs = {}
    for name, env in (("reference", {}), ("killed", {"TRAINER_FAULT_SIGKILL_AT_STEP": str(kill_at)}), ("resumed", {})):
        run_dir = ctx.work / ("reference" if name == "reference" else "killed")
        run_dir.mkdir(parents=True, exist_ok=True)
        spec_path = run_dir / "spec.resolved.json"
        spec_path.write_text(json.dumps(resolved))
        argv = ["--spec", str(spec_path), "--run-dir", str(run_dir), "--data-dir", str(data_dir), "--tracking-uri", "none"]
        t0 = time.perf_counter()
        status = run_forked(lambda argv=argv, env=env: _entry(argv, env), timeout=max(5.0, ctx.left() - 2),
                            log=ctx.work / f"{name}.log")
        runs[name] = {"exit": status, "seconds": time.perf_counter() - t0}
        ctx.record(runs=runs)
        if name == "reference" and status != 0:
            raise RuntimeError(f"the reference run exited {status}: {last_line(ctx.work / 'reference.log')}")
    ref, killed = ctx.work / "reference", ctx.work / "killed"
    result = json.loads((killed / "result.json").read_text()) if (killed / "result.json").is_file() else {}
    ref_result = json.loads((ref / "result.json").read_text())
    ref_losses, losses = step_losses(ref), step_losses(killed)
    after = {s: v for s, v in losses.items() if s > kill_at}
    before = {s: v for s, v in losses.items() if s <= kill_at}
    ctx.record(
        # Steps the killed run took before it died, against the reference: unequal means the device's
        # kernels differ run to run (not the resume's fault), which the later comparison inherits.
        before_kill_bitwise_equal=bool(before) and all(ref_losses.get(s) == v for s, v in before.items()),
        kill_at=kill_at, killed_by_sigkill=runs["killed"]["exit"] == -signal.SIGKILL,
        resumed_from=result.get("resumed_from"), steps=ref_result.get("steps"),
        losses_compared=len(after),
        losses_bitwise_equal=bool(after) and all(ref_losses.get(s) == v for s, v in after.items()),
        max_loss_diff=max((abs(ref_losses[s] - v) for s, v in after.items() if s in ref_losses), default=None),
        param_checksums={"reference": ref_result.get("param_checksums"), "resumed": result.get("param_checksums")},
        params_bitwise_equal=bool(result) and result.get("param_checksums") == ref_result.get("param_checksums"),
        ran_on=(ref_result.get("env") or {}).get("gpu_model") or "cpu",
    )


def _entry(argv: list[str], env: dict[str, str]) -> int:
    os.environ.update(env)
    from trainer.entry import main

    return int(main(argv))


def step_losses(run_dir: Path) -> dict[int, float]:
    """train/loss per step from RUN/metrics.jsonl (each step recorded once, a resumed run too)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    points = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {int(p["step"]): float(p["value"]) for p in points if p.get("key") == "train/loss"}


def run_forked(fn: Callable[[], int], timeout: float, log: Path | None) -> int:
    """`fn()` in a forked process (stdout and stderr to `log`, or this process's), its return
    value the exit code; killed after `timeout`. It stays in this process's group, so a part killed
    at its limit takes it along. The exit code, or -signal."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        code = 70
        try:
            if log is not None:
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
            code = fn()
        except BaseException:  # noqa: BLE001 - the child reports and exits, whatever happened
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return wait_or_kill(pid, timeout)


def wait_or_kill(pid: int, timeout: float) -> int:
    """Wait for child `pid`; past `timeout` seconds kill it (its process group where it leads one).
    The exit code, or -signal."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)


def last_line(path: Path) -> str:
    """The last non-empty line of a log (the error a failed run printed last)."""
    lines = [line for line in tail(path).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# ----------------------------------------------------------------------------- export


def part_export(ctx: PartContext) -> None:
    """A short run to its end (final checkpoint, evaluation, export), then the export as the
    ecosystem loads it: transformers' Auto classes on the device, logits against the trainer's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.loop import Trainer

    spec = ctx.spec("export")
    prepared = ctx.prepared()
    run_dir = ctx.work / "run"
    trainer = Trainer(spec, run_dir, prepared.path, tracking_uri="none", prepared=prepared, console_level="WARNING")
    result, code = trainer.run()
    ctx.record(run_exit=code, run_status=result.get("status"), export_files=sorted(p.name for p in (run_dir / "model").iterdir()))
    device = trainer.device
    rows = packed_rows(prepared, spec, 1)[0]
    ids = torch.from_numpy(rows["input_ids"][:2]).to(device)
    tol = ctx.args["tolerance"]
    loaded = AutoModelForCausalLM.from_pretrained(run_dir / "model", dtype=torch.float32).to(device).eval()
    trained = trainer.raw_model.eval()
    with torch.no_grad():
        # The trainer's model as it runs (its forward carries the run's autocast) against the export
        # under the same autocast; then in fp32 against a plain copy of the architecture holding
        # the trainer's weights (what the export file must reproduce exactly).
        ours = trained(input_ids=ids, use_cache=False).logits.float()
        with _autocast(device, spec.train.precision):
            theirs = loaded(input_ids=ids, use_cache=False).logits.float()
        plain = spec.model.build().to(device).eval()
        plain.load_state_dict({k: v.detach() for k, v in trainer.raw_model.state_dict().items()})
        ours32 = plain(input_ids=ids, use_cache=False).logits.float()
        theirs32 = loaded(input_ids=ids, use_cache=False).logits.float()
    trained_diff = (ours - theirs).abs().max().item()
    fp32_diff = (ours32 - theirs32).abs().max().item()
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "model")
    from tokenizers import Tokenizer

    text = "def add(a, b):\n    return a + b\n"
    same_ids = tokenizer(text)["input_ids"] == Tokenizer.from_file(str(prepared.tokenizer_path)).encode(text).ids
    ctx.record(device=str(device), loaded_device=str(next(loaded.parameters()).device),
               max_abs_diff_fp32=fp32_diff, max_abs_diff_as_trained=trained_diff, logits_scale=ours32.abs().max().item(),
               tolerance=tol, fp32_within=fp32_diff <= tol["fp32"], as_trained_within=trained_diff <= tol["as_trained"],
               tokenizer_same_ids=same_ids, argmax_agreement=(ours.argmax(-1) == theirs.argmax(-1)).float().mean().item())


def _autocast(device: Any, precision: str) -> Any:
    from gpu_bench import autocast

    return autocast(device, precision)


# ----------------------------------------------------------------------------- throughput


def part_throughput(ctx: PartContext) -> None:
    from gpu_bench import measure

    role = ctx.args["role"]
    spec = ctx.spec(f"throughput-{role}")
    prepared = ctx.prepared()
    rows = packed_rows(prepared, spec)
    peak, source = peak_flops(ctx.device, spec.train.precision)
    ctx.record(role=role, params=spec.model.parameter_count(), seq_len=spec.data.seq_len,
               micro_batch_size=spec.train.micro_batch_size, steps=spec.train.max_steps,
               warmup_steps=spec.train.log_interval, precision=spec.train.precision, peak_source=source)
    measure(spec, prepared, rows, ctx.device, ctx.work, list(ctx.args["systems"]), int(ctx.args["repeats"]),
            deadline=ctx.deadline - 3, record=lambda f: ctx.record(**f), peak_flops=peak)


# ----------------------------------------------------------------------------- compile


def part_compile(ctx: PartContext) -> None:
    """The trainer eager, then with `train.compile` (each block compiled; backend from the plan:
    inductor on the GPU), on the same spec and rows."""
    from gpu_bench import _build_trainer, release, skip_end_of_run, window_rate

    from validation.spec import ExperimentSpec

    spec = ctx.spec("compile")
    prepared = ctx.prepared()
    tokens = spec.data.seq_len * spec.train.micro_batch_size
    peak, _ = peak_flops(ctx.device, spec.train.precision)
    from validation.flops import flops_per_token

    fpt = flops_per_token(spec.model, spec.data.seq_len)
    ctx.record(params=spec.model.parameter_count(), steps=spec.train.max_steps, backend=ctx.args["backend"],
               tolerance=ctx.args["tolerance"])
    out: dict[str, Any] = {}
    for mode in ("eager", "compiled"):
        run_spec = spec if mode == "eager" else ExperimentSpec.model_validate(
            spec.model_dump(mode="json") | {"train": spec.model_dump(mode="json")["train"] | {"compile": True}})
        with _compile_backend(ctx.args["backend"]):
            trainer, init_s = _build_trainer(run_spec, prepared, ctx.work)
        skip_end_of_run(trainer)
        t0 = time.perf_counter()
        trainer.run()
        done = trainer.step_done_at
        rate = window_rate(done, tokens, spec.train.log_interval)
        out[mode] = {"tokens_per_s": rate, "mfu": rate * fpt / peak, "init_s": init_s,
                     "first_step_s": done[0] - t0, "losses": [loss for _, loss in trainer.step_losses]}
        del trainer
        release(ctx.device)
        ctx.record(**out)
    eager, compiled = out["eager"]["losses"], out["compiled"]["losses"]
    diffs = [abs(a - b) for a, b in zip(eager, compiled, strict=False)]
    tol = ctx.args["tolerance"]
    ctx.record(speedup=out["compiled"]["tokens_per_s"] / out["eager"]["tokens_per_s"],
               first_step_loss_diff=diffs[0] if diffs else None, max_loss_diff=max(diffs) if diffs else None,
               losses_within=bool(diffs) and diffs[0] <= tol["first"] and max(diffs) <= tol["any"])


def _compile_backend(backend: str) -> Any:
    """The trainer compiles with inductor (trainer/loop.py); the rehearsal's CPU plan names a
    cheaper backend (compiling C++ for a tiny model on 2 cores takes minutes): the trainer's own
    `apply_compile` path with that backend, while the block is built."""
    import contextlib

    import trainer.parallel as parallel

    if backend == "inductor":
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def patched() -> Any:
        original = parallel.apply_compile
        parallel.apply_compile = lambda arch, model, _backend="inductor": original(arch, model, backend)  # type: ignore[assignment]
        try:
            yield
        finally:
            parallel.apply_compile = original

    return patched()


PARTS: dict[str, Callable[[PartContext], None]] = {
    "device": part_device, "memory": part_memory, "resume": part_resume, "export": part_export,
    "throughput": part_throughput, "compile": part_compile,
}
"""Part kind -> its function."""
