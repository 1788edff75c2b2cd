"""The environment a run trained in: recorded with every run, compared between runs.

Two runs are only comparable when they ran on the same software and hardware; the
report flags candidate/baseline pairs whose fingerprints differ (`fingerprint_diff`).
Package versions come from the installed metadata (no import); torch is imported only
for the CUDA version and the GPU model.
"""

from __future__ import annotations

import os
import platform
import socket
from importlib import metadata
from typing import Any

KEY_PACKAGES = ("torch", "accelerate", "transformers", "mlflow")
# What makes two runs' numbers comparable (hostname and CPU count do not).
COMPARED_KEYS = ("python", "torch", "cuda", "accelerate", "transformers", "gpu_model")


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def accelerators() -> dict[str, Any]:
    """CUDA version, visible GPU count and model (imports torch)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "cuda": torch.version.cuda,
        "gpu_count": count,
        "gpu_model": torch.cuda.get_device_name(0) if count else None,
    }


def env_fingerprint() -> dict[str, Any]:
    """python, torch, cuda, accelerate, transformers (+mlflow) versions, GPU model, host, CPU."""
    fp: dict[str, Any] = {"python": platform.python_version()}
    for name in KEY_PACKAGES:
        fp[name] = package_version(name)
    fp.update(accelerators())
    fp.update({
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    })
    return fp


def fingerprint_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Human lines for every comparability-relevant difference, e.g. `torch: 2.13.0 vs 2.12.1`."""
    return [f"{key}: {a.get(key)} vs {b.get(key)}" for key in COMPARED_KEYS if a.get(key) != b.get(key)]
