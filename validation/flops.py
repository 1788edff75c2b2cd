"""Device peak FLOPS and training FLOPs per token: one table, one formula.

The FLOPs are the architecture's own (models/<model_type>.py); this module is the one
place the rest of the pipeline reads them from. Read by the preflight estimate (GPU-hours, wall time), the resolve step (written into
`spec.resolved.json`), the trainer (MFU) and sweeps (the cost that breaks ties). Pure
and standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from validation.spec import ModelSpec, ResourceSpec

# Dense bf16 peak per device in TFLOPS (vendor data sheets, without sparsity).
PEAK_TFLOPS_BF16: dict[str, float] = {
    "h100": 989.0,
    "h200": 989.0,
    "b200": 2250.0,
    "a100": 312.0,
    "l40s": 362.0,
    "l4": 121.0,
    "a10g": 125.0,
    "v100": 125.0,
    "t4": 65.0,  # fp16 (no bf16 on Turing)
}

# fp32 training on a GPU runs its matmuls on TF32 tensor cores at half the bf16 rate
# (H100 494 vs 989, A100 156 vs 312). Applies to table entries only, not to an explicit
# `resource.peak_tflops`.
FP32_PEAK_FRACTION = 0.5

# CPUs vary too much for a per-device table, so the CPU peak is per *thread*: the AVX-512
# fp32 FMA peak (2 FMA units x 16 lanes x 2 flops x ~2.5 GHz = 160 GFLOPS). A peak is a
# ceiling, documented not measured, so MFU on a CPU is a relative figure (compare runs on
# the same machine only). A device (one CPU process) has as many threads as torch uses.
CPU_PEAK_TFLOPS_PER_THREAD = 0.16
# bf16 on a CPU with AVX-512 BF16 (VDPBF16PS: a pair of bf16 products per fp32 lane) doubles
# that. Measured here: the bench Llama reached 0.19 TFLOPS on one thread in bf16, so the fp32
# peak gave an MFU of 1.2 (impossible). CPUs with AMX tiles go higher still: set
# `resource.peak_tflops` there (the trainer warns when a measured MFU exceeds 1).
CPU_BF16_PEAK_FACTOR = 2.0


def peak_tflops_for_device_name(device_name: str) -> float | None:
    """Dense bf16 TFLOPS of a device named like `torch.cuda.get_device_name()` ("NVIDIA H200"),
    from the table above; None when the table does not know it. Longest key first: "l40s"
    before "l4"."""
    name = device_name.lower().replace(" ", "")
    return next((PEAK_TFLOPS_BF16[k] for k in sorted(PEAK_TFLOPS_BF16, key=len, reverse=True) if k in name), None)


@dataclass(frozen=True)
class DevicePeak:
    """Dense peak of one device for the run's precision, and where the number came from."""

    tflops: float
    """Per device on GPUs; per thread on CPUs (see `per`)."""
    per: Literal["device", "thread"]
    """`thread` on CPUs: multiply by the threads of one process (`flops_per_second`)."""
    source: str
    """`resource.peak_tflops`, `table:<gpu_type>` (+ fp32 note) or `cpu:per-thread`."""

    def flops_per_second(self, threads: int = 1) -> float:
        """Peak FLOP/s of one device (one process on CPU, using `threads` threads)."""
        factor = max(1, threads) if self.per == "thread" else 1
        return self.tflops * 1e12 * factor


def device_peak(resource: ResourceSpec, precision: str) -> DevicePeak | None:
    """The peak of one of `resource`'s devices at `precision`; None for an unknown GPU type."""
    if resource.peak_tflops is not None:
        return DevicePeak(resource.peak_tflops, "device", "resource.peak_tflops")
    if resource.gpus_per_node == 0:
        factor = CPU_BF16_PEAK_FACTOR if precision in ("bf16", "fp16") else 1.0
        return DevicePeak(CPU_PEAK_TFLOPS_PER_THREAD * factor, "thread", "cpu:per-thread")
    if resource.gpu_type not in PEAK_TFLOPS_BF16:
        return None
    peak = PEAK_TFLOPS_BF16[resource.gpu_type]
    if precision == "fp32":
        return DevicePeak(peak * FP32_PEAK_FRACTION, "device", f"table:{resource.gpu_type} (fp32 via TF32)")
    return DevicePeak(peak, "device", f"table:{resource.gpu_type}")


def matmul_parameters(model: ModelSpec) -> int:
    """Parameters that take part in a matmul per token, as the architecture declares them
    (models/<model_type>.py): lookups (an untied input embedding, learned positions), norm
    weights and biases are not matmuls. A tied embedding counts once, as the output projection."""
    return model.matmul_parameters()


def attention_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """12 x layers x attention width x seq_len, forward + backward (PaLM, Chowdhery et al. 2022,
    App. B), as the architecture declares it."""
    return model.attention_flops_per_token(seq_len)


def flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token: 6 x matmul parameters (forward 2 + backward 4; Kaplan et al.
    2020) plus the attention term; declared by the architecture, checked in
    tests/integration/test_models_contract.py against torch's FLOP counter on fake tensors."""
    return model.flops_per_token(seq_len)
