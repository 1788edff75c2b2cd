"""The run record: what a run says about itself (MLflow tags and params, result.json).

Pure functions of the spec, the run's identity and the numbers the loop collected, so the
loop only hands them over and the format lives in one place; and `write_result`, the one
writer of RUN/result.json in the trainer (the finished run, a failure before the first step,
a full disk, a replayed MLflow run id all go through it).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from basics.environment import env_fingerprint
from basics.files import atomic_write_json

if TYPE_CHECKING:
    from validation.spec import ExperimentSpec

RESULT_FILE = "result.json"
"""The run's result, written last (launchers and reports read it)."""


def write_result(run_dir: Path, result: dict[str, Any]) -> None:
    """RUN/result.json, atomically (a reader sees the old file or the new one); raises OSError."""
    atomic_write_json(Path(run_dir) / RESULT_FILE, result)


def read_identity(run_dir: Path) -> dict[str, Any]:
    """`RUN/identity.json` written by orchestration (empty when run by hand)."""
    path = run_dir / "identity.json"
    if path.is_file():
        with contextlib.suppress(ValueError, OSError):
            data = json.loads(path.read_text())
            return data if isinstance(data, dict) else {}
    return {}


def tags(spec: ExperimentSpec, identity: dict[str, Any], data_version: str, world: int) -> dict[str, str]:
    out = {f"pipeline.{k}": str(v) for k, v in identity.items() if v is not None}
    out.setdefault("pipeline.spec_hash", spec.spec_hash())
    out.setdefault("pipeline.data_version", data_version)
    out.setdefault("pipeline.experiment", spec.name)
    out["pipeline.hypothesis"] = spec.hypothesis.statement[:4000]
    out["pipeline.hypothesis_metric"] = spec.hypothesis.metric
    out["pipeline.baseline"] = spec.hypothesis.baseline
    out.update({f"env.{k}": str(v) for k, v in env_fingerprint(world).items()})
    return out


def params(spec: ExperimentSpec, world: int, n_params: int, total_steps: int) -> dict[str, Any]:
    out: dict[str, Any] = {f"model.{k}": v for k, v in spec.model.model_dump().items()}
    out |= {f"train.{k}": v for k, v in spec.train.model_dump().items()}
    out |= {"data.seq_len": spec.data.seq_len, "data.weights": json.dumps(spec.data.weights()),
            "world_size": world, "n_params": n_params, "n_active_params": spec.model.active_parameter_count(),
            "total_steps": total_steps}
    return out


@dataclass
class Outcome:
    """How the loop ended, with what it measured along the way."""

    status: str  # finished | stopped | diverged | failed | preempted
    stop_reason: str
    error: str | None = None
    diverged_at_step: int | None = None
    """For "diverged": the step the monitor declared divergence at (result.json contract)."""
    final_metrics: dict[str, float] = field(default_factory=dict)
    stalls: list[float] = field(default_factory=list)
    write_s: list[float] = field(default_factory=list)
    resumed_from: str | None = None
    param_checksums: list[str | None] = field(default_factory=list)


def _median(values: list[float]) -> float | None:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else None


def result(spec: ExperimentSpec, state: Any, outcome: Outcome, *, run_dir: Path, run_id: str | None,
           world: int, total_steps: int, n_params: int, flops_per_token: float, alerts: int,
           wall_s: float) -> dict[str, Any]:
    """The body of result.json (`state` is the loop's TrainState)."""
    return {
        "status": outcome.status,
        "stop_reason": outcome.stop_reason,
        "diverged_at_step": outcome.diverged_at_step,
        "error": outcome.error,
        "reason": outcome.error or outcome.stop_reason,
        "mlflow_run_id": run_id,
        "experiment": spec.name,
        "steps": state.step,
        "total_steps": total_steps,
        "tokens": state.tokens,
        "final_metrics": outcome.final_metrics,
        "best_eval_loss": state.best_metric,
        "best_step": state.best_step,
        "env": env_fingerprint(world),
        "alerts": alerts,
        "wall_s": round(wall_s, 3),
        "spec_hash": state.spec_hash,
        "data_version": state.data_version,
        "world_size": world,
        "micro_batch_size": state.micro_batch_size,
        "grad_accum_steps": state.grad_accum_steps,
        "oom_fallbacks": state.oom_fallbacks,
        "rollbacks": state.rollbacks,
        "resumed_from": outcome.resumed_from,
        "n_params": n_params,
        "n_active_params": spec.model.active_parameter_count(),
        "flops_per_token": flops_per_token,
        "param_checksums": outcome.param_checksums,
        "checkpoint": {
            "mode": "async" if spec.train.async_checkpoint else "sync",
            "saves": len(outcome.stalls),
            "stall_s_median": _median(outcome.stalls),
            "write_s_median": _median(outcome.write_s),
        },
        "model_dir": str(run_dir / "model") if outcome.status != "failed" else None,
    }
