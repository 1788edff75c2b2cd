"""This machine's CPU speed on one spec's model, measured now (`validation.plan.cpu_speed`).

The spec's own model (built from config, seeded), its optimizer, the micro batch and activation
checkpointing the plan gives it, its sequence length and precision, on synthetic packed rows
(two documents per row: the document-masked attention a training row takes), with as many
threads as a training process gets: `warmup` steps, then `steps` timed ones, of which the median
step counts: a neighbour's burst during the seconds measured is not the machine's speed over the
minutes of a run (two measurements a minute apart while other test suites ran: the mean of one
593 tokens/s, the median of the next 17,400; an idle run's loop logs 18,211). The figure is the
trainer's `perf/mfu` x threads: FLOPs per second over one thread's peak, what the plan's MFU
means on CPUs. Not measured: `train.compile` (such a spec is priced at the recorded figure) and
gradient accumulation (an optimizer step per micro batch here: AdamW's step is ~1 % of one).
"""

from __future__ import annotations

import contextlib
import statistics
import time

from trainer.activation_checkpointing import apply_activation_checkpointing
from validation.flops import device_peak, flops_per_token
from validation.plan import plan_parallel
from validation.plan.cpu_speed import MeasuredCpu, needs_measurement, shape_key
from validation.spec import ExperimentSpec

STEPS = 8
WARMUP = 2
DOCUMENTS_PER_ROW = 2


def measure_cpu(spec: ExperimentSpec, threads: int, steps: int = STEPS, warmup: int = WARMUP) -> MeasuredCpu:
    """Time `steps` training steps of `spec`'s model on `threads` threads (after `warmup`)."""
    import torch  # the execution layer's heavy import, here so that importing this module stays cheap

    from trainer.optim import build_optimizer

    t0 = time.perf_counter()
    planned = plan_parallel(spec)  # the micro batch and checkpointing the run will train with
    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        generator = torch.Generator().manual_seed(spec.train.seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.train.seed)
            model = spec.model.build()
        apply_activation_checkpointing(spec.model, model, planned.activation_checkpointing)
        model.train()
        optimizer = build_optimizer(model, spec.train, spec.model)
        rows, seq = planned.micro_batch_size, spec.data.seq_len
        ids = torch.randint(0, spec.model.vocab_size, (rows, seq), generator=generator)
        positions = torch.arange(seq) % max(1, -(-seq // DOCUMENTS_PER_ROW))  # each row: packed documents
        batch = {"input_ids": ids, "labels": ids.clone(), "position_ids": positions.expand(rows, seq).contiguous()}
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(spec.train.precision)
        cast = torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()
        max_norm = spec.train.grad_clip or float("inf")  # 0 turns clipping off, as in trainer/step.py
        times: list[float] = []
        for i in range(warmup + steps):
            started = time.perf_counter()
            with cast:
                loss = model(**batch, use_cache=False).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            float(loss.detach())  # the trainer reads its loss every step too
            if i >= warmup:
                times.append(time.perf_counter() - started)
        del model, optimizer
    finally:
        torch.set_num_threads(previous)
    tokens_per_s = rows * seq / statistics.median(times)
    peak = device_peak(spec.resource, spec.train.precision)
    assert peak is not None  # a CPU always has one (validation.flops)
    utilisation = tokens_per_s * flops_per_token(spec.model, seq) / peak.flops_per_second(1)
    return MeasuredCpu(utilisation, tokens_per_s, max(1, threads), steps, time.perf_counter() - t0, shape_key(spec))


def measure_specs(specs: list[tuple[ExperimentSpec, int]], steps: int = STEPS) -> list[MeasuredCpu]:
    """One measurement per distinct (shape, threads) among `specs` ((spec, threads) pairs) that a
    measurement prices."""
    done: dict[tuple[str, int], MeasuredCpu] = {}
    for spec, threads in specs:
        key = (shape_key(spec), threads)
        if needs_measurement(spec) and key not in done:
            done[key] = measure_cpu(spec, threads, steps)
    return list(done.values())

