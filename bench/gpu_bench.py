"""GPU throughput and MFU: this trainer vs a bare PyTorch loop vs Hugging Face `Trainer`, bf16.

    python bench/gpu_bench.py [--size 125m|350m] [--seq 1024] [--micro 16] [--steps 30] [--repeats 3]
                              [--compile] [--peak-tflops 989] [--no-append]

For a machine with one CUDA GPU (not run on the 2-core CPU box). Model: Llama ~125M
(768 wide, 12 layers, 12 heads) or ~350M (1024 wide, 24 layers, 16 heads), vocab 32000,
sdpa attention, bf16 autocast, AdamW, clip 1.0. Data: the demo corpus from the standard
library, prepared with an 8192-token BPE, packed rows from `MixtureBatcher` (the same rows
for all three systems). Tokens/s are windowed (first 3 steps are warm-up), medians over
interleaved repeats. MFU = tokens/s x (6N + 12 L h T) / peak (dense bf16 peak of the GPU,
from --peak-tflops or a table by device name).
Appends a section "trainer (GPU)" to bench/RESULTS.md.
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

from bench_trainer import TimedSink, _StepClock, reset_accelerate, windowed
from scaffold import (
    append_results_md,
    as_tensors,
    demo_sources,
    examples,
    experiment,
    machine,
    packed_rows,
    prepare_demo,
    stack_examples,
)

from validation.environment import apply_offline_env

apply_offline_env()

WARMUP = 3
SIZES = {"125m": (768, 12, 12, 2048), "350m": (1024, 24, 16, 2816)}


def spec_for(size: str, seq: int, micro: int, steps: int, compile_model: bool) -> Any:
    from validation.spec import ExperimentSpec

    hidden, layers, heads, ffn = SIZES[size]
    return ExperimentSpec.model_validate(experiment(
        "gpu-bench", "The trainer reaches the MFU of a bare loop on a single GPU in bf16.", "perf/mfu",
        model={"model_type": "llama", "hidden_size": hidden, "num_layers": layers, "num_heads": heads,
               "intermediate_size": ffn, "vocab_size": 32000, "max_position_embeddings": seq,
               "attn_implementation": "sdpa"},
        data={"sources": demo_sources(), "seq_len": seq, "tokenizer": {"vocab_size": 8192}},
        train={"max_steps": steps, "micro_batch_size": micro, "precision": "bf16", "warmup_steps": 2,
               "log_interval": 10, "eval_interval": 10**6, "checkpoint_interval": 10**6, "compile": compile_model,
               "deterministic": False},
        resource={"gpus_per_node": 1, "gpu_type": "h100"},
    ))


def rows(prepared: Any, spec: Any) -> list[dict[str, Any]]:
    return packed_rows(prepared, spec.data, spec.train.micro_batch_size, spec.train.max_steps)


def run_bare(prepared: Any, spec: Any) -> float:
    import torch

    from trainer.model import build_model
    from trainer.optim import build_optimizer

    torch.manual_seed(0)
    model = build_model(spec.model).cuda()
    if spec.train.compile:
        model = torch.compile(model)
    opt = build_optimizer(model, spec.train, spec.model)
    batches = as_tensors(rows(prepared, spec), "cuda")
    done_at = []
    for batch in batches:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        done_at.append(time.perf_counter())
    del model, opt
    torch.cuda.empty_cache()
    return windowed(done_at, spec.data.seq_len * spec.train.micro_batch_size, WARMUP)


def run_trainer(prepared: Any, spec: Any, work: Path) -> tuple[float, float]:
    import torch

    from trainer.loop import Trainer

    reset_accelerate()
    run_dir = work / f"trainer-{time.monotonic_ns()}"
    trainer = Trainer(spec, run_dir, prepared.path, tracking_uri=f"sqlite:///{work / 'mlflow.db'}", prepared=prepared)
    sink = TimedSink(trainer.sink)
    trainer.sink = trainer.alerts.sink = sink
    trainer.run()
    done = trainer.step_done_at
    tps = windowed(done, spec.data.seq_len * spec.train.micro_batch_size, WARMUP)
    share = sink.seconds / (done[-1] - done[0])
    del trainer
    shutil.rmtree(run_dir, ignore_errors=True)
    torch.cuda.empty_cache()
    return tps, share


def run_hf(prepared: Any, spec: Any, work: Path) -> float:
    import torch
    from transformers import Trainer as HFTrainer
    from transformers import TrainingArguments

    from trainer.model import build_model

    reset_accelerate()
    torch.manual_seed(0)
    model = build_model(spec.model)
    data = examples(rows(prepared, spec))
    clock = _StepClock()
    args = TrainingArguments(
        output_dir=str(work / "hf"), per_device_train_batch_size=spec.train.micro_batch_size,
        max_steps=spec.train.max_steps, learning_rate=spec.train.lr, warmup_steps=2, weight_decay=0.1,
        adam_beta2=0.95, max_grad_norm=1.0, logging_steps=10, save_strategy="no", report_to=[], bf16=True,
        dataloader_num_workers=2, disable_tqdm=True, remove_unused_columns=False, torch_compile=spec.train.compile,
    )

    class SyncClock(type(clock.callback())):  # type: ignore[misc]
        def on_step_end(self, *a: Any, **k: Any) -> None:
            torch.cuda.synchronize()
            super().on_step_end(*a, **k)

    hf = HFTrainer(model=model, args=args, train_dataset=data, data_collator=stack_examples, callbacks=[SyncClock()])
    hf.train()
    del hf, model
    torch.cuda.empty_cache()
    return windowed(clock.done_at, spec.data.seq_len * spec.train.micro_batch_size, WARMUP)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="125m", choices=sorted(SIZES))
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("gpu_bench: no CUDA device; nothing to measure", file=sys.stderr)
        return {}
    from trainer.model import flops_per_token
    from validation.flops import peak_tflops_for_device_name

    spec = spec_for(args.size, args.seq, args.micro, args.steps, args.compile)
    prepared = prepare_demo(spec.data)
    name = torch.cuda.get_device_name(0)
    peak = args.peak_tflops or peak_tflops_for_device_name(name)
    if peak is None:
        sys.exit(f"unknown device {name!r}: pass --peak-tflops (validation/flops.py has the table)")
    n_params = spec.model.parameter_count()
    fpt = flops_per_token(spec.model, args.seq)
    work = Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    got: dict[str, list[float]] = {"bare": [], "trainer": [], "hf": [], "mlflow_share": []}
    try:
        for rep in range(args.repeats):
            got["bare"].append(run_bare(prepared, spec))
            tps, share = run_trainer(prepared, spec, work)
            got["trainer"].append(tps)
            got["mlflow_share"].append(share)
            got["hf"].append(run_hf(prepared, spec, work))
            print(f"[{rep + 1}/{args.repeats}] bare {got['bare'][-1]:.0f} trainer {tps:.0f} hf {got['hf'][-1]:.0f} tok/s",
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    figures = {
        "machine": machine() | {"gpu": name, "peak_tflops": peak}, "size": args.size, "params": n_params,
        "seq": args.seq, "micro": args.micro, "compile": args.compile, "steps": args.steps, "repeats": args.repeats,
        **{f"{k}_tokens_per_s": med[k] for k in ("bare", "trainer", "hf")},
        **{f"{k}_mfu": med[k] * fpt / (peak * 1e12) for k in ("bare", "trainer", "hf")},
        "trainer_vs_bare": med["trainer"] / med["bare"], "trainer_vs_hf": med["trainer"] / med["hf"],
        "mlflow_share_of_loop": med["mlflow_share"],
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9,
    }
    print(json.dumps(figures, indent=2))
    if not args.no_append:
        m = figures["machine"]
        lines = ["", f"## trainer (GPU) ({m['date']})", "",
                 f"{name} (peak {peak:g} TFLOPS bf16 dense), torch {m['torch']}, transformers {m['transformers']}. "
                 f"Llama {args.size} ({n_params / 1e6:.0f}M params), seq {args.seq}, micro batch {args.micro}, bf16, "
                 f"compile={args.compile}; {args.steps} steps (first {WARMUP} untimed), {args.repeats} repeats, medians. "
                 "`python bench/gpu_bench.py`.", "",
                 "| system | tokens/s | MFU |", "|---|---|---|"]
        for k in ("bare", "trainer", "hf"):
            lines.append(f"| {k} | {figures[f'{k}_tokens_per_s']:.0f} | {100 * figures[f'{k}_mfu']:.1f} % |")
        lines += ["", f"trainer/bare {figures['trainer_vs_bare']:.3f}, trainer/HF {figures['trainer_vs_hf']:.3f}, "
                      f"MLflow share {100 * figures['mlflow_share_of_loop']:.2f} %.", ""]
        append_results_md("\n".join(lines))
    with contextlib.suppress(Exception):
        torch.cuda.empty_cache()
    return figures


if __name__ == "__main__":
    main()
