"""The device peak behind perf/mfu (validation.flops): one table, and a CPU bf16 peak that a
bf16 run cannot exceed on an AVX-512 BF16 CPU (the fp32 peak read MFU 1.2 there)."""

from __future__ import annotations

import pytest

from validation.flops import CPU_PEAK_TFLOPS_PER_THREAD, device_peak
from validation.spec import ResourceSpec


def test_cpu_peak_is_per_thread_and_doubles_for_bf16():
    cpu = ResourceSpec.model_validate({"gpus_per_node": 0})
    fp32, bf16 = device_peak(cpu, "fp32"), device_peak(cpu, "bf16")
    assert fp32 is not None and bf16 is not None
    assert (fp32.per, fp32.tflops) == ("thread", CPU_PEAK_TFLOPS_PER_THREAD)
    assert bf16.tflops == pytest.approx(2 * fp32.tflops)
    assert bf16.flops_per_second(4) == pytest.approx(4 * 2 * CPU_PEAK_TFLOPS_PER_THREAD * 1e12)


def test_an_explicit_peak_wins_everywhere():
    cpu = ResourceSpec.model_validate({"gpus_per_node": 0, "peak_tflops": 1.5})
    peak = device_peak(cpu, "bf16")
    assert peak is not None and (peak.tflops, peak.per, peak.source) == (1.5, "device", "resource.peak_tflops")
