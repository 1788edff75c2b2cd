"""Throughput and MFU on one device, five systems on the same packed rows: the part `throughput` of
`bench/gpu_check.py` (`make gpu-check`), which prepares the data and the specs and runs it in its own
process. (This file and the former gpu_fsdp_bench.py were the two GPU benches; both are folded here.)

Systems, interleaved per repeat (`measure`):
  bare          a plain PyTorch loop: the architecture's model built on the device, the trainer's
                optimizer factory (fused AdamW), autocast in the spec's precision, clip 1.0;
  fsdp2         the same loop with FSDP2 written by hand: `fully_shard` on every decoder layer, the
                embedding and the LM head, then the root, over a one-rank process group (NCCL on a
                GPU, gloo on a CPU); bf16 `MixedPrecisionPolicy`, parameters created on the meta
                device and materialised by `to_empty` (rotary buffers recomputed: `init_rope_buffers`);
  trainer       this project's `trainer.loop.Trainer` in one process, as `python -m trainer` runs it;
  trainer_fsdp  the same trainer with `parallel: {dp: 1, fsdp: true}` over a one-rank process group,
                its FSDP2 path forced on (the trainer leaves a world of one unsharded:
                `trainer.parallel.Topology.sharded` needs world > 1), so that its NCCL, mixed-precision
                and resharding code runs on the device;
  hf            Hugging Face `Trainer` on the same rows in the same order (sequential sampler).

Timing: every system synchronises the device only where the trainer does (every `log_interval`
steps and at the last), and tokens/s is the window from the end of step `log_interval` (the
warm-up) to the end of the last step, between two synchronised stamps. MFU = tokens/s x the
architecture's FLOPs per token (6N + attention) / the device's dense peak. The trainer's own
end-of-run work (final checkpoint, evaluation, export) is skipped: it is outside the window and
costs minutes at 1.3B (gpu_check's other parts cover it).
"""

from __future__ import annotations

import contextlib
import gc
import shutil
import socket
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SYSTEMS = ("bare", "fsdp2", "trainer", "trainer_fsdp", "hf")
COLUMNS = ("input_ids", "labels", "position_ids")


# ----------------------------------------------------------------------------- helpers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def window_rate(done_at: list[float], tokens_per_step: float, warmup: int) -> float:
    """Tokens/s from the end of step `warmup` (1-based) to the end of the last step; nan when
    there is no step after the warm-up."""
    if len(done_at) <= warmup:
        return float("nan")
    return (len(done_at) - warmup) * tokens_per_step / (done_at[-1] - done_at[warmup - 1])


def synchronize(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def release(device: Any) -> None:
    """Drop what the last system left: accelerate's singletons, garbage, the allocator's cache."""
    import torch
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_allocated_gb(device: Any) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 1e9 if torch.device(device).type == "cuda" else None


def as_tensors(rows: list[dict[str, Any]], device: Any) -> list[dict[str, Any]]:
    import torch

    return [{k: torch.from_numpy(b[k]).to(device) for k in COLUMNS} for b in rows]


def autocast(device: Any, precision: str) -> Any:
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(torch.device(device).type, dtype=dtype) if dtype else contextlib.nullcontext()


def init_rope_buffers(model: Any) -> None:
    """`to_empty` leaves non-persistent buffers uninitialised: recompute the rotary frequencies
    (bench_parallel_memory.py's function; one definition)."""
    from bench_parallel_memory import init_rope_buffers as init

    init(model)


@contextlib.contextmanager
def one_rank_group(device: Any) -> Iterator[None]:
    """A process group of one rank (NCCL on a GPU, gloo on a CPU) for the hand-written FSDP2 loop."""
    import torch
    import torch.distributed as dist

    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def trainer_one_rank_fsdp(device: Any) -> Iterator[None]:
    """The trainer's FSDP2 path on a world of one: the environment `accelerate launch` gives one
    rank (accelerate then starts the process group: NCCL, or gloo with ACCELERATE_USE_CPU), and
    `Topology.sharded` true for a world of one (the trainer's own rule keeps it unsharded)."""
    import torch
    import torch.distributed as dist

    from basics.environment import scoped_environ
    from trainer.parallel import Topology

    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "ACCELERATE_USE_CPU": "true" if torch.device(device).type == "cpu" else None}
    original = Topology.sharded
    Topology.sharded = property(lambda self: self.fsdp or self.tp > 1 or self.pp > 1)  # type: ignore[method-assign,assignment]
    try:
        with scoped_environ(**env):
            yield
    finally:
        Topology.sharded = original  # type: ignore[method-assign]
        if dist.is_initialized():
            dist.destroy_process_group()


# ----------------------------------------------------------------------------- the systems


def run_bare(spec: Any, rows: list[dict[str, Any]], device: Any, fsdp: bool = False) -> dict[str, Any]:
    """The plain loop (or its hand-written FSDP2 form): see the module doc."""
    import torch

    from trainer.optim import build_optimizer

    t0 = time.perf_counter()
    torch.manual_seed(spec.train.seed)
    log_every = spec.train.log_interval
    if fsdp:
        model = _fsdp2_model(spec, device)
    else:
        with torch.device(device):
            model = spec.model.build()
    model.train()
    opt = build_optimizer(model, spec.train, spec.model)
    batches = as_tensors(rows, device)
    synchronize(device)
    init_s = time.perf_counter() - t0
    losses, done_at = [], []
    for i, batch in enumerate(batches):
        with autocast(device, "fp32" if fsdp else spec.train.precision):  # FSDP2: its policy casts
            loss = model(**batch, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if (i + 1) % log_every == 0 or i + 1 == len(batches):
            synchronize(device)  # where the trainer reads its window of losses
        done_at.append(time.perf_counter())
    values = torch.stack(losses).float().tolist()
    peak = peak_allocated_gb(device)
    del model, opt, batches
    tokens = spec.data.seq_len * spec.train.micro_batch_size
    return {"tokens_per_s": window_rate(done_at, tokens, log_every), "init_s": init_s,
            "loss_first": values[0], "loss_last": values[-1], "peak_allocated_gb": peak}


def _fsdp2_model(spec: Any, device: Any) -> Any:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    with torch.device("meta"):
        model = spec.model.build()
    mesh = init_device_mesh(torch.device(device).type, (1,), mesh_dim_names=("dp",))
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if spec.train.precision == "bf16" else MixedPrecisionPolicy())
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    if spec.model.tie_word_embeddings:  # one parameter: one group (FSDP2 refuses it in two)
        fully_shard([model.model.embed_tokens, model.lm_head], mesh=mesh, mp_policy=mp)
    else:
        fully_shard(model.model.embed_tokens, mesh=mesh, mp_policy=mp)
        fully_shard(model.lm_head, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    model.to_empty(device=device)
    with torch.no_grad():
        model.apply(model._init_weights)
    init_rope_buffers(model)
    return model


def run_trainer(spec: Any, prepared: Any, work: Path, device: Any) -> dict[str, Any]:
    """This project's trainer, its loop as it runs; the end-of-run work skipped (module doc)."""
    trainer, init_s = _build_trainer(spec, prepared, work)
    try:
        skip_end_of_run(trainer)
        trainer.run()
        done = trainer.step_done_at
        losses = [loss for _, loss in trainer.step_losses]
        tokens = spec.data.seq_len * spec.train.micro_batch_size
        return {"tokens_per_s": window_rate(done, tokens, spec.train.log_interval), "init_s": init_s,
                "loss_first": losses[0], "loss_last": losses[-1], "peak_allocated_gb": peak_allocated_gb(device),
                "sharded": trainer.topo.sharded, "world": trainer.world,
                "distributed_type": str(trainer.accelerator.distributed_type)}
    finally:
        shutil.rmtree(trainer.run_dir, ignore_errors=True)
        del trainer


def _build_trainer(spec: Any, prepared: Any, work: Path) -> tuple[Any, float]:
    from trainer.loop import Trainer

    t0 = time.perf_counter()
    run_dir = work / f"trainer-{time.monotonic_ns()}"
    trainer = Trainer(spec, run_dir, prepared.path, tracking_uri="none", prepared=prepared, console_level="WARNING")
    return trainer, time.perf_counter() - t0


def skip_end_of_run(trainer: Any, at_end: Callable[[Any], dict[str, Any]] | None = None) -> None:
    """Replace the trainer's end of run (final checkpoint, evaluation, export, result.json) by
    `at_end(trainer)` (or nothing): the loop's steps are what is measured."""

    def finish(outcome: Any, last: dict[str, float]) -> tuple[dict[str, Any], int]:
        extra = at_end(trainer) if at_end is not None else {}
        return {"status": outcome.status, **extra}, 0

    trainer._finish = finish


def run_hf(spec: Any, rows: list[dict[str, Any]], device: Any, work: Path) -> dict[str, Any]:
    """Hugging Face `Trainer` on the same rows, in order, the model built on the device."""
    import torch
    from transformers import Trainer as HFTrainer
    from transformers import TrainerCallback, TrainingArguments

    t0 = time.perf_counter()
    torch.manual_seed(spec.train.seed)
    with torch.device(device):
        model = spec.model.build()
    data = [{k: torch.from_numpy(b[k][i]) for k in COLUMNS} for b in rows for i in range(len(b[COLUMNS[0]]))]
    log_every, steps = spec.train.log_interval, len(rows)
    done_at: list[float] = []
    losses: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step % log_every == 0 or state.global_step == steps:
                synchronize(device)
            done_at.append(time.perf_counter())

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    on_cpu = torch.device(device).type == "cpu"
    args = TrainingArguments(
        output_dir=str(work / "hf"), per_device_train_batch_size=spec.train.micro_batch_size, max_steps=steps,
        learning_rate=spec.train.lr, warmup_steps=spec.train.warmup_steps, weight_decay=spec.train.weight_decay,
        adam_beta2=0.95, max_grad_norm=spec.train.grad_clip, logging_steps=log_every, save_strategy="no",
        report_to=[], bf16=spec.train.precision == "bf16", use_cpu=on_cpu, dataloader_num_workers=0,
        disable_tqdm=True, remove_unused_columns=False, optim="adamw_torch_fused", seed=spec.train.seed,
    )

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        return {k: torch.stack([it[k] for it in items]) for k in items[0]}

    hf = HFTrainer(model=model, args=args, train_dataset=data, data_collator=collate, callbacks=[Clock()])
    hf._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(data)  # type: ignore[method-assign]
    init_s = time.perf_counter() - t0
    hf.train()
    peak = peak_allocated_gb(device)
    del hf, model
    shutil.rmtree(work / "hf", ignore_errors=True)
    tokens = spec.data.seq_len * spec.train.micro_batch_size
    return {"tokens_per_s": window_rate(done_at, tokens, log_every), "init_s": init_s,
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
            "peak_allocated_gb": peak}


def run_system(name: str, spec: Any, prepared: Any, rows: list[dict[str, Any]], device: Any,
               work: Path) -> dict[str, Any]:
    """One run of system `name` (SYSTEMS); everything it held released afterwards."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        if name == "bare":
            out = run_bare(spec, rows, device)
        elif name == "fsdp2":
            with one_rank_group(device):
                out = run_bare(spec, rows, device, fsdp=True)
        elif name == "trainer":
            out = run_trainer(spec, prepared, work, device)
        elif name == "trainer_fsdp":
            fsdp_spec = _with_parallel(spec, {"dp": 1, "fsdp": True})
            with trainer_one_rank_fsdp(device):
                out = run_trainer(fsdp_spec, prepared, work, device)
        elif name == "hf":
            out = run_hf(spec, rows, device, work)
        else:
            raise ValueError(f"unknown system {name!r} (known: {', '.join(SYSTEMS)})")
    finally:
        release(device)
    return out | {"seconds": time.perf_counter() - t0, **leftovers(device)}


def leftovers(device: Any) -> dict[str, Any]:
    """What a finished system left behind (a leak would starve the next one at 1.3B): models still
    alive, and on a GPU the bytes still allocated."""
    import torch
    from transformers import PreTrainedModel

    out: dict[str, Any] = {"live_models": sum(isinstance(o, PreTrainedModel) for o in gc.get_objects())}
    if torch.device(device).type == "cuda":
        out["allocated_after_gb"] = torch.cuda.memory_allocated() / 1e9
    return out


def _with_parallel(spec: Any, parallel: dict[str, Any]) -> Any:
    from validation.spec import ExperimentSpec

    return ExperimentSpec.model_validate(spec.model_dump(mode="json") | {"parallel": parallel})


def measure(spec: Any, prepared: Any, rows: list[dict[str, Any]], device: Any, work: Path, systems: list[str],
            repeats: int, deadline: float, record: Callable[[dict[str, Any]], None],
            peak_flops: float) -> dict[str, Any]:
    """`repeats` rounds of every system in turn (interleaved), recorded after each run through
    `record` (a part killed at its time limit keeps what it measured); a round is started only
    while the slowest run so far fits before `deadline` (time.monotonic). Medians, MFU, ratios."""
    from validation.flops import flops_per_token

    fpt = flops_per_token(spec.model, spec.data.seq_len)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    errors: dict[str, str] = {}
    figures: dict[str, Any] = {}
    for rep in range(repeats):
        for system in systems:
            if system in errors:
                continue
            longest = max((r["seconds"] for r in runs[system]), default=0.0)
            if rep > 0 and time.monotonic() + 1.2 * longest > deadline:
                figures["stopped_early"] = f"round {rep + 1}: {system} would not finish before the part's limit"
                break
            try:
                runs[system].append(run_system(system, spec, prepared, rows, device, work))
            except Exception as exc:  # noqa: BLE001 - one system's failure leaves the others' figures
                errors[system] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                import traceback

                traceback.print_exc()
            figures = summarise(runs, errors, fpt, peak_flops) | (
                {"stopped_early": figures["stopped_early"]} if "stopped_early" in figures else {})
            record(figures)
        if "stopped_early" in figures:
            break
    return figures


def summarise(runs: dict[str, list[dict[str, Any]]], errors: dict[str, str], fpt: float,
              peak_flops: float) -> dict[str, Any]:
    """Per system: the runs, the median tokens/s and its MFU; the trainer's ratios to bare and HF."""
    systems: dict[str, Any] = {}
    for name, got in runs.items():
        rates = [r["tokens_per_s"] for r in got if r["tokens_per_s"] == r["tokens_per_s"]]
        entry: dict[str, Any] = {"runs": got, "repeats": len(got)}
        if rates:
            med = statistics.median(rates)
            entry |= {"tokens_per_s": med, "mfu": med * fpt / peak_flops,
                      "spread": (max(rates) - min(rates)) / med if med else None}
        if name in errors:
            entry["error"] = errors[name]
        systems[name] = entry

    def ratio(a: str, b: str) -> float | None:
        x, y = systems.get(a, {}).get("tokens_per_s"), systems.get(b, {}).get("tokens_per_s")
        return x / y if x and y else None

    return {"systems": systems, "flops_per_token": fpt, "peak_flops": peak_flops,
            "ratios": {"trainer/bare": ratio("trainer", "bare"), "trainer/hf": ratio("trainer", "hf"),
                       "trainer_fsdp/fsdp2": ratio("trainer_fsdp", "fsdp2"),
                       "trainer_fsdp/hf": ratio("trainer_fsdp", "hf"), "fsdp2/bare": ratio("fsdp2", "bare")}}
