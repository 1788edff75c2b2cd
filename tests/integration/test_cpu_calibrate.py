"""This machine's CPU speed, measured by real training steps of the spec's own model
(`trainer.calibrate`), and `pipeline plan --measure` pricing a CPU run from it (issue 37)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_measurement_is_the_trainers_mfu_formula_on_the_specs_own_shapes():
    import torch

    from trainer.calibrate import measure_cpu, measure_specs
    from validation.flops import flops_per_token
    from validation.loader import load_spec
    from validation.plan.cpu_speed import shape_key

    spec = load_spec(REPO / "experiments" / "next-line-lr.yaml")
    base = load_spec(REPO / "experiments" / "next-line-base.yaml")
    threads = torch.get_num_threads()
    m = measure_cpu(spec, threads=1, steps=3, warmup=1)
    assert torch.get_num_threads() == threads  # the caller's threads are given back
    assert (m.threads, m.steps, m.shape) == (1, 3, shape_key(spec))
    # arithmetic: tokens/s x FLOPs per token over one thread's peak (0.16 TFLOPS in fp32), the
    # trainer's perf/mfu x threads
    assert m.loop_utilisation == pytest.approx(m.tokens_per_s * flops_per_token(spec.model, 128) / 0.16e12)
    assert 0 < m.loop_utilisation < 8 and m.seconds > 0
    # candidate and baseline differ by the learning rate only: one measurement prices both
    assert [x.shape for x in measure_specs([(spec, 1), (base, 1)], steps=2)] == [shape_key(spec)]


def test_a_spec_the_plan_refuses_is_not_measured():
    """Measuring builds and trains the model: a spec the plan refuses for memory gets the plan's
    one line, never an out-of-memory kill while being measured."""
    from pipelines.machine_speed import measure_cpu
    from validation.loader import load_spec
    from validation.resolved import rebuild

    spec = load_spec(REPO / "experiments" / "next-line-lr.yaml")
    refused = rebuild(spec, {"resource.gpu_memory_gb": 0.2})  # 580 MiB needed per process
    warnings: list[str] = []
    assert measure_cpu([refused, None], warnings.append) == () and warnings == []


def test_pipeline_plan_measure_prices_the_run_from_this_machine(tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "plan", str(REPO / "experiments" / "next-line-lr.yaml"),
         "--measure", "--format", "json"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "measured this machine: " in proc.stderr and "of one thread's peak (8 steps on" in proc.stderr
    compute = json.loads(proc.stdout)["preflight"]["compute"]
    assert compute["mfu_source"].startswith("measured on this machine now: 8 steps at ")
    assert compute["fixed_seconds"] > 0 and compute["evaluation_flops"] > 0
    steps = (compute["model_flops"] + compute["attention_flops"] + compute["evaluation_flops"]) / (
        compute["peak_tflops_per_device"] * 1e12 * compute["assumed_mfu"])
    assert compute["wall_seconds"] == pytest.approx(steps + compute["fixed_seconds"])
