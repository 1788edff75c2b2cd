"""The trainer's optimizer step against a bare PyTorch step on the same model, in one process.

    .venv/bin/python bench/ab_trainer_step.py [--precision bf16] [--blocks 8] [--no-append]

bench/bench_trainer.py compares whole runs, each in a fresh interpreter: that is the honest
end-to-end figure, but two processes running identical code differ by a few per cent on this
machine (allocator placement, neighbours), which hides differences of 1-2 %. Here every
variant runs on the *same* model, optimizer state and batches, interleaved in blocks of 4
steps (the first of each block not counted, the block order alternating), so only the code
of the step differs:
  T           `Trainer.train_step` as shipped (accelerate-prepared model, deterministic mode);
  T_nodet     the same with deterministic algorithms off;
  T_upcast    the same with accelerate's `convert_outputs_to_fp32` wrapper put back
              (bf16 only: the copy of the logits to fp32 the trainer drops);
  bare        forward/backward/clip/AdamW written out, on the trainer's model and a second
              fused AdamW (torch.autocast in bf16);
  bare_fresh  the same on a model built by `trainer.model.build_model` (not meta-initialised).
Reports the median CPU ms per step of each and appends a section to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_trainer import bench_spec, packed_batches, prepared_data
from scaffold import append_results_md, as_tensors, machine


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args(argv)

    import torch
    from accelerate.utils import convert_outputs_to_fp32

    from trainer.loop import Trainer
    from trainer.model import build_model
    from trainer.optim import build_optimizer

    torch.set_num_threads(1)
    prepared = prepared_data()
    spec = bench_spec(args.precision, 10_000)
    work = Path(tempfile.mkdtemp(prefix="ab-step-"))
    t = Trainer(spec, work / "run", prepared.path, tracking_uri="none", prepared=prepared)
    batches = as_tensors(packed_batches(prepared, 8))
    bf16 = args.precision == "bf16"
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    raw: Any = t.raw_model
    shipped_forward = raw.forward
    upcast_forward = convert_outputs_to_fp32(shipped_forward)
    opt_raw = build_optimizer(raw, spec.train, spec.model)
    torch.manual_seed(0)
    fresh = build_model(spec.model)
    opt_fresh = build_optimizer(fresh, spec.train, spec.model)
    step = 0

    def run(variant: str) -> float:
        nonlocal step
        c = time.process_time()
        if variant.startswith("bare"):
            model, opt = (raw, opt_raw) if variant == "bare" else (fresh, opt_fresh)
            with ctx():
                loss = model(**batches[step % len(batches)], use_cache=False).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            torch.use_deterministic_algorithms(variant != "T_nodet", warn_only=True)
            if variant == "T_upcast":
                raw.forward = upcast_forward
            t.train_step(step)
            raw.forward = shipped_forward
            torch.use_deterministic_algorithms(True, warn_only=True)
        step += 1
        return time.process_time() - c

    variants = ["T", "T_nodet", *(["T_upcast"] if bf16 else []), "bare", "bare_fresh"]
    samples: dict[str, list[float]] = {v: [] for v in variants}
    for block in range(args.blocks):
        for v in variants if block % 2 == 0 else variants[::-1]:
            for i in range(4):
                ms = run(v) * 1000
                if i:
                    samples[v].append(ms)
    medians = {v: statistics.median(x) for v, x in samples.items()}
    for v in variants:
        print(f"{args.precision} {v:10s} {medians[v]:7.1f} ms/step (n={len(samples[v])})")
    if not args.no_append:
        m = machine()
        lines = ["", f"## trainer step vs bare step, one process ({m['date']})", "",
                 f"Machine: {m['nproc']} cores, {m['cpu']}, torch {m['torch']}, 1 thread. "
                 f"`python bench/ab_trainer_step.py --precision {args.precision} --blocks {args.blocks}`: "
                 "the same model, optimizer state and batches, variants interleaved in blocks of 4 steps; "
                 "median CPU ms per optimizer step.", "",
                 "| precision | " + " | ".join(variants) + " | speed T ÷ bare |",
                 "|---|" + "---|" * (len(variants) + 1),
                 f"| {args.precision} | " + " | ".join(f"{medians[v]:.1f}" for v in variants)
                 + f" | {medians['bare'] / medians['T']:.3f} |", ""]
        append_results_md("\n".join(lines))
    return medians


if __name__ == "__main__":
    main()
