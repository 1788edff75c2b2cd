"""Anomaly detection (pure) and the alert log.

`AnomalyDetector.observe(step, loss, grad_norm, tokens_per_s)` returns the alerts a step
raises and the action the spec's policy asks for. It sees the same all-reduced numbers on
every rank, so every rank takes the same decision without another collective.

Levels: P0 page (the run cannot go on as is), P1 message (a human should look),
P2 log (worth knowing). Alert kinds are a contract: `divergence` (P0) is what reports render
as "diverged at step k" together with result.json's `"status": "diverged"`.
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


DIVERGENCE = "divergence"
DIVERGED_KINDS = frozenset({DIVERGENCE, "loss_spike", "grad_norm_spike"})
"""A run stopped (or whose rollbacks ran out) on one of these ended "diverged", not "stopped"."""


class AnomalyDetector:
    """Thresholds from the spec's `alerts` section; state is a few short histories.

    From the first step:
    - **divergence (P0)**: a non-finite loss or grad norm, or, after `ABS_WARMUP` steps, a loss
      above ln(vocab) + `ABS_MARGIN` (worse than guessing every token uniformly: no healthy run
      is there). Action: rollback when the policy is rollback, else stop; a run cannot go on
      from a blown-up state, whatever the policy says for spikes.
    - **loss spike (P1)**: above the median of the recent healthy losses by `SPIKE_MADS`
      robust standard deviations (1.4826 x MAD) and by `SPIKE_REL` of the median. The baseline
      excludes the step being judged and every spike (frozen while alerting), so a blow-up
      cannot drag its own reference up the way a running mean did (lr 0.3 went 7.6 -> 29.2 in
      6 steps unnoticed). Needs `MIN_HISTORY` healthy steps. Action: the spike policy.
    - **grad norm spike (P1)**: above `grad_norm_factor` x the median recent grad norm.
    - **loss rising (P1)**: the smoothed loss rose for `loss_rise_steps` steps; alert only.
    - **throughput drop (P2)**: tokens/s below `throughput_drop` x the median, never in the
      first `THROUGHPUT_WARMUP` steps of a process (start *and* every resume: a fresh process
      warms caches, a resumed one may even run on another machine).

    One alert per episode: while a kind keeps firing on consecutive steps it is not repeated.
    """

    WINDOW = 32
    MIN_HISTORY = 3
    ABS_WARMUP = 5
    ABS_MARGIN = 1.0
    SPIKE_MADS = 6.0
    SPIKE_REL = 0.2
    REBASE_AFTER = 64  # consecutive spikes under policy "alert": the new level is the new normal
    THROUGHPUT_WARMUP = 5
    THROUGHPUT_COOLDOWN = 100  # steps between two throughput alerts (one slow phase, one alert)

    def __init__(self, alerts_spec: Any, vocab_size: int | None = None):
        self.spec = alerts_spec
        self.abs_limit = math.log(vocab_size) + self.ABS_MARGIN if vocab_size and vocab_size > 1 else None
        self.n = 0  # steps observed (healthy or not), across resumes
        self.losses: deque[float] = deque(maxlen=self.WINDOW)
        self.grads: deque[float] = deque(maxlen=self.WINDOW)
        self.spiking: list[str] = []  # kinds alerting on the previous step
        self.spike_run = 0
        self.smooth: float | None = None
        self.rising = 0
        self.rise_alerted = False
        self.throughput: deque[float] = deque(maxlen=50)
        self.throughput_quiet_until = self.THROUGHPUT_WARMUP

    def state(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("spec", "abs_limit")}
        return out | {k: list(getattr(self, k)) for k in ("losses", "grads", "throughput")}

    def load_state(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            if k in ("losses", "grads"):
                setattr(self, k, deque(v, maxlen=self.WINDOW))
            elif k == "throughput":
                self.throughput = deque(v, maxlen=50)
            elif k in self.__dict__ and k not in ("spec", "abs_limit"):
                setattr(self, k, v)  # keys of an older detector's state are ignored

    def on_resume(self, step: int) -> None:
        """A process (re)started at `step`: its first steps' speed says nothing about the run."""
        self.throughput.clear()
        self.throughput_quiet_until = step + self.THROUGHPUT_WARMUP
        self.spiking = []

    def _divergence(self, step: int, message: str) -> Verdict:
        action = "rollback" if self.spec.spike_policy == "rollback" else "stop"
        self.n += 1
        return Verdict([Alert("P0", DIVERGENCE, message, step, action)], action)

    def observe(self, step: int, loss: float, grad_norm: float, tokens_per_s: float | None = None) -> Verdict:
        spec = self.spec
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return self._divergence(step, f"loss={loss} grad_norm={grad_norm} at step {step}: not finite")
        if self.abs_limit is not None and self.n >= self.ABS_WARMUP and loss > self.abs_limit:
            return self._divergence(step, f"loss {loss:.4g} at step {step} is above ln(vocab)+{self.ABS_MARGIN:g} = "
                                          f"{self.abs_limit:.4g}: worse than guessing uniformly")
        self.n += 1
        verdict = Verdict()
        spike_action = {"alert": "none", "stop": "stop", "rollback": "rollback"}[spec.spike_policy]
        firing: list[Alert] = []
        if len(self.grads) >= self.MIN_HISTORY:
            med = statistics.median(self.grads)
            if grad_norm > spec.grad_norm_factor * med > 0:
                firing.append(Alert("P1", "grad_norm_spike",
                                    f"grad norm {grad_norm:.4g} > {spec.grad_norm_factor:g} x recent median {med:.4g}",
                                    step, spike_action))
        if len(self.losses) >= self.MIN_HISTORY:
            med = statistics.median(self.losses)
            mad = statistics.median(abs(x - med) for x in self.losses)
            limit = med + max(self.SPIKE_MADS * 1.4826 * mad, self.SPIKE_REL * abs(med))
            if loss > limit:
                firing.append(Alert("P1", "loss_spike",
                                    f"loss {loss:.4g} > {limit:.4g} (recent median {med:.4g}, MAD {mad:.3g})",
                                    step, spike_action))
        if firing:
            self.spike_run += 1
            # Repeated on consecutive steps: one alert per episode (the action still applies).
            verdict.alerts += [a for a in firing if a.kind not in self.spiking]
            verdict.action = spike_action
            self.spiking = [a.kind for a in firing]
            if self.spike_run >= self.REBASE_AFTER:  # a lasting new level, not a spike
                self.losses.clear()
                self.grads.clear()
                self.spike_run = 0
            self._throughput(step, tokens_per_s, verdict)
            return verdict
        self.spiking, self.spike_run = [], 0

        # Healthy step: it joins the baselines.
        self.losses.append(loss)
        self.grads.append(grad_norm)
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
        self._throughput(step, tokens_per_s, verdict)
        return verdict

    def _throughput(self, step: int, tokens_per_s: float | None, verdict: Verdict) -> None:
        if tokens_per_s is None or tokens_per_s <= 0 or step < self.throughput_quiet_until:
            return
        if len(self.throughput) >= 10:
            median = statistics.median(self.throughput)
            if tokens_per_s < self.spec.throughput_drop * median:
                self.throughput_quiet_until = step + self.THROUGHPUT_COOLDOWN
                verdict.alerts.append(Alert(
                    "P2", "throughput_drop",
                    f"{tokens_per_s:.0f} tokens/s < {self.spec.throughput_drop:g} x median {median:.0f}", step))
        self.throughput.append(tokens_per_s)


class CheckpointFailures:
    """Escalation of failed checkpoint writes (fed the trainer's events, from any thread).

    A full disk stops the run at the next step with `DiskSpaceError` (not retried: it would
    fail at the same write). Any other failure is a P1 the first times; the `limit`-th is a P0
    and stops the run (`TrainingError`): training on while nothing can be saved only grows
    the work a crash would lose. Either way the last valid checkpoint is left as it was.
    """

    def __init__(self, run_dir: Path, emit: Callable[[str, str, str], None], limit: int = 3):
        self.run_dir = Path(run_dir)
        self.emit = emit
        self.limit = limit
        self.count = 0
        self.fatal: Exception | None = None

    def note(self, kind: str, message: str) -> None:
        if kind != "checkpoint_failed" or self.fatal is not None:
            return
        from trainer.diskfull import disk_full_error, is_disk_full

        if is_disk_full(message) or _nearly_full(self.run_dir):
            self.fatal = disk_full_error(self.run_dir, "checkpoint", message, self.run_dir / "checkpoints")
            self.emit("P0", "disk_full", str(self.fatal))
            return
        self.count += 1
        if self.count >= self.limit:
            from basics.errors import TrainingError

            self.fatal = TrainingError(f"{self.count} checkpoint writes failed (last: {message}); stopping with "
                                       "the last valid checkpoint intact")
            self.emit("P0", "checkpoint_failed_repeatedly", str(self.fatal))

    def raise_if_fatal(self) -> None:
        if self.fatal is not None:
            raise self.fatal


def _nearly_full(path: Path, floor_bytes: int = 1 << 20) -> bool:
    """Under 1 MB free: some writers (torch.save) report a full disk without its errno."""
    import shutil

    try:
        return shutil.disk_usage(path).free < floor_bytes
    except OSError:
        return False


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
        """Stop and wait for the thread: it holds `on_stall` (in the trainer, a closure over the
        trainer and its model), which must not outlive the run while an idle thread sleeps on."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30.0)
