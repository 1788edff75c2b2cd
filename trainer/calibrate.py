"""This machine's CPU speed on one spec's model, measured now (`validation.plan.cpu_speed`).

The spec's own model (built from config, seeded), its optimizer, its micro batch and sequence
length and its precision, on synthetic tokens (one document per row), with as many threads as a
training process gets: `warmup` steps, then `steps` timed ones, of which the median step counts:
a neighbour's burst during the seconds measured is not the machine's speed over the minutes of a
run (two measurements a minute apart while other test suites ran: the mean of one 593 tokens/s,
the median of the next 17,400; an idle run's loop logs 18,211). What the plan prices a CPU run
from, where the run happens on this machine (`pipeline demo`, `pipeline run`, `pipeline plan
--measure`); the figure is what the trainer logs as `perf/mfu`, over one thread's peak.
"""

from __future__ import annotations

import contextlib
import statistics
import time

from validation.flops import device_peak, flops_per_token
from validation.plan.cpu_speed import MeasuredCpu, needs_measurement, shape_key
from validation.spec import ExperimentSpec

STEPS = 8
WARMUP = 2


def measure_cpu(spec: ExperimentSpec, threads: int, steps: int = STEPS, warmup: int = WARMUP) -> MeasuredCpu:
    """Time `steps` training steps of `spec`'s model on `threads` threads (after `warmup`)."""
    import torch  # the execution layer's heavy import, here so that importing this module stays cheap

    from trainer.optim import build_optimizer

    t0 = time.perf_counter()
    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        generator = torch.Generator().manual_seed(spec.train.seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.train.seed)
            model = spec.model.build()
        model.train()
        optimizer = build_optimizer(model, spec.train, spec.model)
        rows, seq = spec.train.micro_batch_size, spec.data.seq_len
        ids = torch.randint(0, spec.model.vocab_size, (rows, seq), generator=generator)
        batch = {"input_ids": ids, "labels": ids.clone(),
                 "position_ids": torch.arange(seq).unsqueeze(0).expand(rows, seq).contiguous()}
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(spec.train.precision)
        cast = torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()
        times: list[float] = []
        for i in range(warmup + steps):
            started = time.perf_counter()
            with cast:
                loss = model(**batch, use_cache=False).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec.train.grad_clip)
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


def measure_specs(specs: list[ExperimentSpec], threads: int, steps: int = STEPS) -> list[MeasuredCpu]:
    """One measurement per distinct shape among `specs` that a measurement prices."""
    done: dict[str, MeasuredCpu] = {}
    for spec in specs:
        key = shape_key(spec)
        if needs_measurement(spec) and key not in done:
            done[key] = measure_cpu(spec, threads, steps)
    return list(done.values())


def describe(measured: list[MeasuredCpu]) -> str:
    return "; ".join(f"{m.tokens_per_s:,.0f} tokens/s = {m.loop_utilisation:.2f} of one thread's peak "
                     f"({m.steps} steps on {m.threads} thread{'s' if m.threads != 1 else ''}, {m.seconds:.1f} s)"
                     for m in measured)
