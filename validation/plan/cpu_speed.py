"""A CPU run's time, priced from this machine's speed measured now (issue 37).

A CPU is not a catalogue device: the same 2 cores train the demo's model at 0.85 of one thread's
peak when idle and at 0.07 when five test suites share them. One recorded utilisation
(`compute.CPU_RUN_UTILISATION`, measured under load) priced an idle demo ~9x too high, and the
reviewer read "9 % of the approved plan". So where the work runs on this machine (`pipeline
demo`, `pipeline run`, `pipeline plan --measure`), the plan takes a measurement instead:

  - `MeasuredCpu`: a few training steps of the spec's own model at its micro batch and sequence
    length, on synthetic tokens, with the threads a training process gets (`trainer/calibrate.py`).
    Its utilisation prices the training steps and the evaluations (forward only: a third of a
    training token's FLOPs).
  - What is not steps (the trainer's start-up, the MLflow run, checkpoints, export, downstream
    tasks) is `RUN_FIXED_SECONDS`, measured once on an idle machine. It is not scaled by the
    loop's speed now: under load the loop (two OpenMP threads on two busy cores) slowed 30x
    while that part slowed 1-4x, unrelated to it (runs under runs/20261204, load 2-7). On a
    busy machine it is the part the plan underestimates.

Measured (2 Intel Xeon cores, 23 GiB, idle, 2026-12-04): next-line-base seed 1236, 60 steps of
16 x 128 tokens, fp32: 13.99 s wall, 6.75 s of steps at 18,211 tokens/s (0.85 of one thread's
0.16 TFLOPS: perf/mfu 0.425 over 2 threads), two evaluations of 3 sources x 4 x 16 rows (0.90 s
at that speed), the rest 6.3 s. Torch-free: the measurement itself happens in the execution layer.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from validation.plan.decision import eval_points
from validation.spec import EVAL_ROWS_PER_BATCH, ExperimentSpec

RUN_FIXED_SECONDS = 6.3
"""A CPU run's seconds that are not training or evaluation steps, on an idle machine."""
EVAL_FLOPS_SHARE = 1.0 / 3.0
"""An evaluated token costs the forward pass: 2N of the 6N a trained token costs."""


@dataclass(frozen=True)
class MeasuredCpu:
    """This machine's speed on one spec's model, measured by `trainer.calibrate.measure_cpu`."""

    loop_utilisation: float
    """Training steps' FLOPs per second over one thread's peak (what the plan's MFU means on CPUs)."""
    tokens_per_s: float
    threads: int
    steps: int
    seconds: float
    """How long the measurement took (model built, warm-up and timed steps)."""
    shape: str
    """`shape_key` of the spec measured: it prices the specs that train the same shapes."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.loop_utilisation) and self.loop_utilisation > 0.0):
            raise ValueError(f"measured CPU utilisation {self.loop_utilisation} is not a utilisation")

    def fixed_seconds(self) -> float:
        """Per run: start-up, checkpoints, export and downstream tasks (idle: see the module doc)."""
        return RUN_FIXED_SECONDS

    def source(self) -> str:
        return (f"measured on this machine now: {self.steps} steps at {self.tokens_per_s:,.0f} tokens/s on "
                f"{self.threads} thread{'s' if self.threads != 1 else ''}, + {self.fixed_seconds():.0f} s per run "
                "of start-up, checkpoints and export")


def shape_key(spec: ExperimentSpec) -> str:
    """What a step's speed depends on: the model, the tokens of a micro batch, the precision, the
    checkpointing, the processes sharing the machine (their threads) and the optimizer's kind (not
    its learning rate: the demo's candidate and baseline share one)."""
    tr = spec.train
    shape = {"model": spec.model.model_dump(mode="json"), "seq_len": spec.data.seq_len,
             "micro_batch": tr.micro_batch_size, "precision": tr.precision,
             "checkpointing": tr.activation_checkpointing, "processes": spec.resource.world_size,
             "optimizer": tr.optimizer.model_dump(mode="json").get("name")}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def states_no_utilisation(spec: ExperimentSpec) -> bool:
    """A CPU spec that does not state its own `resource.assumed_mfu` (the plan picks its figure)."""
    resource = spec.resource
    return resource.gpus_per_node == 0 and "assumed_mfu" not in resource.model_fields_set


def needs_measurement(spec: ExperimentSpec) -> bool:
    """Priced from this machine's speed when measured: a CPU spec without its own utilisation, not
    compiled (a few eager steps do not time a compiled run)."""
    return states_no_utilisation(spec) and not spec.train.compile


def applies(spec: ExperimentSpec, measured: MeasuredCpu | None) -> bool:
    """`measured` prices `spec`: a CPU spec without its own utilisation, and the same shapes."""
    return measured is not None and needs_measurement(spec) and measured.shape == shape_key(spec)


def pick(spec: ExperimentSpec, measured: Sequence[MeasuredCpu]) -> MeasuredCpu | None:
    """The measurement that prices `spec`, if one was taken."""
    return next((m for m in measured if applies(spec, m)), None)


def evaluation_flops(spec: ExperimentSpec, flops_per_training_token: float, total_steps: int) -> float:
    """FLOPs of a run's held-out evaluations: every `train.eval_interval` steps and at the end
    (trainer/loop.py), `train.eval_batches` units of `EVAL_ROWS_PER_BATCH` rows for each source
    (trainer/evaluation.py: a fixed eval set, whatever the micro batch), forward only."""
    tr = spec.train
    rows = eval_points(total_steps, tr.eval_interval) * len(spec.data.sources) * tr.eval_batches * EVAL_ROWS_PER_BATCH
    return rows * spec.data.seq_len * flops_per_training_token * EVAL_FLOPS_SHARE
