"""What every bench script sets up around its measurement, written once.

A script runs as `python bench/<script>.py` (run_all.py, tests/integration/test_bench_scripts.py and the
docs start it so), which puts bench/ on `sys.path` (tests/unit/test_preflight_memory.py puts it there
to import bench_parallel_memory): scripts import this module as `scaffold`, and importing it
puts the repository on `sys.path` as well.

- the run: `REPO`, `child_env` (what a benchmark's child process gets), `free_port`, `torchrun`,
  `slurm_test_cluster` (tests/infra/slurm.sh, started and stopped around a bench when needed);
- the machine a figure was measured on: `cpu_model`, `machine` (the torch stack), `utc_stamp`;
- its inputs: `experiment` (a bench's spec data), `copy_specs` (a scratch copy of what the
  loader reads), `demo_sources`/`prepare_demo` (the demo corpus, prepared through the cache),
  `packed_rows` (the batches every system trains on) and their torch forms;
- its record: `append_results_md` (bench/RESULTS.md), `write_results_json` (bench/results/).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from basics.environment import OFFLINE_ENV, scoped_environ  # noqa: E402 - needs REPO on sys.path

RESULTS_MD = REPO / "bench" / "RESULTS.md"
RESULTS_DIR = REPO / "bench" / "results"
SLURM_SH = REPO / "tests" / "infra" / "slurm.sh"
COLUMNS = ("input_ids", "labels", "position_ids")
"""The columns of a packed row that a model's forward takes."""


# ----------------------------------------------------------------------------- the run


def child_env(**values: str) -> dict[str, str]:
    """This process's environment for a child: the offline defaults forced (nothing phones home or
    downloads while it is timed), the repository on PYTHONPATH, then `values`."""
    return {**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(REPO), **values}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun(script: str | Path, *args: str, nproc: int = 2) -> list[str]:
    """The command that runs `script` on `nproc` local ranks (this interpreter's torchrun)."""
    return [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(Path(script).resolve()), *args]


@contextmanager
def slurm_test_cluster() -> Iterator[None]:
    """The two-node test cluster (tests/infra/slurm.sh) with `SLURM_CONF` pointing at it; started
    for the block and stopped after it only when it was not running before."""
    state = Path(os.environ.get("SLURM_TEST_STATE", "/tmp/pipeline-slurm"))
    running = subprocess.run([str(SLURM_SH), "status"], capture_output=True).returncode == 0
    if not running:
        subprocess.run([str(SLURM_SH), "start"], check=True, capture_output=True, timeout=900)
    try:
        with scoped_environ(SLURM_CONF=str(state / "slurm.conf")):
            yield
    finally:
        if not running:
            subprocess.run([str(SLURM_SH), "stop"], capture_output=True, timeout=120)


# ----------------------------------------------------------------------------- the machine


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def utc_stamp() -> str:
    """Now, as every RESULTS.md heading dates its entry: 2026-01-31 12:34 UTC."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def machine() -> dict[str, str]:
    """The machine and the torch stack a training figure was measured with."""
    import accelerate
    import torch
    import transformers

    flags = Path("/proc/cpuinfo").read_text()
    return {"nproc": str(os.cpu_count()), "cpu": cpu_model(), "avx512_bf16": str("avx512_bf16" in flags),
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "accelerate": accelerate.__version__, "date": utc_stamp()}


# ----------------------------------------------------------------------------- inputs


def experiment(name: str, statement: str, metric: str, direction: str = "increase", **sections: Any) -> dict[str, Any]:
    """A bench's experiment spec as data: its name and hypothesis (against the champion, min_effect
    0.01), then `sections` (model, data, train, ...)."""
    return {"name": name, "owner": "ml-platform",
            "hypothesis": {"statement": statement, "metric": metric, "direction": direction, "min_effect": 0.01,
                           "baseline": "champion"},
            **sections}


def copy_specs(root: Path) -> Path:
    """experiments/*.yaml into `root`/experiments, with data/tasks/ (the task files specs name under
    `eval.tasks`, which the loader checks): a scratch repository the loader reads as this one."""
    experiments = root / "experiments"
    experiments.mkdir(parents=True)
    for path in sorted((REPO / "experiments").glob("*.yaml")):
        shutil.copy(path, experiments / path.name)
    shutil.copytree(REPO / "data" / "tasks", root / "data" / "tasks")
    return experiments


def demo_sources() -> list[dict[str, Any]]:
    """The demo corpus's sources in data/demo, weighted code 0.4, docs 0.4, reference 0.2."""
    return [{"name": n, "path": f"data/demo/{n}.jsonl", "weight": w}
            for n, w in (("code", 0.4), ("docs", 0.4), ("reference", 0.2))]


def prepare_demo(data: Any) -> Any:
    """`data` (a DataSpec over `demo_sources`) prepared through the repository's cache; the demo
    corpus is built into data/demo first where it is missing."""
    from pipelines.dataprep.demo_corpus import build_demo_corpus
    from pipelines.dataprep.prepare import prepare_data

    if not (REPO / "data" / "demo" / "docs.jsonl").is_file():
        build_demo_corpus(REPO / "data" / "demo")
    return prepare_data(data, REPO, progress=False)


def packed_rows(prepared: Any, data: Any, micro: int, steps: int) -> list[dict[str, Any]]:
    """The first `steps` batches (numpy) of one rank's `MixtureBatcher` over `prepared`, seed 1234."""
    from trainer.batches import MixtureBatcher

    batcher = MixtureBatcher(prepared, data.weights(), data.seq_len, micro, 1, 1234, 0, 1)
    return [batcher.batch(s, 0) for s in range(steps)]


def as_tensors(batches: list[dict[str, Any]], device: Any = None) -> list[dict[str, Any]]:
    """Each batch's `COLUMNS` as torch tensors (on `device`): what a bare loop feeds the model."""
    import torch

    return [{k: torch.from_numpy(b[k]) if device is None else torch.from_numpy(b[k]).to(device) for k in COLUMNS}
            for b in batches]


def examples(batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row of every batch as its own example (torch tensors): an HF `Trainer` dataset."""
    import torch

    return [{k: torch.from_numpy(b[k][i]) for k in COLUMNS} for b in batches for i in range(len(b[COLUMNS[0]]))]


def stack_examples(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The collator that puts `examples` back into batches, unpadded."""
    import torch

    return {k: torch.stack([it[k] for it in items]) for k in items[0]}


# ----------------------------------------------------------------------------- the record


def append_results_md(text: str) -> Path:
    """Append `text` as it is to bench/RESULTS.md (a new or empty file gets the title first)."""
    with RESULTS_MD.open("a", encoding="utf-8") as handle:
        if handle.tell() == 0:
            handle.write("# Benchmark results\n")
        handle.write(text)
    return RESULTS_MD


def write_results_json(name: str, figures: Any, indent: int = 1) -> Path:
    """bench/results/`name`.json: the figures a test or a later run reads back."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(figures, indent=indent, default=str) + "\n")
    return path
