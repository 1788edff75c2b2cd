"""Fault injection for tests, as a null object: the loop always asks, the plain plan never fires.

Environment variables (1-based optimizer step numbers; each fault fires once per process):
  TRAINER_INJECT_OOM_AT_STEP=k   [TRAINER_INJECT_OOM_RANK=r]  raise an out-of-memory error
  TRAINER_INJECT_NAN_AT_STEP=k   make the loss NaN
  TRAINER_FAULT_SIGKILL_AT_STEP=k  SIGKILL this process after step k (rank TRAINER_FAULT_RANK, default 0)
  TRAINER_FAULT_SIGTERM_AT_STEP=k  send SIGTERM to this process after step k
  TRAINER_FAULT_STEP_SECONDS=s   sleep s after every step: a slow machine's steps, so that a
                                 cancel sent at an early eval lands mid-run however fast this one is

Keeping this out of the loop means the loop has no `if os.environ...` branches: a real
run gets `FaultPlan()` (every method a no-op), a test gets `InjectedFaults`.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

ENV_OOM = "TRAINER_INJECT_OOM_AT_STEP"
ENV_OOM_RANK = "TRAINER_INJECT_OOM_RANK"
ENV_NAN = "TRAINER_INJECT_NAN_AT_STEP"
ENV_SIGKILL = "TRAINER_FAULT_SIGKILL_AT_STEP"
ENV_SIGKILL_RANK = "TRAINER_FAULT_RANK"
ENV_SIGTERM = "TRAINER_FAULT_SIGTERM_AT_STEP"
ENV_STEP_SECONDS = "TRAINER_FAULT_STEP_SECONDS"


class FaultPlan:
    """No faults (the null object). `step` is the 1-based optimizer step being run or just done."""

    def oom_now(self, step: int) -> bool:
        return False

    def nan_now(self, step: int) -> bool:
        return False

    def after_step(self, step: int, before_kill: Callable[[], None]) -> None:
        """Called once a step is complete; `before_kill` flushes what a test needs to find."""

    @staticmethod
    def from_env(rank: int, environ: Mapping[str, str] | None = None) -> FaultPlan:
        env = os.environ if environ is None else environ

        def num(name: str) -> int | None:
            value = env.get(name)
            return int(value) if value else None

        plan = InjectedFaults(
            rank=rank, oom_at=num(ENV_OOM), oom_rank=num(ENV_OOM_RANK) or 0, nan_at=num(ENV_NAN),
            sigkill_at=num(ENV_SIGKILL), sigkill_rank=num(ENV_SIGKILL_RANK) or 0, sigterm_at=num(ENV_SIGTERM),
            step_seconds=float(env.get(ENV_STEP_SECONDS) or 0.0))
        if (plan.oom_at, plan.nan_at, plan.sigkill_at, plan.sigterm_at, plan.step_seconds) == (None, None, None, None, 0.0):
            return FaultPlan()
        return plan


@dataclass
class InjectedFaults(FaultPlan):
    """Faults requested by the environment (tests only)."""

    rank: int
    oom_at: int | None = None
    oom_rank: int = 0
    nan_at: int | None = None
    sigkill_at: int | None = None
    sigkill_rank: int = 0
    sigterm_at: int | None = None
    step_seconds: float = 0.0
    fired: set[str] = field(default_factory=set)

    def _once(self, kind: str, at: int | None, step: int) -> bool:
        if at is not None and step == at and kind not in self.fired:
            self.fired.add(kind)
            return True
        return False

    def oom_now(self, step: int) -> bool:
        return self.rank == self.oom_rank and self._once("oom", self.oom_at, step)

    def nan_now(self, step: int) -> bool:
        return self._once("nan", self.nan_at, step)

    def after_step(self, step: int, before_kill: Callable[[], None]) -> None:
        if self.step_seconds > 0:
            time.sleep(self.step_seconds)
        if self.sigkill_at == step and self.rank == self.sigkill_rank:
            before_kill()
            os.kill(os.getpid(), signal.SIGKILL)
        if self._once("sigterm", self.sigterm_at, step):
            os.kill(os.getpid(), signal.SIGTERM)
