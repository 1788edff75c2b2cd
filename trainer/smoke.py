"""Smoke mode: the same code path as a real run, with the model shrunk and a few dozen steps.

`run_smoke` proves, in under a minute on a laptop CPU, that an experiment's spec and data
go through the trainer: the loss is finite and falls when overfitting one batch, a
checkpoint saves, validates and resumes to bitwise the same losses, and throughput is
recorded. It is the last gate of the PR check before a maintainer says `/train`.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from validation.resolved import ResolvedExperiment, rebuild, resolve_spec
from validation.spec import ExperimentSpec

SMOKE_STEPS = 30
SMOKE_CHECKPOINT_AT = 15


def smoke_spec(spec: ExperimentSpec, tokenizer_vocab: int, steps: int = SMOKE_STEPS) -> ExperimentSpec:
    """`spec` with a tiny model of the same architecture, short rows, one CPU process, `steps`
    steps, and the experiment's own optimizer, lr and schedule (warmup shrunk in proportion).

    Built through validation (`validation.resolved.rebuild`), so the smoke spec is one a file could hold."""
    vocab = max(256, -(-tokenizer_vocab // 64) * 64)
    seq_len = min(spec.data.seq_len, 64)
    # The architecture shrinks itself (models/<model_type>.py, `smoke_overrides`): same kind, tiny.
    model = spec.model.smoke_overrides(vocab, seq_len)
    precision = spec.train.precision
    try:
        import torch

        if precision == "fp16" and not torch.cuda.is_available():
            precision = "fp32"
    except ImportError:  # pragma: no cover - torch is a dependency of the trainer
        pass
    train = {
        "max_steps": steps, "token_budget": None, "micro_batch_size": 4, "grad_accum_steps": 1,
        "global_batch_size": None, "warmup_steps": _shrunk_warmup(spec, steps),
        "log_interval": 5, "eval_interval": 10**6, "checkpoint_interval": SMOKE_CHECKPOINT_AT,
        "keep_last": 2, "async_checkpoint": False, "compile": False, "precision": precision,
        "min_micro_batch_size": 1, "early_stopping_patience": 0, "deterministic": True, "eval_batches": 2,
    }
    # One CPU process: the device peak is the CPU's (a GPU's `peak_tflops` would make MFU meaningless).
    resource = {"nodes": 1, "gpus_per_node": 0, "cpu_processes": 1, "peak_tflops": None,
                "launcher": "local", "partition": None, "rendezvous": None}
    changes: dict[str, Any] = {f"model.{k}": v for k, v in model.items()}
    changes |= {f"train.{k}": v for k, v in train.items()}
    changes |= {f"resource.{k}": v for k, v in resource.items()}
    changes |= {"data.seq_len": seq_len, "parallel": "auto", "sweep": None}
    return rebuild(spec, changes)


def _shrunk_warmup(spec: ExperimentSpec, steps: int) -> int:
    """The experiment's warmup as the same share of a `steps`-step run (at most a third of it):
    the smoke keeps the experiment's optimizer, lr and schedule, shrunk in steps only."""
    total = spec.total_steps(spec.parallel_layout().dp)
    return min(steps // 3, round(spec.train.warmup_steps * steps / max(1, total)))


def resolve_smoke(resolved: ResolvedExperiment, tokenizer_vocab: int) -> ResolvedExperiment:
    """The smoke spec of an experiment, resolved like any spec (layout, peak, FLOPs), one seed."""
    small = smoke_spec(resolved.spec, tokenizer_vocab)
    return resolve_spec(small, resolved.repo_root, seeds=[small.train.seed])


def run_smoke(resolved: ResolvedExperiment, prepared: Any, run_dir: Path, tracking_uri: str | None = None,
              console_level: str = "INFO") -> dict[str, Any]:
    """Train the shrunk model, then resume from its mid-run checkpoint; return the checks.

    The smoke owns `run_dir` while it runs: it takes the run directory's lock that a trainer
    job takes first (`trainer.runlock`; re-entrant within one process, released at the end),
    so a second smoke or a job on the same directory is refused (`RunDirBusy`) before
    anything of theirs is deleted or overwritten."""
    from trainer.runlock import holding_run_dir

    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    with holding_run_dir(run_dir):
        _clear_run_dir(run_dir)
        return _run_smoke_held(resolved, prepared, run_dir, tracking_uri, console_level, t0)


def remeasure(resolved: ResolvedExperiment, built_params: int) -> dict[str, bool]:
    """The real model against `spec.resolved.json`: its parameters as built, and its FLOPs per
    token counted by torch on fake tensors (trainer.measure), must equal what the plan used."""
    from trainer.measure import MeasureError, count_training_flops

    spec = resolved.spec
    try:
        counted = count_training_flops(spec.model, spec.data.seq_len)
    except MeasureError:
        counted = float("nan")
    declared = resolved.compute.flops_per_token
    return {
        "parameters_match": built_params == resolved.compute.parameters,
        "flops_match": abs(counted - declared) <= 1e-9 * max(1.0, declared),
    }


def _clear_run_dir(run_dir: Path) -> None:
    """Remove an earlier smoke's files; the lock folder stays: deleting the lock file this
    process holds would let the next smoke lock a new file beside a live holder."""
    from trainer.runlock import LOCK_DIR

    for child in run_dir.iterdir():
        if child.name == LOCK_DIR:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _run_smoke_held(resolved: ResolvedExperiment, prepared: Any, run_dir: Path, tracking_uri: str | None,
                    console_level: str, t0: float) -> dict[str, Any]:
    from trainer.loop import Trainer

    small_resolved = resolve_smoke(resolved, prepared.vocab_size)
    small, peak = small_resolved.spec, small_resolved.compute.peak.device()
    first = Trainer(small, run_dir / "train", prepared.path, tracking_uri=tracking_uri or "none",
                    overfit_one_batch=True, prepared=prepared, peak=peak, console_level=console_level)
    result, code = first.run()
    losses = dict(first.step_losses)
    values = list(losses.values())
    head, tail = values[:5], values[-5:]
    checks: dict[str, Any] = {
        "finished": result["status"] == "finished",
        "loss_finite": all(v == v and abs(v) != float("inf") for v in values),
        "loss_decreasing": bool(values) and sum(tail) / len(tail) < 0.8 * sum(head) / len(head),
        "checkpoint_validated": any(o.ok for o in first.checkpointer.outcomes),
    }
    checks |= remeasure(small_resolved, first.n_params)

    # Resume from the mid-run checkpoint in a fresh run directory: losses must repeat bitwise.
    resume_dir = run_dir / "resume"
    mid = run_dir / "train" / "checkpoints" / f"step_{SMOKE_CHECKPOINT_AT:06d}"
    resumed_losses: dict[int, float] = {}
    if mid.is_dir():
        (resume_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        shutil.copytree(mid, resume_dir / "checkpoints" / mid.name)
        second = Trainer(small, resume_dir, prepared.path, tracking_uri="none", overfit_one_batch=True,
                         prepared=prepared, peak=peak, console_level=console_level)
        second.run()
        resumed_losses = dict(second.step_losses)
    expected = {k: v for k, v in losses.items() if k > SMOKE_CHECKPOINT_AT}
    checks["resume_equal"] = bool(resumed_losses) and resumed_losses == expected
    passed = all(checks.values()) and code == 0
    return {
        "status": "passed" if passed else "failed",
        "checks": checks,
        "steps": result["steps"],
        "losses": [losses[k] for k in sorted(losses)],
        "tokens_per_s": result["final_metrics"].get("perf/tokens_per_s"),
        "mfu": result["final_metrics"].get("perf/mfu"),
        "eval": {k: v for k, v in result["final_metrics"].items() if k.startswith("eval/")},
        "checkpoint": result["checkpoint"],
        "n_params": result["n_params"],
        "model": small.model.model_dump(),
        "mlflow_run_id": result.get("mlflow_run_id"),
        "wall_s": round(time.perf_counter() - t0, 2),
        "run_dir": str(run_dir),
    }
