"""FSDP2 bf16 on one GPU: tokens/s and MFU against the Hugging Face `Trainer` on the same batches.

    python bench/gpu_fsdp_bench.py [--size 350m] [--seq 1024] [--micro 8] [--steps 30] [--repeats 3]
                                   [--peak-tflops 989] [--no-append]
    python bench/gpu_fsdp_bench.py --dry-run      # tiny model on CPU (gloo): proves the script runs

For a machine with one CUDA GPU (not measured on the CPU box; issue 12, "Benchmarks"). Model: Llama
~350M (hidden 1024, 24 layers, 16 heads, ffn 2816, vocab 32000, sdpa). Systems, interleaved per repeat:
  fsdp2    `fully_shard` on every decoder layer, the embedding and the LM head (own groups), then
           the root, over a 1-rank process group (NCCL); `MixedPrecisionPolicy(param_dtype=bf16,
           reduce_dtype=fp32)`; parameters created on the meta device and materialised by `to_empty`;
           fused AdamW, clip 1.0; the loss and grad norm stay on the device (no per-step host sync);
  trainer  this pipeline's trainer with `parallel: {dp: 1, fsdp: true}` when its capability
           (validation/capability.py) runs FSDP on GPUs; otherwise reported as not run;
  hf       Hugging Face `Trainer`, bf16 autocast, fed the same packed rows (position_ids, no padding).
Data: the demo corpus (standard-library source and docs), 8192-token BPE, `MixtureBatcher` rows.
Tokens/s are windowed after WARMUP steps with `torch.cuda.synchronize()` at each step end; MFU =
tokens/s x FLOPs per token (6N + 12 L h T) / dense bf16 peak (--peak-tflops or a table by device
name). Appends "FSDP2 (GPU)" to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_trainer import reset_accelerate, windowed
from scaffold import (
    append_results_md,
    as_tensors,
    demo_sources,
    examples,
    experiment,
    free_port,
    machine,
    packed_rows,
    prepare_demo,
    stack_examples,
)

from validation.environment import apply_offline_env
from validation.flops import (
    CPU_PEAK_TFLOPS_PER_THREAD,
    flops_per_token,
    peak_tflops_for_device_name,
)

apply_offline_env()

WARMUP = 3
SIZES = {"tiny": (64, 2, 4, 128, 512), "125m": (768, 12, 12, 2048, 32000), "350m": (1024, 24, 16, 2816, 32000)}


def peak_for(device_name: str) -> float | None:
    """Dense bf16 TFLOPS of a device from the one table (validation.flops), by its name."""
    return peak_tflops_for_device_name(device_name)


def spec_for(size: str, seq: int, micro: int, steps: int, on_gpu: bool) -> Any:
    from validation.spec import ExperimentSpec

    hidden, layers, heads, ffn, vocab = SIZES[size]
    return ExperimentSpec.model_validate(experiment(
        "gpu-fsdp-bench", "FSDP2 in this trainer reaches the throughput of the HF Trainer on one GPU.", "perf/mfu",
        model={"model_type": "llama", "hidden_size": hidden, "num_layers": layers, "num_heads": heads,
               "intermediate_size": ffn, "vocab_size": vocab, "max_position_embeddings": max(seq, 16),
               "attn_implementation": "sdpa"},
        data={"sources": demo_sources(), "seq_len": seq, "tokenizer": {"vocab_size": min(8192, vocab)}},
        train={"max_steps": steps, "micro_batch_size": micro, "precision": "bf16" if on_gpu else "fp32",
               "warmup_steps": 2, "log_interval": 10, "eval_interval": 10**6, "checkpoint_interval": 10**6,
               "deterministic": False},
        parallel={"dp": 1, "fsdp": True},
        resource={"gpus_per_node": 1, "gpu_type": "h100"} if on_gpu else {"cpu_processes": 1},
    ))


def batches_for(spec: Any, dry_run: bool) -> tuple[list[dict[str, Any]], Any]:
    """The batches every system trains on: demo-corpus packed rows, or random ids for --dry-run."""
    import numpy as np

    micro, seq, steps = spec.train.micro_batch_size, spec.data.seq_len, spec.train.max_steps
    if dry_run:
        rng = np.random.default_rng(0)
        ids = [rng.integers(0, spec.model.vocab_size, size=(micro, seq), dtype=np.int64) for _ in range(steps)]
        pos = np.tile(np.arange(seq, dtype=np.int64), (micro, 1))
        return [{"input_ids": x, "labels": x.copy(), "position_ids": pos} for x in ids], None
    prepared = prepare_demo(spec.data)
    return packed_rows(prepared, spec.data, micro, steps), prepared


@contextlib.contextmanager
def one_rank_group(on_gpu: bool) -> Any:
    """FSDP2 needs a process group even on one device."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("nccl" if on_gpu else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _sync(on_gpu: bool) -> None:
    import torch

    if on_gpu:
        torch.cuda.synchronize()


def run_fsdp2(spec: Any, batches: list[dict[str, Any]], on_gpu: bool) -> dict[str, float]:
    import torch
    from bench_parallel_memory import init_rope_buffers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    device = torch.device("cuda" if on_gpu else "cpu")
    torch.manual_seed(0)
    with torch.device("meta"):
        model = spec.model.build()
    mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp",))
    bf16 = spec.train.precision == "bf16"
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
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
    opt = torch.optim.AdamW(model.parameters(), lr=spec.train.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    inputs = as_tensors(batches, device)
    losses, norms, done_at = [], [], []
    for batch in inputs:
        loss = model(**batch, use_cache=False).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        norms.append(norm.detach() if isinstance(norm, torch.Tensor) else torch.tensor(norm))
        _sync(on_gpu)  # the clock only; the loop itself never reads a device value
        done_at.append(time.perf_counter())
    first_last = torch.stack([losses[0], losses[-1]]).float().tolist()  # one read, after the loop
    del model, opt
    if on_gpu:
        torch.cuda.empty_cache()
    tokens = spec.data.seq_len * spec.train.micro_batch_size
    return {"tokens_per_s": windowed(done_at, tokens, WARMUP), "loss_first": first_last[0], "loss_last": first_last[1]}


def run_trainer(spec: Any, prepared: Any, work: Path) -> dict[str, float] | None:
    """The pipeline's trainer on the same spec, if its capability runs FSDP on GPUs."""
    from validation.capability import TRAINER

    if prepared is None or not TRAINER.supports(spec.parallel_layout(), on_gpu=True):
        return None
    from trainer.loop import Trainer

    reset_accelerate()
    run_dir = work / f"trainer-{time.monotonic_ns()}"
    trainer = Trainer(spec, run_dir, prepared.path, tracking_uri="none", prepared=prepared)
    trainer.run()
    tps = windowed(trainer.step_done_at, spec.data.seq_len * spec.train.micro_batch_size, WARMUP)
    del trainer
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"tokens_per_s": tps}


def run_hf(spec: Any, batches: list[dict[str, Any]], on_gpu: bool, work: Path) -> dict[str, float]:
    import torch
    from transformers import Trainer as HFTrainer
    from transformers import TrainerCallback, TrainingArguments

    from trainer.model import build_model

    reset_accelerate()
    torch.manual_seed(0)
    model = build_model(spec.model)
    micro = spec.train.micro_batch_size
    data = examples(batches)
    done_at: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            _sync(on_gpu)
            done_at.append(time.perf_counter())

    args = TrainingArguments(
        output_dir=str(work / "hf"), per_device_train_batch_size=micro, max_steps=spec.train.max_steps,
        learning_rate=spec.train.lr, warmup_steps=2, weight_decay=0.1, adam_beta2=0.95, max_grad_norm=1.0,
        logging_steps=10, save_strategy="no", report_to=[], bf16=spec.train.precision == "bf16", use_cpu=not on_gpu,
        dataloader_num_workers=0, disable_tqdm=True, remove_unused_columns=False, optim="adamw_torch_fused",
    )

    # Sequential sampling: the same rows in the same order as the other systems.
    hf = HFTrainer(model=model, args=args, train_dataset=data, data_collator=stack_examples, callbacks=[Clock()])
    hf._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(data)  # type: ignore[method-assign]
    hf.train()
    del hf, model
    if on_gpu:
        torch.cuda.empty_cache()
    return {"tokens_per_s": windowed(done_at, spec.data.seq_len * micro, WARMUP)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="350m", choices=sorted(SIZES))
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--dry-run", action="store_true", help="tiny model on CPU, 1 repeat, nothing appended")
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args(argv)

    import torch

    on_gpu = torch.cuda.is_available() and not args.dry_run
    if args.dry_run:
        args.size, args.seq, args.micro, args.steps, args.repeats = "tiny", 64, 2, WARMUP + 3, 1
    elif not on_gpu:
        print("gpu_fsdp_bench: no CUDA device; use --dry-run on a CPU", file=sys.stderr)
        return {}
    spec = spec_for(args.size, args.seq, args.micro, args.steps, on_gpu)
    batches, prepared = batches_for(spec, args.dry_run)
    name = torch.cuda.get_device_name(0) if on_gpu else "cpu (dry run)"
    peak = args.peak_tflops or (peak_for(name) if on_gpu else CPU_PEAK_TFLOPS_PER_THREAD * torch.get_num_threads())
    if peak is None:
        print(f"gpu_fsdp_bench: no peak FLOPS known for {name}; pass --peak-tflops", file=sys.stderr)
        return {}
    n_params = spec.model.parameter_count()
    fpt = flops_per_token(spec.model, args.seq)
    work = Path(tempfile.mkdtemp(prefix="gpu-fsdp-bench-"))
    got: dict[str, list[float]] = {"fsdp2": [], "trainer": [], "hf": []}
    loss_check: dict[str, float] = {}
    try:
        for rep in range(args.repeats):
            with one_rank_group(on_gpu):
                f = run_fsdp2(spec, batches, on_gpu)
            got["fsdp2"].append(f["tokens_per_s"])
            loss_check = {"first": f["loss_first"], "last": f["loss_last"]}
            t = run_trainer(spec, prepared, work)
            if t is not None:
                got["trainer"].append(t["tokens_per_s"])
            got["hf"].append(run_hf(spec, batches, on_gpu, work)["tokens_per_s"])
            print(f"[{rep + 1}/{args.repeats}] " + " ".join(f"{k} {v[-1]:.0f}" for k, v in got.items() if v)
                  + " tok/s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in got.items() if v}
    figures: dict[str, Any] = {
        "machine": machine() | {"gpu": name, "peak_tflops": peak}, "size": args.size, "params": n_params,
        "seq": args.seq, "micro": args.micro, "steps": args.steps, "repeats": args.repeats, "dry_run": args.dry_run,
        "loss": loss_check, "trainer_ran": "trainer" in med,
        **{f"{k}_tokens_per_s": v for k, v in med.items()},
        **{f"{k}_mfu": v * fpt / (peak * 1e12) for k, v in med.items()},
        "fsdp2_vs_hf": med["fsdp2"] / med["hf"],
    }
    if "trainer" in med:
        figures["trainer_vs_hf"] = med["trainer"] / med["hf"]
    if on_gpu:
        figures["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 1e9
    print(json.dumps(figures, indent=2))
    if not args.no_append and not args.dry_run:
        append_results(figures)
    return figures


def append_results(f: dict[str, Any]) -> None:
    m = f["machine"]
    lines = ["", f"## FSDP2 (GPU) ({m['date']})", "",
             f"{m['gpu']} (peak {m['peak_tflops']:g} TFLOPS bf16 dense), torch {m['torch']}, transformers "
             f"{m['transformers']}. Llama {f['size']} ({f['params'] / 1e6:.0f}M params), seq {f['seq']}, micro batch "
             f"{f['micro']}, bf16; {f['steps']} steps (first {WARMUP} untimed), {f['repeats']} repeats, medians. "
             "`python bench/gpu_fsdp_bench.py`.", "", "| system | tokens/s | MFU |", "|---|---|---|"]
    for k in ("fsdp2", "trainer", "hf"):
        if f"{k}_tokens_per_s" in f:
            lines.append(f"| {k} | {f[f'{k}_tokens_per_s']:.0f} | {100 * f[f'{k}_mfu']:.1f} % |")
    lines += ["", f"FSDP2/HF {f['fsdp2_vs_hf']:.3f}" + (f", trainer/HF {f['trainer_vs_hf']:.3f}" if f["trainer_ran"]
                                                        else "; trainer: FSDP not in its GPU capability, not run")
              + f"; peak memory {f.get('peak_mem_gb', float('nan')):.1f} GB.", ""]
    append_results_md("\n".join(lines))


if __name__ == "__main__":
    main()
