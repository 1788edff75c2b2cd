"""Shared fixtures: real servers, started once per test session.

- `mlflow_server`: a real `mlflow server` on 127.0.0.1 (sqlite store, local artifacts).
- `slurm_cluster`: a real single-host Slurm cluster with two slurmd nodes (n1, n2).

Helpers that only some tests need live in `tests/infra/` (import them as `infra.<module>`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from validation.environment import apply_offline_env

# Every process a test starts inherits these (MLflow phones home on import otherwise).
apply_offline_env()

INFRA = Path(__file__).resolve().parent / "infra"


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A running MLflow server for the session: `.uri` (tracking URI), `.backend_uri`, `.artifacts`.

    Tests share it, so each test should use its own experiment name.
    """
    from infra.mlflow_server import MlflowServer

    with MlflowServer(tmp_path_factory.mktemp("mlflow")) as server:
        yield server


@dataclass(frozen=True)
class SlurmCluster:
    conf: Path
    """The cluster's slurm.conf; `SLURM_CONF` points at it for the whole session."""
    nodes: tuple[str, ...]
    startup_s: float
    """Seconds `slurm.sh start` took in this session (0 when it was already running)."""


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A two-node Slurm cluster (`tests/infra/slurm.sh`), installed and started when needed.

    Sets `SLURM_CONF` so `sbatch`/`squeue`/`scontrol` reach it. Stopped at the end only if
    this session started it. Skips (with the reason) only when Slurm cannot be installed.
    """
    script = str(INFRA / "slurm.sh")
    state = Path(os.environ.get("SLURM_TEST_STATE", "/tmp/pipeline-slurm"))
    running = subprocess.run([script, "status"], capture_output=True).returncode == 0
    started = 0.0
    if not running:
        if shutil.which("sbatch") is None and (os.geteuid() != 0 or shutil.which("apt-get") is None):
            pytest.skip("Slurm is not installed and cannot be (needs root and apt-get)")
        t0 = time.monotonic()
        proc = subprocess.run([script, "start"], capture_output=True, text=True, timeout=900)
        started = time.monotonic() - t0
        if proc.returncode != 0:
            if shutil.which("sbatch") is None:
                pytest.skip(f"Slurm could not be installed: {proc.stderr.strip()[-300:]}")
            pytest.fail(f"tests/infra/slurm.sh start failed:\n{proc.stderr[-2000:]}")
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(state / "slurm.conf")
    try:
        yield SlurmCluster(conf=state / "slurm.conf", nodes=("n1", "n2"), startup_s=started)
    finally:
        if not running:
            subprocess.run([script, "stop"], capture_output=True, timeout=120)
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests run only where CUDA is available; elsewhere they are skipped, saying why."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (none visible)")
    for item in gpu_items:
        item.add_marker(skip)
