"""The loop's small mutable state: what a checkpoint carries besides tensors, and one step's outcome."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TrainState:
    """What a checkpoint must carry besides tensors (train_state.json)."""

    step: int = 0
    tokens: int = 0
    data_offset: int = 0  # batch index = step + data_offset (rollbacks skip batches)
    micro_batch_size: int = 0
    grad_accum_steps: int = 0
    world_size: int = 1
    mlflow_run_id: str | None = None
    spec_hash: str = ""
    data_version: str = ""
    best_metric: float | None = None
    best_step: int | None = None
    eval_metric: float | None = None
    evals_without_improvement: int = 0
    rollbacks: int = 0
    oom_fallbacks: int = 0
    detector: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, saved: dict[str, Any]) -> TrainState:
        """Unknown keys (written by a newer trainer, or `saved_unix`) are ignored."""
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in saved.items() if k in known})


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    oom: bool = False
    sigterm: bool = False
    rows: dict[str, int] = field(default_factory=dict)
    device: tuple[Any, Any] | None = None
    """(loss, grad_norm) as unread 0-dim device tensors when the step defers its host reads
    (`StepRunner.defer`); `loss`/`grad_norm` are NaN until the loop reads the window."""
