"""`resource.gpu_memory_gb` follows `gpu_type` when a spec with GPUs does not give it (issue 38).

On the old main it defaulted to 16 whatever the type: an h200 spec was told "a device has 16 GiB"
and refused layouts that fit. An unknown type without the field is refused, naming the known ones.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from validation.spec import CPU_PROCESS_MEMORY_GIB, GPU_MEMORY_GIB, ResourceSpec


@pytest.mark.parametrize("gpu_type", sorted(GPU_MEMORY_GIB))
def test_memory_per_device_comes_from_the_gpu_type_when_not_given(gpu_type: str):
    spec = ResourceSpec.model_validate({"gpus_per_node": 8, "gpu_type": gpu_type})
    assert spec.gpu_memory_gb == GPU_MEMORY_GIB[gpu_type]


def test_the_table_is_what_cuda_reports_rounded_down():
    assert GPU_MEMORY_GIB["h200"] == 139.5 and GPU_MEMORY_GIB["h100"] == 79.0  # 139.8 and 79.1 GiB reported
    assert all(value * 2 == int(value * 2) for value in GPU_MEMORY_GIB.values())  # multiples of 0.5 GiB


def test_a_given_value_wins_and_cpu_processes_keep_16_gib():
    assert ResourceSpec.model_validate({"gpus_per_node": 1, "gpu_type": "h200", "gpu_memory_gb": 100}).gpu_memory_gb == 100
    assert ResourceSpec.model_validate({}).gpu_memory_gb == CPU_PROCESS_MEMORY_GIB == 16.0
    assert ResourceSpec.model_validate({"cpu_processes": 4, "gpu_type": "h100"}).gpu_memory_gb == 16.0


def test_an_unknown_gpu_type_without_its_memory_is_refused_naming_the_known_ones():
    with pytest.raises(ValidationError) as info:
        ResourceSpec.model_validate({"gpus_per_node": 1, "gpu_type": "rtx4090"})
    (error,) = info.value.errors()
    assert error["type"] == "gpu_memory_unknown"
    assert error["msg"] == ("gpu_memory_gb is not given and gpu_type 'rtx4090' has no known memory size (known: "
                            + ", ".join(sorted(GPU_MEMORY_GIB)) + "): set resource.gpu_memory_gb (GiB per device)")
    assert ResourceSpec.model_validate({"gpus_per_node": 1, "gpu_type": "rtx4090", "gpu_memory_gb": 24}).gpu_memory_gb == 24
