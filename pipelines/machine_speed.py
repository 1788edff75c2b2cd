"""This machine's CPU speed for the specs a command prices, measured once (issue 37).

`pipeline demo`, `pipeline run --measure-cpu` and `pipeline plan --measure` price a CPU run from
a few training steps of the spec's own model on this machine (`trainer.calibrate`), with the
threads its training process will get (`launchers.solo.launch_threads`), instead of the recorded
utilisation (`validation.plan.cpu_speed`). Only specs the plan accepts are built (a spec the plan
refuses for memory gets the plan's one line, not an out-of-memory kill), and a measurement that
fails says so in one line and leaves the recorded figure in place: pricing never fails a command.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from basics.errors import PipelineError
from pipelines.launchers.solo import launch_threads
from validation.plan import plan_parallel
from validation.plan.cpu_speed import needs_measurement
from validation.resolved import ResolvedExperiment
from validation.spec import ExperimentSpec

if TYPE_CHECKING:
    from validation.plan.cpu_speed import MeasuredCpu


def measure_cpu(specs: Sequence[ExperimentSpec | None], warn: Callable[[str], None]) -> tuple[MeasuredCpu, ...]:
    """Measurements for the CPU specs among `specs` the plan accepts; () when none needs one."""
    wanted: list[tuple[ExperimentSpec, int]] = []
    for spec in specs:
        if spec is None or not needs_measurement(spec):
            continue
        try:
            plan_parallel(spec)
        except PipelineError:
            continue  # the plan says why, in its own words
        wanted.append((spec, launch_threads(world=spec.resource.world_size)))
    if not wanted:
        return ()
    from trainer.calibrate import measure_specs  # torch: only when a CPU spec is to be measured

    try:
        return tuple(measure_specs(wanted))
    except Exception as exc:  # noqa: BLE001 - a failed measurement prices at the recorded figure
        warn(f"could not measure this machine's CPU speed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
             "CPU runs are priced at the recorded utilisation")
        return ()


def for_experiment(spec: ExperimentSpec, resolved: ResolvedExperiment, baseline: ExperimentSpec | None,
                   warn: Callable[[str], None]) -> tuple[MeasuredCpu, ...]:
    """`measure_cpu` over what a command prices: the experiment, its baseline, a sweep's trials."""
    from pipelines.sweep import expand_trials

    trials = [t.spec for t in expand_trials(resolved)] if spec.sweep is not None else []
    return measure_cpu([spec, baseline, *trials], warn)


def describe(measured: Sequence[MeasuredCpu]) -> str:
    """One line: what was measured, or why nothing was."""
    if not measured:
        return "nothing to measure (no CPU spec without resource.assumed_mfu and train.compile)"
    return "; ".join(f"{m.tokens_per_s:,.0f} tokens/s = {m.loop_utilisation:.2f} of one thread's peak "
                     f"({m.steps} steps on {m.threads} thread{'s' if m.threads != 1 else ''}, {m.seconds:.1f} s)"
                     for m in measured)
