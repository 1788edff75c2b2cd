"""The process environment: offline/telemetry defaults, and the fingerprint a run records.

`OFFLINE_ENV` is the one list of variables every pipeline and trainer process gets by
default (MLflow and Hugging Face must not phone home or download; tokenizers must not
fork thread pools under our processes). `apply_offline_env` sets them where unset;
`scoped_environ` changes variables for one block and puts back exactly what was there.

`env_fingerprint` is what a run trained on: two runs are comparable only when their
`COMPARED_KEYS` agree (`fingerprint_diff`). Package versions come from the installed
metadata (no import); torch is imported only for the CUDA version and the GPU model.
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from importlib import metadata
from typing import Any

OFFLINE_ENV: dict[str, str] = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def apply_offline_env(env: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
    """Set every `OFFLINE_ENV` default in `env` (this process's environment by default) where unset."""
    target: MutableMapping[str, str] = os.environ if env is None else env
    for key, value in OFFLINE_ENV.items():
        target.setdefault(key, value)
    return target


@contextmanager
def scoped_environ(**values: str | None) -> Iterator[None]:
    """Set (a string) or remove (None) each variable of this process's environment for the block.

    On exit every variable named here is put back exactly: to its earlier value, or unset when it
    was unset, whatever the block did to it meanwhile (other variables are left alone)."""
    saved = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, before in saved.items():
            if before is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = before


KEY_PACKAGES = ("torch", "accelerate", "transformers", "mlflow")
COMPARED_KEYS = ("python", "torch", "cuda", "accelerate", "transformers", "gpu_model")
"""What makes two runs' numbers comparable (host name, CPU count and threads do not)."""


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
    import torch  # lazy for speed: `pipeline validate` stays torch-free until a run asks

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "cuda": torch.version.cuda,
        "gpu_count": count,
        "gpu_model": torch.cuda.get_device_name(0) if count else None,
    }


def env_fingerprint(world_size: int | None = None) -> dict[str, Any]:
    """python, torch, cuda, accelerate, transformers, mlflow versions, GPU model, host, CPU, threads."""
    import torch  # lazy for speed, as above

    fp: dict[str, Any] = {"python": platform.python_version()}
    for name in KEY_PACKAGES:
        fp[name] = package_version(name)
    fp.update(accelerators())
    fp.update({
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
    })
    if world_size is not None:
        fp["world_size"] = world_size
    return fp


def fingerprint_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Human lines for every comparability-relevant difference, e.g. `torch: 2.13.0 vs 2.12.1`."""
    return [f"{key}: {a.get(key)} vs {b.get(key)}" for key in COMPARED_KEYS if a.get(key) != b.get(key)]
