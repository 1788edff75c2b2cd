"""The trainer as the trainer tests run it: a tiny spec, a prepared demo corpus and the runs.

Tiny model (hidden 32, 2 layers, vocab 384, seq 32) and 12 steps by default. `run_trainer`
starts `python -m trainer` (under `accelerate launch` for several ranks); `train_here` runs
the same trainer in the calling process. Losses are read from `metrics.jsonl`, never from
log text. `data_dir` is a pytest fixture: import it into the test module that requests it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from basics.environment import scoped_environ

REPO = Path(__file__).resolve().parents[2]
STEPS = 12


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small prepared demo corpus (three sources, BPE vocab 384), built once for the module."""
    root = tmp_path_factory.mktemp("trainer-data")
    with scoped_environ(PIPELINE_DATA_ROOTS=str(root)):
        from pipelines.dataprep.prepare import prepare_data
        from tests.infra.corpus import demo_corpus
        from validation.spec import DataSpec

        demo_corpus(root / "demo", 150_000)
        data = DataSpec.model_validate(spec_dict()["data"])
        data = data.model_copy(update={"sources": [
            s.model_copy(update={"path": str(root / "demo" / f"{s.name}.jsonl")}) for s in data.sources]})
        prepared = prepare_data(data, REPO, root / "cache", progress=False)
    return prepared.path


def spec_dict(**train: Any) -> dict[str, Any]:
    spec = {
        "name": "trainer-test",
        "owner": "ml-platform",
        "hypothesis": {
            "statement": "A tiny llama trained for a dozen steps lowers its held-out loss on the demo mixture.",
            "metric": "eval/loss", "direction": "decrease", "min_effect": 0.01, "baseline": "champion",
        },
        "model": {"model_type": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                  "intermediate_size": 64, "vocab_size": 384, "max_position_embeddings": 64},
        "data": {
            "sources": [{"name": n, "path": f"data/demo/{n}.jsonl", "weight": w}
                        for n, w in (("code", 0.5), ("docs", 0.3), ("reference", 0.2))],
            "seq_len": 32, "tokenizer": {"vocab_size": 384},
        },
        "train": {"lr": 1e-2, "warmup_steps": 2, "max_steps": STEPS, "micro_batch_size": 4, "grad_accum_steps": 1,
                  "log_interval": 1, "eval_interval": 6, "eval_batches": 2, "checkpoint_interval": 4,
                  "keep_last": 3, "seed": 7} | train,
    }
    return spec


def _write_spec(run_dir: Path, ranks: int, alerts: dict[str, Any] | None, train: dict[str, Any],
                model: dict[str, Any] | None = None, parallel: dict[str, Any] | None = None, nodes: int = 1,
                sections: dict[str, Any] | None = None) -> Path:
    spec = spec_dict(**train) | (sections or {})
    spec["resource"] = {"cpu_processes": ranks // nodes} | ({"nodes": nodes} if nodes > 1 else {})
    if parallel:
        spec["parallel"] = parallel
    if model and "model_type" in model:  # another architecture: its own fields, nothing inherited
        spec["model"] = model
    else:
        spec["model"] |= model or {}
    if alerts:
        spec["alerts"] = alerts
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_path = run_dir / "spec.resolved.json"
    spec_path.write_text(json.dumps(spec))
    return spec_path


def run_trainer(tmp: Path, data_dir: Path, name: str, *, ranks: int = 1, uri: str = "none",
                env: dict[str, str] | None = None, run_dir: Path | None = None,
                alerts: dict[str, Any] | None = None, parallel: dict[str, Any] | None = None,
                model: dict[str, Any] | None = None, nodes: int = 1, sections: dict[str, Any] | None = None,
                **train: Any) -> tuple[int, Path]:
    """Run `python -m trainer` in a new process (under `accelerate launch` for several ranks;
    `nodes` only tells the spec how the ranks are grouped, they all start on this host;
    `sections` replaces whole top-level spec sections, e.g. `eval`)."""
    run_dir = run_dir or tmp / name
    spec_path = _write_spec(run_dir, ranks, alerts, train, model, parallel, nodes, sections)
    args = ["--spec", str(spec_path), "--run-dir", str(run_dir), "--data-dir", str(data_dir), "--tracking-uri", uri]
    if ranks == 1:
        cmd = [sys.executable, "-m", "trainer", *args]
    else:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(ranks),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(free_port()), "-m", "trainer", *args]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="true", PYTHONPATH=str(REPO),
                    MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1")
    full_env |= env or {}
    with open(run_dir / f"stdout-{len(list(run_dir.glob('stdout-*')))}.log", "w") as out:
        proc = subprocess.run(cmd, cwd=REPO, env=full_env, stdout=out, stderr=subprocess.STDOUT, timeout=300)
    return proc.returncode, run_dir


def train_here(tmp: Path, data_dir: Path, name: str, *, uri: str = "none", env: dict[str, str] | None = None,
               run_dir: Path | None = None, alerts: dict[str, Any] | None = None, model: dict[str, Any] | None = None,
               **train: Any) -> tuple[int, Path]:
    """The same trainer in this process (one rank): no 10 s of imports per run on a shared CPU.
    SIGTERM works here too: the trainer's handler runs in the main thread."""
    from trainer.entry import main

    run_dir = run_dir or tmp / name
    spec_path = _write_spec(run_dir, 1, alerts, train, model)
    with scoped_environ(**(env or {})):
        code = main(["--spec", str(spec_path), "--run-dir", str(run_dir), "--data-dir", str(data_dir),
                     "--tracking-uri", uri])
    return code, run_dir


def step_losses(run_dir: Path) -> dict[int, float]:
    """train/loss per step from the run's metrics.jsonl (log_interval 1: every step)."""
    return {int(p["step"]): float(p["value"]) for p in metrics_jsonl(run_dir) if p["key"] == "train/loss"}


def metrics_jsonl(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
