"""Builders for launcher tests: a tiny valid spec, its data, and a `LaunchJob` running the probe.

`PROGRAM` is the real trainer (`-m trainer`) once it exists, else `tests/infra/probe_train.py`,
which follows the same command line and run-directory contract.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelines.launchers import LaunchJob, job_from_spec
from validation.spec import ExperimentSpec

INFRA = Path(__file__).resolve().parent
PROBE = (str(INFRA / "probe_train.py"),)


def tiny_spec_dict(data_root: Path, *, nodes: int = 1, procs: int = 1, launcher: str = "local",
                   rendezvous: str | None = None, max_steps: int = 6, max_restarts: int = 2,
                   train: dict[str, Any] | None = None, alerts: dict[str, Any] | None = None) -> dict[str, Any]:
    """A tiny, valid experiment whose sources are files under `data_root`."""
    sources = []
    for name, weight in (("code", 0.5), ("docs", 0.5)):
        path = data_root / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"text": f"{name} document number {i} " * 8}) + "\n" for i in range(60)))
        sources.append({"name": name, "path": str(path), "weight": weight})
    resource: dict[str, Any] = {"nodes": nodes, "cpu_processes": procs, "launcher": launcher}
    if rendezvous:
        resource["rendezvous"] = rendezvous
    return {
        "name": "launch-probe", "owner": "octocat",
        "hypothesis": {"statement": "Two processes on two nodes train the same model as one process does.",
                       "metric": "eval/loss", "direction": "decrease", "min_effect": 0.01, "baseline": "demo-baseline"},
        "model": {"model_type": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 4, "vocab_size": 320,
                  "max_position_embeddings": 64},
        "data": {"sources": sources, "seq_len": 32, "tokenizer": {"vocab_size": 256}},
        "train": {"max_steps": max_steps, "warmup_steps": 1, "micro_batch_size": 2, "eval_interval": 3,
                  "checkpoint_interval": 2, "log_interval": 1, "eval_batches": 1, "max_restarts": max_restarts}
        | (train or {}),
        "resource": resource,
    } | ({"alerts": alerts} if alerts else {})


def make_job(tmp: Path, program: tuple[str, ...] = PROBE, **spec_kwargs: Any) -> tuple[LaunchJob, ExperimentSpec]:
    """Spec file, data, a prepared-cache stand-in (manifest.json) and the `LaunchJob` for them."""
    data_root = tmp / "data"
    data_root.mkdir(parents=True, exist_ok=True)
    spec = ExperimentSpec.model_validate(tiny_spec_dict(data_root, **spec_kwargs))
    run_dir = tmp / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_path = run_dir / "spec.resolved.json"
    spec_path.write_text(json.dumps(spec.resolved_dict(), indent=2))
    cache = tmp / "cache"
    cache.mkdir(exist_ok=True)
    (cache / "manifest.json").write_text(json.dumps({"version": "probe"}))
    job = job_from_spec(spec, spec_path=spec_path, run_dir=run_dir, data_dir=cache, program=program,
                        grace_seconds=30.0, time_limit_minutes=10)
    return job, spec


def probe_ranks(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((run_dir / "probe").glob("rank*.json"))]


def probe_events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "probe" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def trainer_available() -> bool:
    """The real trainer and its data preparation are importable (H-trainer/H-data landed)."""
    try:
        import trainer.entry  # noqa: F401
        from pipelines.dataprep.prepare import prepare_data  # noqa: F401
    except ImportError:
        return False
    return (Path(__file__).resolve().parents[2] / "trainer" / "__main__.py").is_file()


def make_trainer_job(tmp: Path, **spec_kwargs: Any) -> tuple[LaunchJob, ExperimentSpec]:
    """Like `make_job` but for the real trainer: the data is really prepared (tiny)."""
    import os

    from pipelines.dataprep.prepare import prepare_data

    job, spec = make_job(tmp, program=("-m", "trainer"), **spec_kwargs)
    os.environ["PIPELINE_DATA_ROOTS"] = str(tmp / "data")
    prepared = prepare_data(spec.data, Path(__file__).resolve().parents[2], cache_root=tmp / "cache-real",
                            progress=False)
    from dataclasses import replace

    return replace(job, data_dir=prepared.path, tracking_uri="none"), spec


USE_TRAINER = trainer_available()
# Long enough to be cancelled mid-run, bounded if a cancel ever fails to land.
LONG_TRAIN = {"max_steps": 3000, "eval_interval": 3000, "checkpoint_interval": 3000}


def training_job(tmp: Path, *, long: bool = False, crash: bool = False, **spec_kwargs: Any) -> LaunchJob:
    """A job running the real trainer when it is available, else the probe, in one of three shapes:

    plain (6 steps, finishes), `long` (to be cancelled), `crash` (rank 0 dies once mid-run,
    right after a checkpoint; the relaunch must resume from it and finish).
    """
    from dataclasses import replace

    env: dict[str, str] = {}
    if USE_TRAINER:
        job, _ = make_trainer_job(tmp, train=LONG_TRAIN if long else None, **spec_kwargs)
        if crash:
            env["TRAINER_FAULT_SIGKILL_AT_STEP"] = "4"  # checkpoints at 2 and 4: killed after saving step 4
    else:
        job, _ = make_job(tmp, **spec_kwargs)
        env["PROBE_STEPS"] = "600" if long else "4"
        if crash:
            env["PROBE_CRASH_AT_STEP"] = "3"
    return replace(job, env=env)


def checkpoints(run_dir: Path) -> list[str]:
    """Names of the checkpoints that are complete (their MANIFEST.json exists)."""
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step_*") if (p / "MANIFEST.json").is_file())


def result(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "result.json").read_text())


def wait_until(predicate: Any, what: str, limit_s: float = 240.0) -> None:
    """Poll `predicate` (a guard against hanging, not a timing assertion)."""
    import time

    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.3)


def training_started(run_dir: Path) -> bool:
    """A few optimizer steps are done (trainer: a `step N/` log line; probe: a step line)."""
    text = "".join(p.read_text(errors="replace") for p in (run_dir / "logs").glob("*.log*"))
    text += "".join(p.read_text(errors="replace") for p in (run_dir / "logs").glob("slurm-*.out"))
    return ("step 3/" in text) or ("step=3 " in text)
