"""Test tiers and shared fixtures.

Tiers are directories (as torchtitan keeps `tests/unit_tests` apart from its integration runs);
each test gets its directory's marker, so `-m unit` and `tests/unit` select the same tests:

  tests/unit/         pure code, no process and no server: a unit test that starts a process
                      (subprocess, fork, exec, multiprocessing) or listens on a socket fails,
                      naming the call (`tests/infra/tiers.py`); `make test-fast`
  tests/integration/  real servers and processes started by the test (MLflow, Slurm, the GitHub
                      emulator, act, multi-process `accelerate launch`)
  tests/e2e/          whole flows (`pipeline run`, sweeps, continuation, the act lifecycle)
  tests/gpu/          needs CUDA; skipped without it

Session fixtures (built once, shared): `mlflow_server` (a real `mlflow server` on 127.0.0.1),
`slurm_cluster` (a real single-host Slurm cluster, nodes n1 and n2), and the expensive inputs
of `tests/infra/corpus.py` (the demo corpus, built once per process for each size).

Helpers that only some tests need live in `tests/infra/` (import them as `tests.infra.<module>`).
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

from basics.environment import apply_offline_env, scoped_environ
from tests.infra import scheduling, tiers

# Every process a test starts inherits these (MLflow phones home on import otherwise).
apply_offline_env()
# One torch thread per process: `make test` runs two workers on two cores, each training with
# one or more ranks; with torch's default (every core per process, which `accelerate launch`
# also picks for one CPU process) they oversubscribe the cores and each step gets several times
# slower. Tests compare runs of the same setting, and the golden tests pin their own count.
os.environ.setdefault("OMP_NUM_THREADS", "1")

INFRA = Path(__file__).resolve().parent / "infra"


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A running MLflow server for the session: `.uri` (tracking URI), `.backend_uri`, `.artifacts`.

    Tests share it, so each test should use its own experiment name.
    """
    from tests.infra.mlflow_server import MlflowServer

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
    with scoped_environ(SLURM_CONF=str(state / "slurm.conf")):
        try:
            yield SlurmCluster(conf=state / "slurm.conf", nodes=("n1", "n2"), startup_s=started)
        finally:
            if not running:
                subprocess.run([script, "stop"], capture_output=True, timeout=120)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`make test` (`-n 2 --dist loadgroup`): a module's tests stay together and in order on one
    worker (module fixtures are built once), every module that uses the Slurm cluster on the same
    worker, heaviest modules first (`tests/infra/scheduling.py`)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return scheduling.make_scheduler(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets its tier's marker; `gpu` tests run only where CUDA is available. On xdist
    workers the collection is ordered heaviest module first (`scheduling.order_items`)."""
    tiers.mark_by_directory(items)
    if hasattr(config, "workerinput") and config.getvalue("dist") == "loadgroup":
        scheduling.order_items(items)
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (none visible)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with tiers.guard(item, "setup"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with tiers.guard(item, "call"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    # The last item's teardown also finalizes session fixtures (servers started by other tiers).
    with tiers.guard(item, "teardown", active=nextitem is not None):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    tiers.fail_report_on_escape(item, outcome.get_result())
