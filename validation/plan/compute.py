"""Compute and cost: training FLOPs, what one run costs in time and GPU-hours, and what all the
runs a plan will train cost together (`RunCost`: every seed, the baseline's included)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from validation.flops import (
    PEAK_TFLOPS_BF16,
    attention_flops_per_token,
    device_peak,
    matmul_parameters,
)
from validation.plan import cpu_speed
from validation.plan.common import Locator, _raise, no_location
from validation.plan.cpu_speed import MeasuredCpu
from validation.rules import virtual_stages_per_rank
from validation.spec import ExperimentSpec, ParallelLayout

# Peak FLOPS and FLOPs per token live in `validation.flops` (one table, one formula).
# A CPU process is estimated at one thread's peak. It never affects the tier: CPU runs cost no
# GPU-hours.
ESTIMATE_THREADS_PER_CPU_PROCESS = 1

# Utilisation of that one-thread peak over a whole CPU run (training, evaluations, checkpoints,
# start-up) on the shared 2-core runner, used unless the spec sets `resource.assumed_mfu`: the
# GPU default (0.35) planned experiments/base.yaml at 55 s where it took 8.5 min (issue 29):
# 3.06e12 FLOPs in 510 s is 6.0 GFLOP/s, 0.037 of 0.16 TFLOPS. The training loop alone reached
# 0.076 of it on the wall clock under load (bench/RESULTS.md, "trainer (2026-12-01 06:10 UTC)":
# 477 tokens/s x 25.6 MFLOP/token) and ~0.5 per CPU-second unloaded.
CPU_RUN_UTILISATION = 0.037
CPU_UTILISATION_SOURCE = "CPU whole-run, measured: experiments/base.yaml 8.5 min on 2 shared cores"


@dataclass(frozen=True)
class ComputeEstimate:
    """Training FLOPs of one run and what it costs on the spec's devices."""

    parameters: int
    """All parameters (`parameter_count()`)."""
    steps: int
    seq_len: int
    global_batch: int
    """Rows per optimizer step (micro batch x grad accumulation x dp): the spec's, whatever the layout."""
    tokens: int
    model_flops: float
    """6 x N x tokens with N the *active* matmul parameters (forward 2N + backward 4N per token;
    Kaplan et al. 2020); see `validation.flops`."""
    attention_flops: float
    """12 x layers x hidden x seq_len per token, forward + backward (PaLM, Chowdhery et al. 2022, App. B)."""
    peak_tflops_per_device: float
    peak_source: str
    """Where the peak came from: `resource.peak_tflops` or `table:<gpu_type>`."""
    assumed_mfu: float
    """Utilisation of the peak the wall time assumes (of active FLOPs: what MFU measures)."""
    pipeline_bubble: float
    """Wall-time factor of the pipeline bubble (`pipeline_bubble_factor`); 1 without pp."""
    world_size: int
    on_gpu: bool
    wall_seconds: float
    time_limit_minutes: int
    active_parameters: int = 0
    """Parameters one token passes through (`active_parameter_count()`; = parameters when dense)."""
    matmul_parameters: int = 0
    """The N of 6NT: active parameters that take part in a matmul per token."""
    mfu_source: str = "resource.assumed_mfu"
    evaluation_flops: float = 0.0
    """Held-out evaluations' forward passes, when the wall time counts them (a measured CPU)."""
    fixed_seconds: float = 0.0
    """Seconds per run that no FLOP accounts for, when the wall time counts them (a measured CPU)."""

    @property
    def total_flops(self) -> float:
        return self.model_flops + self.attention_flops

    @property
    def device_hours(self) -> float:
        return self.wall_seconds * self.world_size / 3600.0

    @property
    def gpu_hours(self) -> float:
        """What the budget counts: device-hours on GPUs, zero on CPUs."""
        return self.device_hours if self.on_gpu else 0.0

    @property
    def fits_time_limit(self) -> bool:
        return self.wall_seconds <= self.time_limit_minutes * 60

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            total_flops=self.total_flops,
            device_hours=self.device_hours,
            gpu_hours=self.gpu_hours,
            fits_time_limit=self.fits_time_limit,
        )
        return data


def utilisation(spec: ExperimentSpec, measured: MeasuredCpu | None = None) -> tuple[float, str]:
    """The MFU the wall time assumes and where it comes from: `resource.assumed_mfu` when the
    spec sets it or on GPUs; for a CPU run that does not, this machine's `measured` speed when
    given (`cpu_speed.pick` chose it for `spec`), else `CPU_RUN_UTILISATION`."""
    if measured is not None:
        return measured.loop_utilisation, measured.source()
    if cpu_speed.states_no_utilisation(spec):
        return CPU_RUN_UTILISATION, CPU_UTILISATION_SOURCE
    return spec.resource.assumed_mfu, "resource.assumed_mfu"


def estimate_compute(
    spec: ExperimentSpec,
    layout: ParallelLayout,
    *,
    locate: Locator = no_location,
    global_batch: int | None = None,
    grad_accum_steps: int | None = None,
    measured_cpu: Sequence[MeasuredCpu] = (),
) -> ComputeEstimate:
    """FLOPs of one run and the time/GPU-hours they take at `utilisation(spec, measured_cpu)`.
    Priced from a measurement of this machine (the one of `measured_cpu` that fits the spec), the wall time
    also counts the evaluations' forward passes and the run's fixed seconds
    (`validation.plan.cpu_speed`); the recorded utilisation prices a whole run as it was measured.

    FLOPs per token come from `validation.flops.flops_per_token` (the formula the trainer's
    MFU uses; active parameters), the peak from `validation.flops.device_peak`. `global_batch`
    and `grad_accum_steps` default to the spec's over `layout.dp` (the planner passes the ones
    its layout keeps). Raises `SpecError` at `resource.peak_tflops` for a gpu_type without a
    known peak.
    """
    resource, model = spec.resource, spec.model
    peak = device_peak(resource, spec.train.precision)
    if peak is None:
        known = ", ".join(sorted(PEAK_TFLOPS_BF16))
        _raise(
            locate,
            "resource.peak_tflops",
            f"no peak FLOPS known for gpu_type '{resource.gpu_type}' (known: {known}); "
            "set resource.peak_tflops to its dense bf16 TFLOPS",
        )
    peak_tf = peak.flops_per_second(ESTIMATE_THREADS_PER_CPU_PROCESS) / 1e12
    measured = cpu_speed.pick(spec, measured_cpu)
    mfu, mfu_source = utilisation(spec, measured)

    batch = spec.global_batch(layout.dp) if global_batch is None else global_batch
    accum = spec.train.grad_accum_steps if grad_accum_steps is None else grad_accum_steps
    if spec.train.max_steps is not None:
        steps = spec.train.max_steps
    else:
        assert spec.train.token_budget is not None
        steps = max(1, -(-spec.train.token_budget // (batch * spec.data.seq_len)))
    tokens = steps * batch * spec.data.seq_len
    n = matmul_parameters(model)
    model_flops = 6.0 * n * tokens
    attention_flops = attention_flops_per_token(model, spec.data.seq_len) * tokens
    bubble = pipeline_bubble_factor(layout.pp, accum, layout.pp_schedule)
    world = layout.dp * layout.tp * layout.pp
    evaluation, fixed = 0.0, 0.0
    if measured is not None:
        evaluation = cpu_speed.evaluation_flops(spec, (model_flops + attention_flops) / tokens, steps)
        fixed = measured.fixed_seconds()
    wall = (model_flops + attention_flops + evaluation) / (world * peak_tf * 1e12 * mfu) * bubble + fixed
    return ComputeEstimate(
        parameters=model.parameter_count(),
        steps=steps,
        seq_len=spec.data.seq_len,
        global_batch=batch,
        tokens=tokens,
        model_flops=model_flops,
        attention_flops=attention_flops,
        peak_tflops_per_device=peak_tf,
        peak_source=peak.source,
        assumed_mfu=mfu,
        pipeline_bubble=bubble,
        world_size=world,
        on_gpu=resource.gpus_per_node > 0,
        wall_seconds=wall,
        time_limit_minutes=resource.time_limit_minutes,
        active_parameters=model.active_parameter_count(),
        matmul_parameters=n,
        mfu_source=mfu_source,
        evaluation_flops=evaluation,
        fixed_seconds=fixed,
    )


@dataclass(frozen=True)
class RunCost:
    """Every run a plan will train: this experiment on each hypothesis seed, and its baseline
    on the same seeds (`validation.resolved`: a baseline runs on its candidate's seeds)."""

    seeds: int
    per_run_device_hours: float
    baseline_runs: int
    baseline_per_run_device_hours: float
    baseline_note: str
    on_gpu: bool

    @property
    def total_device_hours(self) -> float:
        return self.seeds * self.per_run_device_hours + self.baseline_runs * self.baseline_per_run_device_hours

    @property
    def gpu_hours(self) -> float:
        return self.total_device_hours if self.on_gpu else 0.0

    def describe(self) -> str:
        text = f"{self.seeds} seed(s) x {self.per_run_device_hours:.3g}"
        if self.baseline_runs:
            text += f" + baseline {self.baseline_runs} x {self.baseline_per_run_device_hours:.3g}"
        return f"{text} = {self.total_device_hours:.3g} device-hours"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(total_device_hours=self.total_device_hours, gpu_hours=self.gpu_hours, describe=self.describe())
        return data


def pipeline_bubble_fraction(pp: int, micro_batches: int, schedule: str = "1f1b") -> float:
    """Idle share of a step: (pp - 1) / (m + pp - 1) for GPipe and 1F1B; Interleaved 1F1B
    (`virtual_stages_per_rank`: 2, trainer/pipeline_parallel.py) divides the bubble by the virtual
    stages: (pp - 1) / (v m + pp - 1)."""
    if pp <= 1:
        return 0.0
    virtual = virtual_stages_per_rank(schedule)
    return (pp - 1) / (virtual * max(1, micro_batches) + pp - 1)


def pipeline_bubble_factor(pp: int, micro_batches: int, schedule: str = "1f1b") -> float:
    """Wall time over bubble-free time: 1 / (1 - bubble fraction)."""
    return 1.0 / (1.0 - pipeline_bubble_fraction(pp, micro_batches, schedule))
