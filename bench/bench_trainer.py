"""Trainer throughput against the baselines that matter, side by side, interleaved, medians.

    .venv/bin/python bench/bench_trainer.py [--steps 14] [--repeats 3] [--precisions fp32,bf16] [--no-append]

Measured on the same machine in one run, on the same packed batches (MixtureBatcher rows
of the demo corpus), the same model (Llama, 4 layers, hidden 256, seq 256, micro batch 8)
and precision:
  bare     a bare PyTorch loop: forward, backward, clip, AdamW step, nothing else, batches
           already materialised as tensors (the most favourable baseline);
  trainer  this trainer in-process with checkpointing (every 10 steps), MLflow logging to a
           local sqlite store (every 5 steps), monitoring and alerts on;
  hf       Hugging Face `Trainer` fed the same packed rows (position_ids, no padding);
  hf-pad   Hugging Face `Trainer` with the standard causal-LM recipe on the same documents:
           one example per document truncated to seq_len, `DataCollatorForLanguageModeling`
           padding: reported as *useful* (loss-bearing) tokens/s.
Tokens/s are windowed: the first 2 steps of each run are warm-up and not counted. Also:
MLflow logging share of the trainer's loop time, and the checkpoint stall, sync vs async.
Results are printed, returned, and appended to bench/RESULTS.md (section "trainer").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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

from basics.environment import apply_offline_env

apply_offline_env()

WARMUP = 2
SEQ, MICRO = 256, 8


def bench_spec(precision: str, steps: int, async_ckpt: bool = False, ckpt_every: int = 10) -> Any:
    from validation.spec import ExperimentSpec

    return ExperimentSpec.model_validate(experiment(
        "bench-trainer", "The trainer keeps up with a bare PyTorch loop on the same batches.", "perf/tokens_per_s",
        model={"model_type": "llama", "hidden_size": 256, "num_layers": 4, "num_heads": 4,
               "vocab_size": 2048, "max_position_embeddings": SEQ},
        data={"sources": demo_sources(), "seq_len": SEQ, "tokenizer": {"vocab_size": 2048}},
        train={"max_steps": steps, "micro_batch_size": MICRO, "precision": precision, "warmup_steps": 2,
               "log_interval": 5, "eval_interval": 10**6, "checkpoint_interval": ckpt_every,
               "keep_last": 1, "async_checkpoint": async_ckpt, "deterministic": True},
    ))


def prepared_data() -> Any:
    return prepare_demo(bench_spec("fp32", 1).data)


def reset_accelerate() -> None:
    """The trainer and HF Trainer each build an Accelerator; allow a new precision per run."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def windowed(done_at: list[float], tokens_per_step: float, warmup: int = WARMUP) -> float:
    """Tokens/s from the end of step `warmup` to the last step's end (nan with too few steps)."""
    if len(done_at) <= warmup + 1:
        return float("nan")
    return (len(done_at) - 1 - warmup) * tokens_per_step / (done_at[-1] - done_at[warmup])


def steady(done_at: list[float], cpu_at: list[float], tokens_per_step: float) -> dict[str, float]:
    """Tokens per median step interval (wall and CPU) after the warm-up: the loop's steady rate,
    without the occasional long step (a checkpoint, a log flush, a neighbour's burst), which the
    windowed figure includes. The same estimator for every system."""
    def rate(stamps: list[float]) -> float:
        gaps = [b - a for a, b in zip(stamps[WARMUP:], stamps[WARMUP + 1:], strict=False)]
        return tokens_per_step / statistics.median(gaps) if gaps else float("nan")

    return {"steady_tokens_per_s": rate(done_at), "steady_tokens_per_cpu_s": rate(cpu_at)}


def per_cpu_second(cpu_at: list[float], tokens_per_step: float) -> float:
    """Tokens per CPU-second of this process (all its threads): on a machine shared with other
    jobs, wall time measures the neighbours as much as the code; CPU time far less."""
    return windowed(cpu_at, tokens_per_step)


def packed_batches(prepared: Any, steps: int) -> list[dict[str, Any]]:
    return packed_rows(prepared, bench_spec("fp32", 1).data, MICRO, steps)


# ----------------------------------------------------------------------------- systems


def run_bare(prepared: Any, precision: str, steps: int, on_step: Any = None) -> dict[str, float]:
    """`on_step`: called after each optimizer step (bench/page_faults.py counts faults there)."""
    import contextlib

    import torch

    from trainer.model import build_model
    from trainer.optim import build_optimizer

    spec = bench_spec(precision, steps)
    torch.manual_seed(0)
    model = build_model(spec.model)
    opt = build_optimizer(model, spec.train, spec.model)
    batches = as_tensors(packed_batches(prepared, steps))
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext
    done_at, cpu_at = [], []
    for batch in batches:
        with ctx():
            loss = model(**batch, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if on_step is not None:
            on_step()
        done_at.append(time.perf_counter())
        cpu_at.append(time.process_time())
    return {"tokens_per_s": windowed(done_at, SEQ * MICRO), "tokens_per_cpu_s": per_cpu_second(cpu_at, SEQ * MICRO),
            **steady(done_at, cpu_at, SEQ * MICRO)}


class TimedSink:
    """Wraps the trainer's sink and adds up the time spent in it."""

    def __init__(self, inner: Any):
        self.inner, self.seconds = inner, 0.0

    @property
    def run_id(self) -> str | None:
        return self.inner.run_id

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        return timed


def run_trainer(prepared: Any, precision: str, steps: int, work: Path, async_ckpt: bool = False,
                compile_model: bool = False) -> dict[str, float]:
    from trainer.loop import Trainer

    reset_accelerate()
    run_dir = work / f"trainer-{precision}-{time.monotonic_ns()}"
    uri = f"sqlite:///{work / 'mlflow.db'}"
    spec = bench_spec(precision, steps, async_ckpt)
    if compile_model:
        spec = spec.model_copy(update={"train": spec.train.model_copy(update={"compile": True})})
    trainer = Trainer(spec, run_dir, prepared.path, tracking_uri=uri, prepared=prepared)
    sink = TimedSink(trainer.sink)
    trainer.sink = sink
    trainer.alerts.sink = sink
    cpu_at: list[float] = []
    original = trainer._faults_after_step

    def clocked() -> None:  # runs once per step, right before step_done_at is stamped
        original()
        cpu_at.append(time.process_time())

    trainer._faults_after_step = clocked
    trainer.run()
    done = trainer.step_done_at
    loop_s = done[-1] - done[WARMUP]
    shutil.rmtree(run_dir, ignore_errors=True)
    stalls = trainer.stalls[:-1] or trainer.stalls  # the last one is the final save after the loop
    return {
        "tokens_per_s": windowed(done, SEQ * MICRO),
        "tokens_per_cpu_s": per_cpu_second(cpu_at, SEQ * MICRO),
        **steady(done[-len(cpu_at):], cpu_at, SEQ * MICRO),
        "mlflow_share": sink.seconds / (done[-1] - done[0]) if loop_s > 0 else float("nan"),
        "stall_s": statistics.median(stalls) if stalls else float("nan"),
    }


def _hf_args(precision: str, steps: int, out: Path) -> Any:
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=MICRO, max_steps=steps, learning_rate=3e-3,
        warmup_steps=2, weight_decay=0.1, adam_beta2=0.95, max_grad_norm=1.0, lr_scheduler_type="cosine",
        logging_steps=5, save_strategy="no", report_to=[], bf16=precision == "bf16", use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True, seed=1234, remove_unused_columns=False,
    )


class _StepClock:
    def __init__(self) -> None:
        self.done_at: list[float] = []
        self.cpu_at: list[float] = []

    def callback(self) -> Any:
        from transformers import TrainerCallback

        clock = self

        class Clock(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                clock.done_at.append(time.perf_counter())
                clock.cpu_at.append(time.process_time())

        return Clock()


def run_hf(prepared: Any, precision: str, steps: int, work: Path) -> dict[str, float]:
    import torch
    from transformers import Trainer as HFTrainer

    from trainer.model import build_model

    reset_accelerate()
    torch.manual_seed(0)
    model = build_model(bench_spec(precision, steps).model)
    clock = _StepClock()
    trainer = HFTrainer(model=model, args=_hf_args(precision, steps, work / "hf"),
                        train_dataset=examples(packed_batches(prepared, steps)), data_collator=stack_examples,
                        callbacks=[clock.callback()])
    # HF shuffles with a RandomSampler; the rows are the same set, only the order differs.
    trainer.train()
    return {"tokens_per_s": windowed(clock.done_at, SEQ * MICRO),
            "tokens_per_cpu_s": per_cpu_second(clock.cpu_at, SEQ * MICRO),
            **steady(clock.done_at, clock.cpu_at, SEQ * MICRO)}


def run_hf_padded(prepared: Any, precision: str, steps: int, work: Path) -> dict[str, float]:
    """HF's standard causal-LM recipe: one example per document, padding collator."""
    import numpy as np
    import torch
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast
    from transformers import Trainer as HFTrainer

    from trainer.model import build_model

    reset_accelerate()
    torch.manual_seed(0)
    model = build_model(bench_spec(precision, steps).model)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(prepared.tokenizer_path))
    tok.pad_token = tok.pad_token or tok.convert_ids_to_tokens(0)
    weights = bench_spec(precision, steps).data.weights()
    need = steps * MICRO
    docs: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    for src, w in weights.items():
        tokens, offsets = prepared.tokens(src), prepared.offsets(src)
        pick = rng.choice(offsets.size - 1, size=min(offsets.size - 1, int(need * w) + MICRO), replace=False)
        for d in pick:
            ids = np.asarray(tokens[offsets[d]: offsets[d + 1]][:SEQ], dtype=np.int64)
            docs.append({"input_ids": ids.tolist()})
    rng.shuffle(docs)
    docs = docs[:need]
    collator = DataCollatorForLanguageModeling(tok, mlm=False)
    useful = []

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        batch = collator(items)
        useful.append(int((batch["labels"][:, 1:] != -100).sum()))
        return batch

    clock = _StepClock()
    trainer = HFTrainer(model=model, args=_hf_args(precision, steps, work / "hfpad"), train_dataset=docs,
                        data_collator=collate, callbacks=[clock.callback()])
    trainer.train()
    d = clock.done_at
    # Useful tokens of the timed steps (collate order == step order with workers=0).
    timed_useful = sum(useful[WARMUP + 1: len(d)])
    slots = [u for u in useful]
    c = clock.cpu_at
    return {"useful_tokens_per_s": timed_useful / (d[-1] - d[WARMUP]),
            "useful_tokens_per_cpu_s": timed_useful / (c[-1] - c[WARMUP]),
            "padding_efficiency": sum(slots) / (len(slots) * MICRO * (SEQ - 1))}


def padding_efficiency_by_source(prepared: Any) -> dict[str, float]:
    """Loss-bearing share of the slots with the HF padding recipe, per source (batches of MICRO
    consecutive documents, each truncated to SEQ, padded to the longest in its batch)."""
    import numpy as np

    out = {}
    for src in prepared.sources:
        lengths = np.minimum(np.diff(prepared.offsets(src)), SEQ)
        useful = slots = 0
        for i in range(0, lengths.size - MICRO + 1, MICRO):
            batch = lengths[i:i + MICRO]
            useful += int((batch - 1).clip(0).sum())
            slots += int(batch.max()) * MICRO
        out[src] = useful / slots if slots else float("nan")
    return out


def useful_fraction_packed(prepared: Any, steps: int) -> float:
    batches = packed_batches(prepared, steps)
    sup = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
    return sup / (len(batches) * MICRO * SEQ)


# ----------------------------------------------------------------------------- main


def run_one(system: str, precision: str, steps: int, threads: int) -> dict[str, float]:
    """One run of one system; the deterministic flag is reset first (the trainer sets it
    process-wide, its default `train.deterministic`; the baselines run with torch's default)."""
    import torch

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(False)
    prepared = prepared_data()
    work = Path(tempfile.mkdtemp(prefix="bench-trainer-"))
    try:
        if system == "bare":
            return run_bare(prepared, precision, steps)
        if system == "trainer":
            return run_trainer(prepared, precision, steps, work)
        if system == "trainer-async":
            return run_trainer(prepared, precision, steps, work, async_ckpt=True)
        if system == "trainer-compile":
            return run_trainer(prepared, precision, steps, work, compile_model=True)
        if system == "hf":
            return run_hf(prepared, precision, steps, work)
        if system == "hf-pad":
            return run_hf_padded(prepared, precision, steps, work)
        raise SystemExit(f"unknown system {system!r}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads for every system (1 is the least disturbed on a shared machine)")
    parser.add_argument("--compile", action="store_true",
                        help="also run the trainer with train.compile (once per precision, after the repeats)")
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--in-process", action="store_true",
                        help="run every system in this process (the old way: a run's threads, allocator "
                             "state and torch flags carry over into the next system's timing)")
    parser.add_argument("--systems", default="bare,trainer,hf,hf-pad,trainer-async",
                        help="which systems to run (comma-separated; trainer-async runs in fp32 only)")
    parser.add_argument("--one", nargs=2, metavar=("SYSTEM", "PRECISION"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one[0], args.one[1], args.steps, args.threads)), flush=True)
        return {}
    raw: dict[str, list[dict[str, float]]] = {}
    prepared = prepared_data()  # build the corpus and cache once, before any timing

    def measure(system: str, precision: str) -> dict[str, float]:
        if args.in_process:
            return run_one(system, precision, args.steps, args.threads)
        # A fresh interpreter per run: no system inherits another's background threads, allocator
        # state, deterministic flag or accelerate singletons.
        cmd = [sys.executable, __file__, "--one", system, precision, "--steps", str(args.steps),
               "--threads", str(args.threads)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{system} {precision} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))

    for rep in range(args.repeats):
        for precision in args.precisions.split(","):
            for system in [x for x in ("bare", "trainer", "hf", "hf-pad") if x in args.systems.split(",")]:
                out = measure(system, precision)
                raw.setdefault(f"{system}/{precision}", []).append(out)
                print(f"[{rep + 1}/{args.repeats}] {system:8s} {precision}: {json.dumps(out)}", flush=True)
        if "trainer-async" in args.systems.split(","):
            async_out = measure("trainer-async", "fp32")
            raw.setdefault("trainer-async/fp32", []).append(async_out)
            print(f"[{rep + 1}/{args.repeats}] trainer-async fp32: {json.dumps(async_out)}", flush=True)
    if args.compile:
        for precision in args.precisions.split(","):
            out = measure("trainer-compile", precision)
            raw.setdefault(f"trainer-compile/{precision}", []).append(out)
            print(f"trainer-compile {precision}: {json.dumps(out)}", flush=True)

    def med(key: str, field: str) -> float:
        values = [r[field] for r in raw.get(key, []) if field in r and r[field] == r[field]]
        return statistics.median(values) if values else float("nan")

    packed_useful = useful_fraction_packed(prepared, args.steps)
    figures: dict[str, Any] = {"machine": machine(), "steps": args.steps, "repeats": args.repeats,
                               "threads": args.threads, "in_process": args.in_process}
    for precision in args.precisions.split(","):
        p: dict[str, float] = {}
        for unit, field, pad_field in (("wall", "tokens_per_s", "useful_tokens_per_s"),
                                       ("cpu", "tokens_per_cpu_s", "useful_tokens_per_cpu_s"),
                                       ("steady wall", "steady_tokens_per_s", ""),
                                       ("steady cpu", "steady_tokens_per_cpu_s", "")):
            bare, ours, hf = (med(f"{sys_}/{precision}", field) for sys_ in ("bare", "trainer", "hf"))
            hf_pad = med(f"hf-pad/{precision}", pad_field) if pad_field else float("nan")
            p |= {
                f"bare_{unit}": bare, f"trainer_{unit}": ours, f"hf_{unit}": hf,
                f"trainer_vs_bare_{unit}": ours / bare, f"trainer_vs_hf_{unit}": ours / hf,
                f"trainer_useful_{unit}": ours * packed_useful, f"hf_padded_useful_{unit}": hf_pad,
                f"packing_vs_hf_padding_useful_{unit}": ours * packed_useful / hf_pad,
            }
        for unit, field in (("wall", "tokens_per_s"), ("cpu", "tokens_per_cpu_s"),
                            ("steady wall", "steady_tokens_per_s"), ("steady cpu", "steady_tokens_per_cpu_s")):
            # Noise: the same ratio within each repeat (systems run back to back), its spread over repeats.
            per_rep = [t[field] / b[field] for t, b in zip(raw.get(f"trainer/{precision}", []),
                                                         raw.get(f"bare/{precision}", []), strict=False)]
            per_hf = [t[field] / h[field] for t, h in zip(raw.get(f"trainer/{precision}", []),
                                                        raw.get(f"hf/{precision}", []), strict=False)]
            p[f"trainer_vs_bare_{unit}_repeats"] = [round(x, 3) for x in per_rep]
            p[f"trainer_vs_hf_{unit}_repeats"] = [round(x, 3) for x in per_hf]
        compiled = med(f"trainer-compile/{precision}", "tokens_per_s")
        if compiled == compiled:
            p["trainer_compile_wall"] = compiled
            p["trainer_compile_cpu"] = med(f"trainer-compile/{precision}", "tokens_per_cpu_s")
        p["hf_padding_efficiency"] = med(f"hf-pad/{precision}", "padding_efficiency")
        p["mlflow_share_of_loop"] = med(f"trainer/{precision}", "mlflow_share")
        figures[precision] = p
    figures["packed_useful_fraction"] = packed_useful
    figures["hf_padding_efficiency_by_source"] = padding_efficiency_by_source(prepared)
    figures["checkpoint_stall_s"] = {"sync": med("trainer/fp32", "stall_s"), "async": med("trainer-async/fp32", "stall_s")}
    figures["raw"] = raw
    print(json.dumps(figures, indent=2))
    if not args.no_append:
        append_results(figures)
    return figures


def append_results(f: dict[str, Any]) -> None:
    m = f["machine"]
    lines = [
        "",
        f"## trainer ({m['date']})",
        "",
        f"Machine: {m['nproc']} cores, {m['cpu']} (avx512_bf16: {m['avx512_bf16']}), shared with other sessions "
        f"(load average {os.getloadavg()[0]:.1f} at the end). Python {m['python']}, torch {m['torch']}, "
        f"transformers {m['transformers']}, accelerate {m['accelerate']}.",
        f"Llama 4 layers x 256 wide, vocab 2048, seq {SEQ}, micro batch {MICRO}, same packed rows for every system; "
        f"{f['steps']} steps per run (first {WARMUP} not timed), {f['repeats']} interleaved repeats, medians, "
        f"{f.get('threads', '?')} torch thread(s) per process. `python bench/bench_trainer.py --threads "
        f"{f.get('threads', '?')}`. "
        + ("Every system in one process." if f.get("in_process", True) else "Each run in a fresh interpreter."),
        "Two clocks: *wall* tokens/s and tokens per *CPU-second* of the process (all threads), as a cross-check: "
        "when neighbours load the machine both drop, so read the medians of the interleaved repeats.",
        "",
        "| precision | clock | bare loop | trainer | HF Trainer | trainer/bare | trainer/HF | useful packed | "
        "useful HF padding | packed/padded |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for precision in ("fp32", "bf16"):
        if precision not in f:
            continue
        p = f[precision]
        for unit in ("cpu", "wall", "steady cpu", "steady wall"):
            lines.append(
                f"| {precision} | {unit} | {p[f'bare_{unit}']:.0f} | {p[f'trainer_{unit}']:.0f} | {p[f'hf_{unit}']:.0f} | "
                f"{p[f'trainer_vs_bare_{unit}']:.3f} | {p[f'trainer_vs_hf_{unit}']:.3f} | {p[f'trainer_useful_{unit}']:.0f} | "
                + (f"{p[f'hf_padded_useful_{unit}']:.0f} | {p[f'packing_vs_hf_padding_useful_{unit}']:.2f}x |"
                   if p[f"hf_padded_useful_{unit}"] == p[f"hf_padded_useful_{unit}"] else "- | - |"))
    lines.append("")
    for precision in ("fp32", "bf16"):
        if precision not in f:
            continue
        p = f[precision]
        lines.append(
            f"- {precision} noise, the ratio within each repeat: trainer/bare " + "; ".join(
                f"{u} {p[f'trainer_vs_bare_{u}_repeats']}" for u in ("wall", "cpu", "steady wall", "steady cpu"))
            + "; trainer/HF " + "; ".join(
                f"{u} {p[f'trainer_vs_hf_{u}_repeats']}" for u in ("wall", "cpu", "steady wall", "steady cpu")) + ".")
        if "trainer_compile_wall" in p:
            lines.append(
                f"- {precision} `train.compile: true` (one run, compile time excluded by the warm-up window): "
                f"{p['trainer_compile_wall']:.0f} tokens/s wall ({p['trainer_compile_wall'] / p['trainer_wall']:.2f}x "
                f"the trainer's median), {p['trainer_compile_cpu']:.0f} per CPU-second "
                f"({p['trainer_compile_cpu'] / p['trainer_cpu']:.2f}x).")
    first = f.get("fp32", f.get("bf16", {}))
    stall = f["checkpoint_stall_s"]
    has_pad = first.get("hf_padding_efficiency", float("nan")) == first.get("hf_padding_efficiency", float("nan"))
    lines += [
        "",
        "" if not has_pad else
        f"Packing: {100 * f['packed_useful_fraction']:.1f} % of packed slots carry a loss (document starts excluded); "
        f"HF padding recipe: {100 * first.get('hf_padding_efficiency', float('nan')):.1f} % (one document per row, "
        f"truncated at {SEQ}, padded to the longest in the batch). Padding efficiency by source: "
        + ", ".join(f"{k} {100 * v:.1f} %" for k, v in f["hf_padding_efficiency_by_source"].items())
        + " (short docstrings are where padding wastes most).",
        "MLflow logging (local sqlite, batched every 5 steps) as a share of the trainer's loop time: "
        + ", ".join(f"{pr} {100 * f[pr]['mlflow_share_of_loop']:.2f} %" for pr in ("fp32", "bf16") if pr in f) + ".",
        "" if stall["async"] != stall["async"] else
        f"Checkpoint stall (median, fp32, 3.7M params + AdamW state, written then validated by reloading): "
        f"sync {stall['sync']:.3f} s, async {stall['async']:.3f} s (snapshot to memory, write + validation in a "
        "background thread).",
        "",
    ]
    path = append_results_md("\n".join(lines))
    print(f"appended to {path}")


if __name__ == "__main__":
    main()
