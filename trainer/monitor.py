"""Anomaly detection (pure) and the alert log.

`AnomalyDetector.observe(step, loss, grad_norm, tokens_per_s)` returns the alerts a step
raises and the action the spec's policy asks for. It sees the same all-reduced numbers on
every rank, so every rank takes the same decision without another collective.

Levels: P0 page (the run cannot go on as is), P1 message (a human should look),
P2 log (worth knowing).
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("trainer.monitor")

LEVEL_VALUE = {"P0": 0, "P1": 1, "P2": 2}


@dataclass(frozen=True)
class Alert:
    level: str
    kind: str
    message: str
    step: int
    action: str = "none"  # none | stop | rollback


@dataclass
class Verdict:
    alerts: list[Alert] = field(default_factory=list)
    action: str = "none"  # none | stop | rollback


class AnomalyDetector:
    """Thresholds from the spec's `alerts` section; state is a few running statistics.

    - non-finite loss or grad norm: P0, rollback when the policy is rollback, else stop;
    - grad norm above `grad_norm_factor` x its running mean, or a loss spike (above the
      running mean by 6 running standard deviations and 20 %): P1, action = spike policy;
    - smoothed loss rising for `loss_rise_steps` consecutive steps: P1, alert only;
    - tokens/s below `throughput_drop` x its running median: P2.
    """

    WARMUP = 10  # steps before spike statistics are trusted
    THROUGHPUT_COOLDOWN = 100  # steps between two throughput alerts (one slow phase, one alert)

    def __init__(self, alerts_spec: Any):
        self.spec = alerts_spec
        self.n = 0
        self.grad_mean = 0.0
        self.loss_mean = 0.0
        self.loss_var = 0.0
        self.smooth: float | None = None
        self.rising = 0
        self.throughput: deque[float] = deque(maxlen=50)
        self.rise_alerted = False
        self.throughput_quiet_until = 0

    def state(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("spec", "throughput")} | {
            "throughput": list(self.throughput)
        }

    def load_state(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            if k == "throughput":
                self.throughput = deque(v, maxlen=50)
            elif k != "spec":
                setattr(self, k, v)

    def observe(self, step: int, loss: float, grad_norm: float, tokens_per_s: float | None = None) -> Verdict:
        spec = self.spec
        verdict = Verdict()
        spike_action = {"alert": "none", "stop": "stop", "rollback": "rollback"}[spec.spike_policy]

        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            action = "rollback" if spec.spike_policy == "rollback" else "stop"
            verdict.alerts.append(Alert("P0", "nonfinite", f"loss={loss} grad_norm={grad_norm} at step {step}", step, action))
            verdict.action = action
            return verdict  # do not poison the statistics

        if self.n >= self.WARMUP:
            if grad_norm > spec.grad_norm_factor * self.grad_mean > 0:
                verdict.alerts.append(Alert(
                    "P1", "grad_norm_spike",
                    f"grad norm {grad_norm:.4g} > {spec.grad_norm_factor:g} x running mean {self.grad_mean:.4g}",
                    step, spike_action))
            std = math.sqrt(max(self.loss_var, 0.0))
            if loss > self.loss_mean + 6 * std and loss > 1.2 * self.loss_mean:
                verdict.alerts.append(Alert(
                    "P1", "loss_spike", f"loss {loss:.4g} vs running mean {self.loss_mean:.4g} (std {std:.3g})",
                    step, spike_action))
        is_spike = bool(verdict.alerts)
        if is_spike:
            verdict.action = spike_action

        # Running statistics (spikes excluded, so one spike does not hide the next).
        if not is_spike:
            self.n += 1
            alpha = 1.0 / min(self.n, 100)
            self.grad_mean += alpha * (grad_norm - self.grad_mean)
            delta = loss - self.loss_mean
            self.loss_mean += alpha * delta
            self.loss_var = (1 - alpha) * (self.loss_var + alpha * delta * delta)
            previous = self.smooth
            self.smooth = loss if previous is None else 0.9 * previous + 0.1 * loss
            if previous is not None and self.smooth > previous:
                self.rising += 1
            else:
                self.rising = 0
                self.rise_alerted = False
            if self.rising >= spec.loss_rise_steps and not self.rise_alerted:
                self.rise_alerted = True
                verdict.alerts.append(Alert(
                    "P1", "loss_rising", f"smoothed loss rose for {self.rising} consecutive steps", step))

        if tokens_per_s is not None and tokens_per_s > 0:
            if len(self.throughput) >= 10:
                median = statistics.median(self.throughput)
                if tokens_per_s < spec.throughput_drop * median and step >= self.throughput_quiet_until:
                    self.throughput_quiet_until = step + self.THROUGHPUT_COOLDOWN
                    verdict.alerts.append(Alert(
                        "P2", "throughput_drop", f"{tokens_per_s:.0f} tokens/s < {spec.throughput_drop:g} x median {median:.0f}",
                        step))
            self.throughput.append(tokens_per_s)
        return verdict


def track_best(best: float | None, stale_evals: int, value: float) -> tuple[float, int]:
    """(best so far, evaluations without improvement) after an eval of `value` (lower is better). Pure."""
    if best is None or value < best:
        return value, 0
    return best, stale_evals + 1


class AlertLog:
    """Appends alerts to RUN/alerts.jsonl (rank 0), the rank's log and the metric sink."""

    def __init__(self, path: Path | None, sink: Any, rank: int):
        self.path = path
        self.sink = sink
        self.rank = rank
        self.count = 0
        self._lock = threading.Lock()
        self._pending_sink: list[Alert] = []

    def emit(self, alert: Alert) -> None:
        with self._lock:
            self.count += 1
            level = {"P0": logging.ERROR, "P1": logging.WARNING}.get(alert.level, logging.INFO)
            log.log(level, "ALERT %s %s step=%d: %s", alert.level, alert.kind, alert.step, alert.message)
            if self.path is not None:
                record = asdict(alert) | {"time": time.time(), "rank": self.rank}
                with open(self.path, "a") as fh:
                    fh.write(json.dumps(record) + "\n")
            # The sink is not thread-safe: alerts from background threads are queued.
            self._pending_sink.append(alert)

    def drain_to_sink(self) -> None:
        with self._lock:
            pending, self._pending_sink = self._pending_sink, []
        for alert in pending:
            self.sink.log_metrics(alert.step, {f"alerts/{alert.kind}": float(LEVEL_VALUE[alert.level])})
            self.sink.set_tags({f"alert.{alert.kind}": f"{alert.level} step {alert.step}: {alert.message}"[:500]})


class StallWatchdog:
    """Raises a P0 alert when no step completes for `stall_seconds` (e.g. a hung collective)."""

    def __init__(self, stall_seconds: float, on_stall: Callable[[float], None]):
        self.stall_seconds = stall_seconds
        self.on_stall = on_stall
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._fired = False
        self._thread = threading.Thread(target=self._run, name="stall-watchdog", daemon=True)
        self._thread.start()

    def beat(self) -> None:
        self.last = time.monotonic()
        self._fired = False

    def _run(self) -> None:
        while not self._stop.wait(min(5.0, self.stall_seconds / 4)):
            idle = time.monotonic() - self.last
            if idle > self.stall_seconds and not self._fired:
                self._fired = True
                self.on_stall(idle)

    def stop(self) -> None:
        self._stop.set()
