"""The training loop: one `Trainer` per rank, driven by the resolved spec only.

Data position is a pure function of the step (`MixtureBatcher.batch(step, micro_step)`),
so resuming is "load the checkpoint, continue at its step": no dataloader state exists.

The pieces live beside this file, each behind one seam:
  trainer/parallel.py       `ParallelDims`: the layout, the one device mesh and every process group
  trainer/model_parts.py    the model as a list of parts (one, or one per pipeline stage on this rank)
  trainer/step.py           one optimizer step for every layout (forward/backward/clip/AdamW, OOM detection)
  trainer/collectives.py    barrier / all_reduce / broadcast / gather (no-ops on one process)
  trainer/checkpoint/       checkpoints: one manager, the unsharded and sharded layouts, one writer,
                            the on-disk format (docs/checkpoints.md)
  trainer/evaluation.py     held-out evaluation and early stopping
  trainer/record.py         the run record: environment fingerprint, tags, params, result.json
  trainer/faults.py         fault injection for tests (a null object in real runs)
  trainer/monitor.py        anomaly detection, alerts, stall watchdog
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from basics.errors import TrainingError
from basics.files import sha256_file
from trainer import record
from trainer.checkpoint.format import checkpoint_name, describe_layout, list_checkpoints
from trainer.checkpoint.manager import CheckpointManager
from trainer.checkpoint.writer import CheckpointWriter
from trainer.collectives import Collectives
from trainer.evaluation import Evaluator, update_best
from trainer.faults import FaultPlan
from trainer.host_memory import keep_freed_memory_in_heap
from trainer.metric_sinks import FanoutSink, JsonlMetrics, MetricSink, MlflowSink, NullSink
from trainer.model_parts import build_model_parts
from trainer.monitor import (
    DIVERGED_KINDS,
    Alert,
    AlertLog,
    AnomalyDetector,
    CheckpointFailures,
    StallWatchdog,
)
from trainer.optim import build_optimizer, build_scheduler
from trainer.parallel import ParallelDims, make_accelerator
from trainer.state import StepResult, TrainState
from trainer.step import StepRunner, to_device
from trainer.step_metrics import DeviceScalars
from validation.flops import DevicePeak, device_peak, flops_per_token
from validation.spec import ExperimentSpec

if TYPE_CHECKING:
    import torch

    from trainer.batches import MixtureBatcher
    from validation.data.prepared import PreparedData

__all__ = ["EXIT_FAILED", "EXIT_PREEMPTED", "StepResult", "TrainState", "Trainer", "setup_logging"]

log = logging.getLogger("trainer")

EXIT_PREEMPTED = 143  # 128 + SIGTERM: orchestration resumes the run
EXIT_FAILED = TrainingError.exit_code


def setup_logging(run_dir: Path, rank: int, console_level: str = "INFO") -> None:
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    root = logging.getLogger("trainer")
    root.setLevel(logging.INFO)
    for handler in list(root.handlers):  # a second Trainer in the same process (smoke, tests)
        root.removeHandler(handler)
        handler.close()
    fmt = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    file_handler = logging.FileHandler(run_dir / "logs" / f"rank{rank}.log")
    file_handler.setFormatter(fmt)
    root.addHandler(file_handler)
    if rank == 0:
        console = logging.StreamHandler()
        console.setFormatter(fmt)
        # The orchestrator runs the smoke stage in-process under its own progress display.
        console.setLevel(console_level.upper())
        console.addFilter(lambda record: not getattr(record, "per_step", False))
        root.addHandler(console)
    root.propagate = False


@dataclass
class Window:
    """What happened since the last metric log (throughput and the realised mixture)."""

    seconds: float = 0.0
    tokens: int = 0
    steps: int = 0
    rows: dict[str, int] = field(default_factory=dict)

    def add(self, seconds: float, tokens: int, rows: dict[str, int]) -> None:
        self.seconds += seconds
        self.tokens += tokens
        self.steps += 1
        for k, v in rows.items():
            self.rows[k] = self.rows.get(k, 0) + v


class Trainer:
    """Builds everything from the spec, then `run()` trains, evaluates, checkpoints and exports."""

    def __init__(
        self,
        spec: ExperimentSpec,
        run_dir: Path,
        data_dir: Path,
        tracking_uri: str | None = None,
        overfit_one_batch: bool = False,
        prepared: PreparedData | None = None,
        peak: DevicePeak | None = None,
        console_level: str = "INFO",
        repo_root: Path | None = None,
    ):
        """`peak`: the device peak the resolve step worked out (`ResolvedExperiment.compute.peak`);
        `console_level`: the rank-0 console's level (the log files under `RUN/logs` keep everything)."""
        import torch
        from accelerate import PartialState
        from accelerate.utils import parse_flag_from_env

        from validation.data.prepared import PreparedData

        self.t_start = time.time()
        self.spec = spec
        self.run_dir = Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.overfit = overfit_one_batch
        self.repo_root = Path(repo_root) if repo_root is not None else None
        """Where `eval.tasks` paths are relative to (the resolved spec's repository)."""
        self.downstream: dict[str, Any] | None = None
        """RUN/downstream/results.json's summary once the tasks were scored (`eval.tasks`)."""
        tr = spec.train
        if tr.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True, warn_only=True)
            # Deterministic mode also NaN-fills every torch.empty (a debugging aid that exposes
            # reads of uninitialised memory); no result depends on it (the golden losses are
            # unchanged), and the fill was ~1 % of a CPU bf16 step (bench/RESULTS.md, "trainer:
            # where the time goes": 315 -> 312 ms).
            torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
            torch.backends.cudnn.benchmark = False
        precision = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[tr.precision]
        if precision == "fp16" and not torch.cuda.is_available():
            raise TrainingError("train.precision fp16 needs a GPU; use bf16 (CPUs with avx512_bf16) or fp32")
        # Joins the process group that `accelerate launch` set up (on CPU only when told so,
        # as Accelerator itself decides).
        processes = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
        self.dims = dims = ParallelDims.from_layout(spec.parallel_layout(), processes.num_processes,
                                                    processes.process_index, spec.resource.nodes)
        self.accelerator = acc = make_accelerator(precision, dims)
        self.rank, self.world = acc.process_index, acc.num_processes
        self.dp = dims.dp  # data-parallel replicas: ranks of one tensor-parallel group read the same rows
        self.is_main = acc.is_main_process
        self.device = acc.device
        if self.device.type == "cpu":  # activations live in host memory: no page faults per step
            keep_freed_memory_in_heap()
        # The one mesh and every process group, built once on every rank in the same order.
        dims.build(self.device.type, checkpoint_group=tr.async_checkpoint)
        self.comm = Collectives(self.world, self.device, dims.host_group)
        self.faults = FaultPlan.from_env(self.rank)
        setup_logging(self.run_dir, self.rank, console_level)

        # ---- data
        self.prepared = prepared if prepared is not None else PreparedData.open(Path(data_dir), verify=self.is_main)
        self.seq_len = spec.data.seq_len
        if self.prepared.vocab_size > spec.model.vocab_size:
            raise TrainingError(
                f"tokenizer has {self.prepared.vocab_size} tokens but model.vocab_size is {spec.model.vocab_size}")

        # ---- model parts, optimizer, schedule (seeded identically on every rank)
        torch.manual_seed(tr.seed)
        init_from = Path(spec.model.init_from) if spec.model.init_from else None
        if init_from is not None and not init_from.is_absolute():  # relative to the repository, like data paths
            init_from = Path(__file__).resolve().parent.parent / init_from
        # train.compile: each block compiled in place (every layout, before FSDP). One path for all
        # layouts, rather than the whole model when unsharded: the same graphs and numbers in every
        # layout, state-dict names without `_orig_mod.`, one compile per block type.
        self.parts = build_model_parts(spec, dims, self.device, tr.seed, init_from,
                                       compile_backend="inductor" if tr.compile else None)
        self.n_params = self.parts.parameter_count(self.comm)
        declared = spec.model.parameter_count()
        if self.n_params != declared:  # the plan, the memory check and MFU all rest on the declared count
            raise TrainingError(f"models/{spec.model.model_type}.py: parameter_count() says {declared:,} but the "
                                f"built model has {self.n_params:,}; fix the architecture's count")
        self.flops_per_token = flops_per_token(spec.model, self.seq_len)
        peak = peak or device_peak(spec.resource, spec.train.precision)
        assert peak is not None, "an unknown gpu_type is refused by the resolve step"
        self.peak_flops = peak.flops_per_second(torch.get_num_threads())
        self.peak_source, self._mfu_warned = peak.source, False
        self.optimizer = build_optimizer(self.parts.owner, tr, spec.model)
        self.total_steps = spec.total_steps(self.dp)
        self.scheduler = build_scheduler(self.optimizer, tr, self.total_steps)
        self.optimizer = self.parts.prepare(acc, self.optimizer)
        if not dims.sharded:
            autocast_without_output_upcast(acc, self.parts.owner)
        self.local_params = self.parts.local_params(dims)
        self._seed_rank()

        # ---- state, sinks, monitoring, the seams
        self.state = TrainState(
            micro_batch_size=tr.micro_batch_size, grad_accum_steps=tr.grad_accum_steps, world_size=self.dp,
            spec_hash=spec.spec_hash(), data_version=self.prepared.version)
        self.identity = record.read_identity(self.run_dir)
        self.sink: MetricSink = NullSink()
        if self.is_main:
            sinks: list[MetricSink] = [JsonlMetrics(self.run_dir / "metrics.jsonl")]
            if tracking_uri and tracking_uri.lower() not in ("none", "disabled", "off"):
                sinks.append(MlflowSink(tracking_uri, spec.name, self.run_dir, run_name=self.identity.get("run_id")))
            self.sink = FanoutSink(*sinks)
        self.alerts = AlertLog(self.run_dir / "alerts.jsonl" if self.is_main else None, self.sink, self.rank)
        self.ckpt_failures = CheckpointFailures(self.run_dir, self._on_event)  # disk full / repeated: stop
        self.detector = AnomalyDetector(spec.alerts, vocab_size=spec.model.vocab_size)
        self.ckpt_root = self.run_dir / "checkpoints"
        self.ckpt = CheckpointManager(spec, self.ckpt_root, acc, self.parts, self.optimizer, self.scheduler,
                                      self.comm, dims, self._on_event)
        self.layout = self.ckpt.layout
        self.step_fn = StepRunner(self.parts.forward_backward(acc, self.comm, self.faults), self.optimizer,
                                  self.scheduler, self.comm, self.faults, tr.grad_clip)
        # On a GPU every host read of a device value waits for the device: loss and grad norm stay
        # there and are read once per log interval (trainer/step_metrics.py). A CPU read is free,
        # so CPU runs read every step (TRAINER_DEFER_STEP_METRICS=1 forces the GPU path, for tests).
        self.step_fn.defer = self.device.type == "cuda" or os.environ.get("TRAINER_DEFER_STEP_METRICS") == "1"
        self.pending = DeviceScalars(self._sum_loss_shares if self.world > 1 else None)
        # Sharded forwards are collectives: every rank evaluates every batch (same count of forwards).
        self.evaluate = Evaluator(spec, self.prepared, self.comm, self.rank, acc.autocast,
                                  lambda batch: to_device(batch, self.device), split=not dims.sharded)
        self.resumed_from: str | None = None
        self.ckpt_write_s: list[float] = []
        self._sigterm = False
        self.batcher = self._make_batcher()
        self.step_losses: list[tuple[int, float]] = []
        self.step_done_at: list[float] = []  # perf_counter after each step (benchmarks: windowed tokens/s)
        self.export_checked: tuple[Any, str] | None = None  # (export note, what checked it), once exported
        self._recorded_checkpoint = -1

    # ------------------------------------------------------------------ small helpers

    @property
    def model(self) -> Any:
        """The first model part as it runs (accelerate-prepared): the whole model outside pipelines."""
        return self.parts.parts[0]

    @property
    def raw_model(self) -> Any:
        """The model parts' owner: this rank's parameters under the model's names (bench/ reads it)."""
        return self.parts.owner

    @property
    def topo(self) -> ParallelDims:
        """The parallel dims under their former name (bench/ reads it)."""
        return self.dims

    @property
    def checkpointer(self) -> CheckpointWriter:
        """The on-disk writer (its `outcomes` say which saves validated)."""
        return self.ckpt.writer

    @property
    def stalls(self) -> list[float]:
        return self.ckpt.stalls

    def _seed_rank(self) -> None:
        import random

        import numpy as np
        import torch

        seed = self.spec.train.seed + self.rank
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    def _make_batcher(self) -> MixtureBatcher:
        from trainer.batches import MixtureBatcher

        return MixtureBatcher(
            self.prepared, self.spec.data.weights(), self.seq_len, self.state.micro_batch_size,
            self.state.grad_accum_steps, self.spec.train.seed, self.dims.dp_rank, self.dp)

    def _adopt(self, state: TrainState) -> None:
        """Continue from a restored state (resume, rollback)."""
        self.state = state
        self.detector.load_state(state.detector)
        self.batcher = self._make_batcher()

    def _on_event(self, level: str, kind: str, message: str, step: int | None = None) -> None:
        self.alerts.emit(Alert(level, kind, message, self.state.step if step is None else step))
        self.ckpt_failures.note(kind, message)

    def _tokens_per_step(self) -> int:
        return self.state.micro_batch_size * self.state.grad_accum_steps * self.dp * self.seq_len

    def _handle_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._sigterm = True

    # ------------------------------------------------------------------ checkpoints

    def _record_checkpoints(self) -> bool:
        """Tag the MLflow run with the last published checkpoint and its manifest's sha256
        (`pipeline.checkpoint`): in the GitHub flow the tag is written by this launch's own
        identity, so the trusted plan of a later `/train` can name this checkpoint, and only
        this one, to resume from after the runner was lost (pipelines/trusted/registry.py)."""
        if not self.is_main:
            return False
        done = [o for o in self.checkpointer.outcomes if o.ok and o.path is not None]
        if not done or done[-1].step == self._recorded_checkpoint:
            return False
        last = done[-1]
        manifest = Path(str(last.path)) / "MANIFEST.json"
        if manifest.is_file():
            self.sink.set_tags({"pipeline.checkpoint": json.dumps(
                {"step": last.step, "path": str(last.path), "manifest_sha256": sha256_file(manifest)},
                sort_keys=True)})
            self._recorded_checkpoint = last.step
            return True
        return False

    def save_checkpoint(self) -> None:
        self._record_checkpoints()  # an asynchronous save published since: its tag goes with this flush
        self.sink.flush()  # everything up to this step is recorded before it can be resumed from
        self.state.mlflow_run_id = self.sink.run_id if self.is_main else self.state.mlflow_run_id
        self.state.detector = self.detector.state()
        self.ckpt.save(self.state)
        if self._record_checkpoints():  # a synchronous save is published by now: say so before a kill can
            self.sink.flush()

    def wait_checkpoints(self) -> None:
        self.ckpt_write_s = self.ckpt.wait()
        if self._record_checkpoints():
            self.sink.flush()
        self.alerts.drain_to_sink()
        self.comm.barrier()

    def resume(self) -> None:
        found = self.ckpt.find_resume()
        if found:
            self._adopt(self.ckpt.load(Path(found), self.state))
            self.resumed_from = found
            self.detector.on_resume(self.state.step)  # a fresh process: no throughput verdict while warming up
            log.info("resumed from %s at step %d", found, self.state.step)
            if self.ckpt.resharded:  # continued under another layout: one event in the run's history
                self._on_event("P2", "resharded", self.ckpt.resharded)
        elif list_checkpoints(self.ckpt_root):
            # Every kept checkpoint failed verification (each skip was a P1): say what happens now.
            self._on_event("P1", "restart_from_scratch",
                           f"no valid checkpoint among {len(list_checkpoints(self.ckpt_root))} in "
                           f"{self.ckpt_root}: restarting from step 0")
        self.comm.barrier()

    def rollback(self, s: int) -> bool:
        self.alerts.drain_to_sink()
        restored = self.ckpt.rollback(self.state, s)
        if restored is None:
            return False
        self._adopt(restored[0])
        self._on_event("P1", "rollback", restored[1])
        return True

    # ------------------------------------------------------------------ one step

    def train_step(self, s: int) -> StepResult:
        index = 0 if self.overfit else s + self.state.data_offset
        batches = [self.batcher.batch(index, m) for m in range(self.state.grad_accum_steps)]
        return self.step_fn(s, batches, self._sigterm)

    def _oom_fallback(self, s: int) -> None:
        st = self.state
        floor = self.spec.train.min_micro_batch_size
        if st.micro_batch_size // 2 < floor:
            raise TrainingError(
                f"out of memory at step {s + 1} with micro_batch_size={st.micro_batch_size} "
                f"(floor train.min_micro_batch_size={floor}): lower train.min_micro_batch_size, "
                f"shorten data.seq_len, use precision bf16, a smaller model, or more devices")
        st.micro_batch_size //= 2
        st.grad_accum_steps *= 2
        st.oom_fallbacks += 1
        self.batcher = self._make_batcher()
        self._on_event("P1", "oom_fallback",
                       f"out of memory at step {s + 1}: micro_batch_size -> {st.micro_batch_size}, "
                       f"grad_accum_steps -> {st.grad_accum_steps} (global batch unchanged)")

    def _faults_after_step(self) -> None:
        def flush_everything() -> None:
            # Between checkpoints: a save still in flight finishes first, so the test knows which one survives
            # (this process only: a collective here would wait for peers that are not killed).
            self.ckpt.wait_local()
            self.sink.flush()
            for h in logging.getLogger("trainer").handlers:
                h.flush()

        self.faults.after_step(self.state.step, flush_everything)

    # ------------------------------------------------------------------ the run

    def run(self) -> tuple[dict[str, Any], int]:
        """Train to the end (or a stop), then evaluate, export and write result.json. Returns (result, exit code)."""
        tr = self.spec.train
        in_main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, self._handle_sigterm) if in_main_thread else None
        self.resume()
        self._start_record()
        watchdog = StallWatchdog(self.spec.alerts.stall_seconds, lambda idle: self._on_event(
            "P0", "stall", f"no step completed for {idle:.0f}s"))
        outcome = record.Outcome("finished", "max_steps")
        window, last = Window(), {}
        log.info("training %s: %d params (%d on this rank), %d steps, world %d (%s), "
                 "micro %d x accum %d, seq %d, precision %s", self.spec.name, self.n_params, self.local_params,
                 self.total_steps, self.world, describe_layout(self.layout), self.state.micro_batch_size,
                 self.state.grad_accum_steps, self.seq_len, tr.precision)
        try:
            while self.state.step < self.total_steps:
                s = self.state.step
                t0 = time.perf_counter()
                res = self.train_step(s)
                if res.oom:
                    self._oom_fallback(s)
                    self._sigterm = self._sigterm or res.sigterm
                    continue
                dt = time.perf_counter() - t0
                self.state.step = s + 1
                self.state.tokens += self._tokens_per_step()
                watchdog.beat()
                window.add(dt, self._tokens_per_step(), res.rows)

                # monitor: alerts, and what the spike policy asks for
                verdict, at = self._monitor(s + 1, res, self._tokens_per_step() / dt if dt > 0 and s > 2 else None)
                if verdict is not None and verdict.action == "rollback":
                    if not self.rollback(s):
                        outcome = _stopped(verdict, at, "rollback_failed")
                        break
                    continue
                if verdict is not None and verdict.action == "stop":
                    outcome = _stopped(verdict, at)
                    break

                if (s + 1) % tr.log_interval == 0 or s + 1 == self.total_steps:
                    last = self._log_window(s + 1, res, window)
                    window = Window()
                stop_early = False
                if (s + 1) % tr.eval_interval == 0 and s + 1 < self.total_steps:
                    stop_early = self._evaluate_and_log(s + 1)
                # Only the all-reduced flag: a rank whose own SIGTERM came after this step's
                # all-reduce must not start saving while its peers go on to the next step's
                # collectives (both would wait forever). The next step's all-reduce carries it.
                if res.sigterm or (self.world == 1 and self._sigterm):
                    return self._preempt(watchdog)
                if (s + 1) % tr.checkpoint_interval == 0 and s + 1 < self.total_steps:
                    self.save_checkpoint()
                self.alerts.drain_to_sink()
                self.ckpt_failures.raise_if_fatal()  # a full disk / repeated failures end the run here
                if (s + 1) % tr.log_interval == 0:
                    self.sink.flush(wait=False)
                self._faults_after_step()
                self.step_done_at.append(time.perf_counter())
                if stop_early:
                    outcome = record.Outcome("finished", "early_stopping")
                    self._on_event("P2", "early_stopping",
                                   f"eval/loss did not improve for {self.state.evals_without_improvement} evaluations")
                    break
        except TrainingError as exc:
            outcome = record.Outcome("failed", "error", str(exc))
            self._on_event("P0", "training_error", str(exc))
        finally:
            watchdog.stop()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        return self._finish(outcome, last)

    def _monitor(self, step: int, res: StepResult, tps: float | None) -> tuple[Any, int]:
        """Per-step log line, `step_losses` and the anomaly detector for the steps readable now.

        Reading every step: just `step`. Deferred reads (GPU): nothing until the window is due
        (log interval, evaluation, checkpoint, SIGTERM, last step), then every step of it from
        one transfer; alerts arrive up to log_interval steps late. Returns the first verdict that
        asks for a rollback or stop (or the last one) and the step it was about.
        """
        if res.device is None:
            observed = [(step, res.loss, res.grad_norm, tps)]
        else:
            self.pending.add(step, *res.device, host=tps)
            tr = self.spec.train
            due = (step % tr.log_interval == 0 or step % tr.eval_interval == 0 or step == self.total_steps
                   or step % tr.checkpoint_interval == 0 or res.sigterm or self._sigterm)
            if not due:
                return None, step
            observed = self.pending.read()
            res.loss, res.grad_norm = observed[-1][1], observed[-1][2]
        verdict: Any = None
        for at, loss, grad_norm, step_tps in observed:
            self.step_losses.append((at, loss))
            log.info("step=%d loss=%r grad_norm=%r lr=%r", at, loss, grad_norm,
                     self.scheduler.get_last_lr()[0], extra={"per_step": True})
            verdict = self.detector.observe(at, loss, grad_norm, step_tps)
            for alert in verdict.alerts:
                self.alerts.emit(alert)
            if verdict.action in ("rollback", "stop"):  # the rest of the window is moot
                return verdict, at
        return verdict, step

    def _sum_loss_shares(self, losses: Any) -> None:
        """Per-rank loss shares of a window -> the global loss per step (one all-reduce)."""
        import torch.distributed as dist

        dist.all_reduce(losses)
        losses.div_(self.step_fn.replicas)

    def _start_record(self) -> None:
        if self.is_main:
            self.state.mlflow_run_id = self.sink.run_id
            self.sink.set_tags(record.tags(self.spec, self.identity, self.prepared.version, self.world))
            if self.state.step == 0:
                self.sink.log_params(record.params(self.spec, self.world, self.n_params, self.total_steps))
            self.sink.flush()

    def _evaluate_and_log(self, step: int) -> bool:
        """Evaluate, log, track the best; True when early stopping says stop."""
        metrics = self.evaluate(self.parts.eval_model())
        self.sink.log_metrics(step, metrics)
        log.info("eval step %d: %s", step, _fmt(metrics))
        return update_best(self.state, metrics, self.spec.train.early_stopping_patience)

    def _preempt(self, watchdog: StallWatchdog) -> tuple[dict[str, Any], int]:
        """SIGTERM seen by some rank: save, say so, exit 143 (orchestration resumes)."""
        self.save_checkpoint()
        self.wait_checkpoints()
        self._on_event("P2", "preempted",
                       f"SIGTERM: checkpoint saved at step {self.state.step}; exiting {EXIT_PREEMPTED}")
        self.alerts.drain_to_sink()
        self.sink.close("preempted")
        watchdog.stop()
        return {"status": "preempted", "steps": self.state.step}, EXIT_PREEMPTED

    def _finish(self, outcome: record.Outcome, last: dict[str, float]) -> tuple[dict[str, Any], int]:
        """Final checkpoint, evaluation and export (unless failed), then result.json."""
        if outcome.status != "failed":
            final_saved = self.ckpt_root / checkpoint_name(self.state.step)
            # A sharded model is exported from its checkpoint's shards: make sure one exists.
            if outcome.status == "finished" or (self.dims.sharded and not final_saved.is_dir()):
                self.save_checkpoint()
            self.wait_checkpoints()
            self.ckpt_failures.raise_if_fatal()  # the final save hit a full disk: no export either
            final_metrics = self.evaluate(self.parts.eval_model())
            self.sink.log_metrics(self.state.step, final_metrics)
            if outcome.status == "finished":
                update_best(self.state, final_metrics, self.spec.train.early_stopping_patience)
            if self.is_main:
                self.export()
                task_metrics = self.score_tasks()  # rank 0 only, from RUN/model; the others wait below
                self.sink.log_metrics(self.state.step, task_metrics)
                final_metrics = final_metrics | task_metrics
            outcome.final_metrics = final_metrics
        else:
            self.wait_checkpoints()
        exit_code = 0 if outcome.status == "finished" else EXIT_FAILED
        outcome.final_metrics |= {k: last[k] for k in ("train/loss", "perf/tokens_per_s", "perf/mfu",
                                                        "perf/peak_mem_gb") if k in last}
        if "train/loss" not in outcome.final_metrics and self.step_losses:
            outcome.final_metrics["train/loss"] = self.step_losses[-1][1]
        checksum = self.param_checksum()
        log.info("param_checksum=%s rank=%d", checksum, self.rank)
        outcome.param_checksums = self.comm.gather(checksum)  # equal under DDP; per shard when sharded
        outcome.stalls, outcome.write_s, outcome.resumed_from = self.stalls, self.ckpt_write_s, self.resumed_from
        result = record.result(
            self.spec, self.state, outcome, run_dir=self.run_dir, run_id=self.sink.run_id, world=self.world,
            total_steps=self.total_steps, n_params=self.n_params, flops_per_token=self.flops_per_token,
            alerts=self.alerts.count, wall_s=time.time() - self.t_start)
        result["layout"] = {"dp": self.dp, "tp": self.dims.tp, "fsdp": self.dims.fsdp, "sharded": self.dims.sharded,
                            "replicate": self.dims.replicate, "shard": self.dims.shard, "pp": self.dims.pp,
                            "params_on_rank0": self.local_params}
        if self.downstream is not None:
            result["downstream"] = {k: v for k, v in self.downstream.items() if k != "metrics"}
        # How the exported model loads (or why it does not), as checked on its files: the report states it.
        note, verified = self.export_checked or (self.spec.model.export_note(), None)
        result["export"] = (note.model_dump() | ({"verified": verified} if verified else {})
                            | {"architecture": self.spec.model.model_type, "optimizer": self.spec.train.optimizer.name})
        self.alerts.drain_to_sink()
        if self.is_main:
            self.sink.close(outcome.status)
            result["mlflow_run_id"] = self.sink.run_id
            record.write_result(self.run_dir, result)
        self.comm.barrier()
        return result, exit_code

    def _log_window(self, step: int, res: StepResult, window: Window) -> dict[str, float]:
        sources = list(self.prepared.sources)
        counts = self.comm.all_reduce([float(window.rows.get(src, 0)) for src in sources])
        total_rows = sum(counts) or 1.0
        tps = window.tokens / window.seconds if window.seconds > 0 else 0.0
        metrics = {
            "train/loss": res.loss,
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/grad_norm": res.grad_norm,
            "perf/tokens_per_s": tps,
            "perf/mfu": tps * self.flops_per_token / (self.peak_flops * self.world),
            "perf/step_time_s": window.seconds / max(1, window.steps),
            "perf/peak_mem_gb": _peak_mem_gb(),
        }
        metrics |= {f"data/mix/{src}": c / total_rows for src, c in zip(sources, counts, strict=True)}
        metrics |= self._architecture_metrics()
        if metrics["perf/mfu"] > 1.0 and not self._mfu_warned:
            self._mfu_warned = True  # the peak is a table value, not a measurement: say when it is wrong
            log.warning("perf/mfu %.2f exceeds 1: this device's peak (%s, %.3g TFLOPS) is too low for it; "
                        "set resource.peak_tflops to its real peak", metrics["perf/mfu"], self.peak_source,
                        self.peak_flops / 1e12)
        self.sink.log_metrics(step, metrics)
        log.info("step %d/%d %s", step, self.total_steps, _fmt(metrics))
        return metrics

    def _architecture_metrics(self) -> dict[str, float]:
        """The architecture's own metrics since the last log line (`step_metrics`, e.g. a mixture of
        experts' router load), averaged over ranks (every rank reports the same keys)."""
        extra = self.spec.model.step_metrics(self.parts.owner)
        if not extra:
            return {}
        keys = sorted(extra)
        sums = self.comm.all_reduce([float(extra[k]) for k in keys])
        return {k: v / self.world for k, v in zip(keys, sums, strict=True)}

    def param_checksum(self) -> str:
        """sha256 of every parameter's bytes: equal on all ranks when data parallelism is correct."""
        import hashlib

        digest = hashlib.sha256()
        from torch.distributed.tensor import DTensor

        for name, param in sorted(self.parts.owner.named_parameters()):
            local = param.to_local() if isinstance(param, DTensor) else param
            digest.update(name.encode())
            digest.update(local.detach().float().cpu().numpy().tobytes())
        return digest.hexdigest()[:16]

    def score_tasks(self) -> dict[str, float]:
        """`eval.tasks` on the exported model, on this process (trainer/lm_eval_scoring.py says why).
        A failing task is recorded in RUN/downstream/results.json and never fails the run. Smoke
        scores 4 examples of each task: a broken task fails the PR check, not the GPU job."""
        if self.spec.eval is None:
            return {}
        from trainer.lm_eval_scoring import RESULTS_DIR, evaluate_export, upload_samples

        spec = self.spec.eval
        if self.overfit:
            spec = spec.model_copy(update={"tasks": [t.model_copy(update={"limit": min(t.limit, 4)})
                                                     for t in spec.tasks]})
        started = time.time()
        try:
            metrics, self.downstream = evaluate_export(self.run_dir / "model", spec, self.repo_root or Path.cwd(),
                                                       self.run_dir / RESULTS_DIR, seed=self.spec.train.seed)
        except Exception as exc:  # noqa: BLE001 - the trained model and its result are kept whatever the tasks do
            log.error("downstream evaluation failed: %s: %s", type(exc).__name__, exc)
            self.downstream = {"error": f"{type(exc).__name__}: {exc}", "tasks": {}}
            return {}
        failed = [name for name, t in self.downstream["tasks"].items() if "error" in t]
        # Per-example records beside the metrics in MLflow (artifacts `downstream/`), best effort.
        not_uploaded = upload_samples(self.run_dir, self.run_dir / RESULTS_DIR)
        self.downstream["mlflow_artifacts"] = RESULTS_DIR if not_uploaded is None else f"not uploaded: {not_uploaded}"
        log.info("downstream tasks scored in %.1f s: %s%s", time.time() - started, _fmt(metrics),
                 f"; FAILED: {', '.join(failed)}" if failed else "")
        return metrics

    def export(self) -> None:
        """RUN/model/ from the model parts, or a sharded layout's final checkpoint
        (trainer/export.py); `export_checked` says how it loads."""
        from trainer.export import export_model  # transformers only at the end of a run

        final = self.ckpt_root / checkpoint_name(self.state.step) if self.dims.sharded else None
        self.export_checked = export_model(self.spec.model, self.parts, self.run_dir / "model",
                                           self.prepared.tokenizer_path, checkpoint=final)

def _peak_mem_gb() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024


def _stopped(verdict: Any, step: int, reason: str | None = None) -> record.Outcome:
    """The outcome of a stop the monitor asked for: "diverged" at `step` when it stopped on a
    divergence or a spike (the shared contract reports render), else "stopped"."""
    kinds = [a.kind for a in verdict.alerts]
    if any(k in DIVERGED_KINDS for k in kinds) or not kinds:  # no alert: a repeated spike episode
        return record.Outcome("diverged", reason or (kinds[0] if kinds else "loss_spike"), diverged_at_step=step)
    return record.Outcome("stopped", reason or kinds[0])


def _fmt(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in metrics.items())


def autocast_without_output_upcast(acc: Any, model: torch.nn.Module) -> None:
    """Keep accelerate's autocast around `model.forward`, drop its `convert_outputs_to_fp32`.

    Under bf16/fp16 accelerate wraps the forward in autocast and then copies every floating
    output to fp32: for a causal LM that is the whole logits tensor (batch x seq x vocab) each
    micro-batch, which the trainer never reads (the loss is already computed in fp32 inside the
    model). Measured: 2 % of a CPU bf16 step (253.5 -> 248.9 ms, bench/ab_trainer_step.py).
    FSDP/TP layouts (their own mixed-precision policy) keep accelerate's wrapper as it is.
    """
    from types import MethodType

    from accelerate.utils import get_mixed_precision_context_manager

    original = getattr(model, "_original_forward", None)
    if not acc.native_amp or original is None or not hasattr(original, "__func__"):
        return
    autocast = get_mixed_precision_context_manager(acc.native_amp, acc.autocast_handler)
    model.forward = MethodType(autocast(original.__func__), model)  # type: ignore[method-assign]
