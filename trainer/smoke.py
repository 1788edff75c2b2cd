"""Smoke mode: the same code path as a real run, with the model shrunk and a few dozen steps.

`run_smoke` proves, in under a minute on a laptop CPU, that an experiment's spec and data
go through the trainer: the loss is finite and falls when overfitting one batch, a
checkpoint saves, validates and resumes to bitwise the same losses, and throughput is
recorded. It is the last gate of the PR check before a maintainer says `/train`.

Re-measuring: the built model's parameters and its FLOPs per token counted by torch, against
what the plan used (the architecture's declared formula). FLOPs are counted on fake tensors,
or on real ones when the forward has data-dependent shapes (a dropless mixture of experts);
`flops_counted_on` in the result says which. An exception raised in a plug-in's code (its
file under models/) ends the smoke as `failed` with one line naming the file, line and method
(`error`), its traceback in RUN/error.txt: smoke.json is still written, nothing is re-raised.
"""

from __future__ import annotations

import shutil
import time
import traceback
from pathlib import Path
from typing import Any

from basics.errors import TrainingError
from validation.resolved import ResolvedExperiment, rebuild, resolve_spec
from validation.spec import ExperimentSpec

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
ERROR_FILE = "error.txt"
"""The traceback of the exception that ended a smoke (in its run directory)."""

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
    token counted by torch (trainer.measure), must equal what the plan used."""
    return remeasure_with_notes(resolved, built_params)[0]


def remeasure_with_notes(resolved: ResolvedExperiment, built_params: int) -> tuple[dict[str, bool], dict[str, Any]]:
    """`remeasure`'s checks, and what was counted: `flops_counted` per token, `flops_declared`,
    `flops_counted_on` (fake tensors, or real ones and why), or `flops_error`."""
    from trainer.measure import MeasureError, measure_training_flops

    spec = resolved.spec
    declared = resolved.compute.flops_per_token
    notes: dict[str, Any] = {"flops_declared": declared}
    try:
        count = measure_training_flops(spec.model, spec.data.seq_len)
        counted = count.per_token
        notes |= {"flops_counted": counted, "flops_counted_on": count.describe()}
    except MeasureError as exc:
        counted = float("nan")
        notes["flops_error"] = str(exc)
    checks = {
        "parameters_match": built_params == resolved.compute.parameters,
        "flops_match": abs(counted - declared) <= 1e-9 * max(1.0, declared),
    }
    return checks, notes


def plugin_failure(exc: BaseException, model_type: str) -> str | None:
    """One line for an exception raised in plug-in code: `models/x.py:LINE in Class.method:
    Type: message`, from the innermost frame in a file under models/ (a method the plug-in does
    not define is named as `models/<model_type>.py: method`). None when no plug-in code ran in it."""
    frames = [(tb.tb_frame, tb.tb_lineno) for tb in _walk(exc.__traceback__)]
    inside = [(f, line) for f, line in frames if Path(f.f_code.co_filename).resolve().is_relative_to(MODELS_DIR)]
    if not inside:
        return None
    frame, line = inside[-1]
    owner = frame.f_locals.get("self")
    method = frame.f_code.co_name if owner is None else f"{type(owner).__name__}.{frame.f_code.co_name}"
    what = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}".rstrip(": ")
    path = Path(frame.f_code.co_filename).resolve()
    if path == MODELS_DIR / "__init__.py":  # the contract's default: the plug-in lacks the method
        return f"models/{model_type}.py: {frame.f_code.co_name}: {what}"
    return f"{path.relative_to(MODELS_DIR.parent)}:{line} in {method}: {what}"


def _walk(tb: Any) -> Any:
    while tb is not None:
        yield tb
        tb = tb.tb_next


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
    vocab = prepared.vocab_size
    try:
        small_resolved = resolve_smoke(resolved, vocab)
        return _train_and_check(small_resolved, prepared, run_dir, tracking_uri, console_level, t0)
    except Exception as exc:
        # A plug-in's exception (or the trainer refusing it) is the smoke's verdict, not a crash.
        error = plugin_failure(exc, resolved.spec.model.model_type)
        if error is None and not isinstance(exc, TrainingError):
            raise
        error = error or str(exc)
        (run_dir / ERROR_FILE).write_text("".join(traceback.format_exception(exc)))
        return {
            "status": "failed", "checks": {"finished": False}, "error": error,
            "traceback": str(run_dir / ERROR_FILE), "steps": 0, "losses": [], "tokens_per_s": None, "mfu": None,
            "eval": {}, "checkpoint": None, "n_params": None, "model": resolved.spec.model.model_dump(),
            "mlflow_run_id": None, "wall_s": round(time.perf_counter() - t0, 2), "run_dir": str(run_dir),
        }


def _train_and_check(small_resolved: ResolvedExperiment, prepared: Any, run_dir: Path, tracking_uri: str | None,
                     console_level: str, t0: float) -> dict[str, Any]:
    from trainer.loop import Trainer

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
    measured, notes = remeasure_with_notes(small_resolved, first.n_params)
    checks |= measured

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
        "reason": None if passed else why_failed(
            checks, result, run_dir / "train" / "alerts.jsonl", losses=losses, resumed=resumed_losses,
            parameters=(first.n_params, small_resolved.compute.parameters), notes=notes),
        "steps": result["steps"],
        "losses": [losses[k] for k in sorted(losses)],
        "tokens_per_s": result["final_metrics"].get("perf/tokens_per_s"),
        "mfu": result["final_metrics"].get("perf/mfu"),
        "eval": {k: v for k, v in result["final_metrics"].items() if k.startswith("eval/")},
        "checkpoint": result["checkpoint"],
        "n_params": result["n_params"],
        "model": small.model.model_dump(),
        **notes,
        "mlflow_run_id": result.get("mlflow_run_id"),
        "wall_s": round(time.perf_counter() - t0, 2),
        "run_dir": str(run_dir),
    }


def why_failed(checks: dict[str, Any], trainer_result: dict[str, Any], alerts_file: Path, *,
               losses: dict[int, float], resumed: dict[int, float], parameters: tuple[int, int],
               notes: dict[str, Any]) -> str:
    """The first reason a smoke failed, as a sentence a researcher can act on (a divergence
    with its step and loss, the step where a resume went another way), not a list of checks.
    `parameters` is (built, planned)."""
    status = trainer_result.get("status")
    if status == "diverged":
        step = trainer_result.get("diverged_at_step")
        alert = next((a for a in _alerts(alerts_file) if a.get("level") == "P0"), None)
        return f"diverged at step {step}: {alert['message']}" if alert else f"diverged at step {step}"
    if status != "finished":
        return f"training ended '{status}': {trainer_result.get('reason') or 'see its logs'}"
    values = [losses[k] for k in sorted(losses)]
    if not checks.get("loss_finite", True):
        return "the loss is not finite"
    if not checks.get("loss_decreasing", True):
        head, tail = values[:5], values[-5:]
        return (f"the loss did not fall while overfitting one batch: {sum(head) / max(1, len(head)):.4g} over the "
                f"first 5 steps, {sum(tail) / max(1, len(tail)):.4g} over the last 5 (must end below 80 %)")
    if not checks.get("checkpoint_validated", True):
        return "no checkpoint validated (see the smoke run's logs)"
    if not checks.get("parameters_match", True):
        return (f"the built model has {parameters[0]:,} parameters, parameter_count() declares {parameters[1]:,}")
    if not checks.get("flops_match", True):
        return notes.get("flops_error") or (f"torch counts {notes.get('flops_counted', float('nan')):,.0f} FLOPs per "
                                            f"token, flops_per_token() declares {notes.get('flops_declared'):,.0f}")
    if not checks.get("resume_equal", True):
        if not resumed:
            return f"resuming from the step {SMOKE_CHECKPOINT_AT} checkpoint trained no step (see the smoke run's logs)"
        step = next((k for k in sorted(losses) if k > SMOKE_CHECKPOINT_AT and resumed.get(k) != losses[k]), None)
        if step is not None:
            return (f"resumed from the step {SMOKE_CHECKPOINT_AT} checkpoint, step {step} has loss {resumed.get(step)!r} "
                    f"instead of {losses[step]!r}: state outside the checkpoint (an optimizer's state outside its "
                    "state_dict(), a buffer, a random generator) changed training after the resume")
    return "see smoke.json"


def _alerts(path: Path) -> list[dict[str, Any]]:
    import json

    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def failure_line(name: str, result: dict[str, Any]) -> str:
    """The last line a failed smoke prints: why first (a plug-in's error, the sharded run's, the
    first failed check's reason), then the checks that failed."""
    failed = ", ".join(k for k, ok in result.get("checks", {}).items() if not ok)
    why = result.get("error") or (result.get("sharded") or {}).get("error") or result.get("reason")
    if why and failed:
        return f"smoke run of {name} failed: {why} (failed checks: {failed})"
    return f"smoke run of {name} failed: {why or failed or 'see ' + str(result.get('run_dir'))}"
