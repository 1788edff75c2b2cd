"""The training loop: one `Trainer` per rank, driven by the resolved spec only.

Data position is a pure function of the step (`MixtureBatcher.batch(step, micro_step)`),
so resuming is "load the checkpoint, continue at its step": no dataloader state exists.

Two tiny collectives per optimizer step (none on one process): the global count of
supervised tokens at step start (the loss is a mean over the whole global batch), and
[loss, out-of-memory flag, SIGTERM flag] before the last micro-batch's backward (the one
that synchronises gradients), so every rank takes the same decision (retry with a
smaller micro batch, save and exit) without leaving a peer stuck in a gradient all-reduce.

Fault injection for tests (all 1-based optimizer step numbers, fired once per process):
  TRAINER_INJECT_OOM_AT_STEP=k   [TRAINER_INJECT_OOM_RANK=r]  raise an out-of-memory error
  TRAINER_INJECT_NAN_AT_STEP=k   make the loss NaN
  TRAINER_FAULT_SIGKILL_AT_STEP=k  SIGKILL this process after step k (rank TRAINER_FAULT_RANK, default 0)
  TRAINER_FAULT_SIGTERM_AT_STEP=k  send SIGTERM to this process after step k
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import platform
import resource
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer import checkpoint as ckpt
from trainer.model import bits_per_byte, build_model, flops_per_token, hf_config, parameter_count, peak_flops
from trainer.monitor import Alert, AlertLog, AnomalyDetector, StallWatchdog, track_best
from trainer.optim import build_optimizer, build_scheduler
from trainer.tracking import FanoutSink, JsonlMetrics, MlflowSink, NullSink
from validation.errors import TrainingError

log = logging.getLogger("trainer")

EXIT_PREEMPTED = 143  # 128 + SIGTERM: orchestration resumes the run
EXIT_FAILED = TrainingError.exit_code


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


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    oom: bool = False
    sigterm: bool = False
    rows: dict[str, int] = field(default_factory=dict)


def _is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def env_fingerprint(world_size: int) -> dict[str, Any]:
    import accelerate
    import torch
    import transformers

    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    fp: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "world_size": world_size,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "cuda": torch.version.cuda or "none",
    }
    with contextlib.suppress(Exception):
        import mlflow

        fp["mlflow"] = mlflow.__version__
    return fp


def setup_logging(run_dir: Path, rank: int) -> None:
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
        console.setLevel(os.environ.get("TRAINER_CONSOLE_LEVEL", "INFO").upper())
        console.addFilter(lambda record: not getattr(record, "per_step", False))
        root.addHandler(console)
    root.propagate = False


class Trainer:
    """Builds everything from the spec, then `run()` trains, evaluates, checkpoints and exports."""

    def __init__(
        self,
        spec: Any,
        run_dir: Path,
        data_dir: Path,
        tracking_uri: str | None = None,
        overfit_one_batch: bool = False,
        prepared: Any = None,
    ):
        import torch
        from accelerate import Accelerator

        self.t_start = time.time()
        self.spec = spec
        self.run_dir = Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.overfit = overfit_one_batch
        tr = spec.train
        if tr.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True, warn_only=True)
            torch.backends.cudnn.benchmark = False
        precision = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[tr.precision]
        if precision == "fp16" and not torch.cuda.is_available():
            raise TrainingError("train.precision fp16 needs a GPU; use bf16 (CPUs with avx512_bf16) or fp32")
        layout = spec.parallel_layout()
        if layout.tp > 1 or layout.pp > 1 or layout.fsdp:
            # The planner may choose these for large models; this execution layer implements
            # data parallelism only, and says so before touching a device.
            raise TrainingError(
                f"parallel layout dp={layout.dp} tp={layout.tp} pp={layout.pp} fsdp={layout.fsdp} is not supported "
                "by this trainer (data parallelism only); use a model that fits one device per process"
            )
        self.accelerator = Accelerator(mixed_precision=precision)
        acc = self.accelerator
        self.rank, self.world = acc.process_index, acc.num_processes
        self.is_main = acc.is_main_process
        self.device = acc.device
        setup_logging(self.run_dir, self.rank)

        # ---- data
        from trainer.data import MixtureBatcher, PreparedData

        self.prepared = prepared if prepared is not None else PreparedData.open(Path(data_dir), verify=self.is_main)
        self.MixtureBatcher = MixtureBatcher
        self.seq_len = spec.data.seq_len
        if self.prepared.vocab_size > spec.model.vocab_size:
            raise TrainingError(
                f"tokenizer has {self.prepared.vocab_size} tokens but model.vocab_size is {spec.model.vocab_size}")

        # ---- model, seeded identically on every rank
        torch.manual_seed(tr.seed)
        init_from = Path(spec.model.init_from) if spec.model.init_from else None
        if init_from is not None and not init_from.is_absolute():  # relative to the repository, like data paths
            init_from = Path(__file__).resolve().parent.parent / init_from
        self.raw_model = build_model(spec.model, init_from).to(self.device)
        self.n_params = parameter_count(self.raw_model)
        self.flops_per_token = flops_per_token(spec.model, self.seq_len, self.n_params)
        self.peak_flops = peak_flops(spec.resource, torch.cuda.is_available(), torch.get_num_threads())
        self.optimizer = build_optimizer(self.raw_model, tr)
        self.total_steps = spec.total_steps(self.world)
        self.scheduler = build_scheduler(self.optimizer, tr, self.total_steps)
        model = torch.compile(self.raw_model) if tr.compile else self.raw_model
        self.model, self.optimizer = acc.prepare(model, self.optimizer)
        self._seed_rank()

        # ---- state, sinks, monitoring
        self.state = TrainState(
            micro_batch_size=tr.micro_batch_size,
            grad_accum_steps=tr.grad_accum_steps,
            world_size=self.world,
            spec_hash=spec.spec_hash(),
            data_version=self.prepared.version,
        )
        self.identity = self._read_identity()
        self.sink: Any = NullSink()
        if self.is_main:
            sinks: list[Any] = [JsonlMetrics(self.run_dir / "metrics.jsonl")]
            if tracking_uri and tracking_uri.lower() not in ("none", "disabled", "off"):
                sinks.append(MlflowSink(tracking_uri, spec.name, self.run_dir, run_name=self.identity.get("run_id")))
            self.sink = FanoutSink(*sinks)
        self.alerts = AlertLog(self.run_dir / "alerts.jsonl" if self.is_main else None, self.sink, self.rank)
        self.detector = AnomalyDetector(spec.alerts)
        self.ckpt_root = self.run_dir / "checkpoints"
        self.checkpointer = ckpt.Checkpointer(
            self.ckpt_root, tr.keep_last, tr.async_checkpoint, self._validate_checkpoint, self._on_event)
        self.stalls: list[float] = []
        self.ckpt_write_s: list[float] = []
        self.resumed_from: str | None = None
        self._sigterm = False
        self._injected: set[str] = set()
        self.batcher = self._make_batcher()
        self.step_losses: list[tuple[int, float]] = []
        self.step_done_at: list[float] = []  # perf_counter after each step (benchmarks: windowed tokens/s)

    # ------------------------------------------------------------------ setup helpers

    def _seed_rank(self) -> None:
        import random

        import numpy as np
        import torch

        seed = self.spec.train.seed + self.rank
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    def _make_batcher(self) -> Any:
        return self.MixtureBatcher(
            self.prepared, self.spec.data.weights(), self.seq_len, self.state.micro_batch_size,
            self.state.grad_accum_steps, self.spec.train.seed, self.rank, self.world)

    def _read_identity(self) -> dict[str, Any]:
        path = self.run_dir / "identity.json"
        if path.is_file():
            with contextlib.suppress(ValueError, OSError):
                return json.loads(path.read_text())
        return {}

    def _on_event(self, level: str, kind: str, message: str) -> None:
        self.alerts.emit(Alert(level, kind, message, self.state.step))

    def _barrier(self) -> None:
        if self.world > 1:
            self.accelerator.wait_for_everyone()

    def _all_reduce(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return values
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def _broadcast(self, obj: Any) -> Any:
        if self.world == 1:
            return obj
        from accelerate.utils import broadcast_object_list

        box = [obj]
        broadcast_object_list(box, from_process=0)
        return box[0]

    def _tags(self) -> dict[str, str]:
        spec = self.spec
        tags = {f"pipeline.{k}": str(v) for k, v in self.identity.items() if v is not None}
        tags.setdefault("pipeline.spec_hash", spec.spec_hash())
        tags.setdefault("pipeline.data_version", self.prepared.version)
        tags.setdefault("pipeline.experiment", spec.name)
        tags["pipeline.hypothesis"] = spec.hypothesis.statement[:4000]
        tags["pipeline.hypothesis_metric"] = spec.hypothesis.metric
        tags["pipeline.baseline"] = spec.hypothesis.baseline
        tags.update({f"env.{k}": str(v) for k, v in env_fingerprint(self.world).items()})
        return tags

    def _params(self) -> dict[str, Any]:
        spec = self.spec
        out: dict[str, Any] = {f"model.{k}": v for k, v in spec.model.model_dump().items()}
        out |= {f"train.{k}": v for k, v in spec.train.model_dump().items()}
        out |= {"data.seq_len": spec.data.seq_len, "data.weights": json.dumps(spec.data.weights()),
                "world_size": self.world, "n_params": self.n_params, "total_steps": self.total_steps}
        return out

    # ------------------------------------------------------------------ checkpoints

    def _probe(self) -> tuple[Any, Any]:
        import torch

        n = min(self.seq_len, 64)
        ids = (torch.arange(n, device=self.device) * 7 % self.spec.model.vocab_size).unsqueeze(0)
        pos = torch.arange(n, device=self.device).unsqueeze(0)
        return ids, pos

    def _probe_logits(self, model: Any) -> Any:
        import torch

        ids, pos = self._probe()
        was_training = model.training
        model.eval()
        with torch.no_grad(), self.accelerator.autocast():
            out = model(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
        model.train(was_training)
        return out

    def _validate_checkpoint(self, directory: Path, snap: ckpt.Snapshot) -> str | None:
        """Load the written weights into a fresh model; its forward pass must equal the live one's."""
        import torch

        from trainer.model import load_weights

        with torch.random.fork_rng(devices=[]):  # random init must not move the training RNG
            from transformers import AutoModelForCausalLM

            fresh = AutoModelForCausalLM.from_config(
                hf_config(self.spec.model), attn_implementation=self.spec.model.attn_implementation)
        try:
            load_weights(fresh, directory)
        except Exception as exc:  # noqa: BLE001 - any load failure makes the checkpoint invalid
            return f"weights do not load: {exc}"
        fresh.to(self.device)
        got = self._probe_logits(fresh)
        want = snap.extra["probe_logits"]
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
            return f"forward pass differs after reload (max abs diff {float((got - want).abs().max()):.3g})"
        return None

    def _model_state(self, copy: bool) -> dict[str, Any]:
        state = self.raw_model.state_dict()
        if self.raw_model.config.tie_word_embeddings:
            state = {k: v for k, v in state.items() if k != "lm_head.weight"}
        return ckpt.to_cpu(state, copy)

    def save_checkpoint(self) -> None:
        """Every rank: write its RNG; rank 0: snapshot and write (in the background when async)."""
        t0 = time.perf_counter()
        step = self.state.step
        ckpt.write_rank_rng(self.ckpt_root, step, self.rank)
        self._barrier()
        if self.is_main:
            self.sink.flush()  # everything up to this step is recorded before it can be resumed from
            self.state.mlflow_run_id = self.sink.run_id
            self.state.detector = self.detector.state()
            copy = self.spec.train.async_checkpoint
            scheduler_state: dict[str, Any] = {"scheduler": self.scheduler.state_dict()}
            if self.accelerator.scaler is not None:
                scheduler_state["scaler"] = self.accelerator.scaler.state_dict()
            snap = ckpt.Snapshot(
                step=step,
                model_state=self._model_state(copy),
                optimizer_state=ckpt.to_cpu(self.optimizer.state_dict(), copy),
                scheduler_state=scheduler_state,
                train_state=self.state.__dict__.copy() | {"saved_unix": time.time()},
                extra={"probe_logits": self._probe_logits(self.raw_model)},
            )
            self.checkpointer.save(snap)
        stall = time.perf_counter() - t0
        self.stalls.append(stall)
        log.info("checkpoint step %d: training stalled %.3fs (%s)", step, stall,
                 "async" if self.spec.train.async_checkpoint else "sync")

    def wait_checkpoints(self) -> None:
        if self.is_main:
            self.checkpointer.wait()
            self.ckpt_write_s = [o.write_s for o in self.checkpointer.outcomes if o.ok]
        self.alerts.drain_to_sink()
        self._barrier()

    def load_checkpoint(self, path: Path) -> None:
        data = ckpt.load_checkpoint(path, self.rank)
        missing, unexpected = self.raw_model.load_state_dict(
            {k: v.to(self.device) for k, v in data["model"].items()}, strict=False)
        missing = [k for k in missing if k != "lm_head.weight"]
        assert not missing and not unexpected, (missing, unexpected)
        self.optimizer.load_state_dict(data["optimizer"])
        self.scheduler.load_state_dict(data["scheduler"]["scheduler"])
        if "scaler" in data["scheduler"] and self.accelerator.scaler is not None:
            self.accelerator.scaler.load_state_dict(data["scheduler"]["scaler"])
        saved = data["train_state"]
        known = set(TrainState.__dataclass_fields__)
        mlflow_run_id = self.state.mlflow_run_id
        self.state = TrainState(**{k: v for k, v in saved.items() if k in known})
        self.state.world_size = self.world
        self.state.mlflow_run_id = self.state.mlflow_run_id or mlflow_run_id
        if saved.get("world_size", self.world) != self.world:
            # Same global batch on a different number of ranks: rescale the per-rank micro batch.
            global_rows = saved["micro_batch_size"] * saved["grad_accum_steps"] * saved["world_size"]
            self.state.micro_batch_size, self.state.grad_accum_steps = self.spec.train.micro_batch_size, max(
                1, global_rows // (self.spec.train.micro_batch_size * self.world))
        self.detector.load_state(self.state.detector)
        if data["rng"] is not None:
            ckpt.set_rng_state(data["rng"])
        self.batcher = self._make_batcher()

    def resume(self) -> None:
        if self.is_main:
            removed = ckpt.clean_stale_temporaries(self.ckpt_root)
            for path in removed:
                log.warning("removed unfinished checkpoint %s", path)
        found = ckpt.find_resume_checkpoint(self.ckpt_root, self._on_event) if self.is_main else None
        found = self._broadcast(str(found) if found else None)
        if found:
            self.load_checkpoint(Path(found))
            self.resumed_from = found
            log.info("resumed from %s at step %d", found, self.state.step)
        self._barrier()

    # ------------------------------------------------------------------ one optimizer step

    def _tensors(self, batch: dict[str, Any]) -> dict[str, Any]:
        import torch

        return {k: torch.from_numpy(batch[k]).to(self.device, non_blocking=True)
                for k in ("input_ids", "labels", "position_ids")}

    def _batch_index(self, s: int) -> int:
        return 0 if self.overfit else s + self.state.data_offset

    def _maybe_inject(self, kind: str, s: int) -> bool:
        env = {"oom": "TRAINER_INJECT_OOM_AT_STEP", "nan": "TRAINER_INJECT_NAN_AT_STEP"}[kind]
        at = _env_int(env)
        rank_ok = kind != "oom" or self.rank == (_env_int("TRAINER_INJECT_OOM_RANK") or 0)
        if at is not None and s + 1 == at and kind not in self._injected and rank_ok:
            self._injected.add(kind)
            return True
        return False

    def train_step(self, s: int) -> StepResult:
        """Forward/backward over the accumulation micro-batches of step `s` (0-based), then AdamW.

        The loss is the mean over every supervised token of the global batch (all micro-batches
        of all ranks), so 1 rank x accum 2, 2 ranks x accum 1, and a micro batch halved after an
        out-of-memory error all optimise the same objective. Each micro-batch's mean loss is
        weighted by its token count over the global count (one small all-reduce at step start).
        """
        import torch

        acc, model = self.accelerator, self.model
        accum = self.state.grad_accum_steps
        batches = [self.batcher.batch(self._batch_index(s), m) for m in range(accum)]
        counts = [int((b["labels"][:, 1:] != -100).sum()) for b in batches]
        (global_tokens,) = self._all_reduce([float(sum(counts))])
        global_tokens = max(global_tokens, 1.0)
        rows: dict[str, int] = {}
        for b in batches:
            for src in b["sources"]:
                rows[src] = rows.get(src, 0) + 1
        contributions: list[Any] = []
        oom = False
        last = None
        try:
            for m, batch in enumerate(batches):
                inputs = self._tensors(batch)
                if m == 0 and self._maybe_inject("oom", s):
                    raise torch.OutOfMemoryError("injected out of memory (TRAINER_INJECT_OOM_AT_STEP)")
                sync_ctx = acc.no_sync(model) if m < accum - 1 and self.world > 1 else contextlib.nullcontext()
                with sync_ctx:
                    out = model(**inputs, use_cache=False)
                    loss = out.loss
                    if m == accum - 1 and self._maybe_inject("nan", s):
                        loss = loss * float("nan")
                    if counts[m]:
                        part = loss * (counts[m] / global_tokens)
                    else:  # no supervised token: contributes nothing, still joins the gradient sync
                        part = out.logits.sum() * 0.0
                    if m < accum - 1:
                        acc.backward(part * self.world)
                    else:
                        last = part
                contributions.append(part.detach().float())
                del out
        except Exception as exc:
            if not _is_oom(exc):
                raise
            oom, contributions, last = True, [], None
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        local_loss = float(torch.stack(contributions).sum()) if contributions else 0.0
        loss_value, any_oom, any_term = self._all_reduce([local_loss, float(oom), float(self._sigterm)])
        if any_oom:
            self.optimizer.zero_grad(set_to_none=True)
            return StepResult(float("nan"), float("nan"), oom=True, sigterm=any_term > 0)
        acc.backward(last * self.world)  # DDP averages over ranks; the world factor makes it a sum
        max_norm = self.spec.train.grad_clip or float("inf")
        grad_norm = float(acc.clip_grad_norm_(self.model.parameters(), max_norm))
        if math.isfinite(loss_value) and math.isfinite(grad_norm):
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(loss_value, grad_norm, sigterm=any_term > 0, rows=rows)

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

    def rollback(self, s: int) -> bool:
        """Restore the last good checkpoint and skip the batches around the spike (PaLM)."""
        self.wait_checkpoints()
        st = self.state
        if st.rollbacks >= self.spec.alerts.max_rollbacks:
            self._on_event("P0", "rollback_limit", f"{st.rollbacks} rollbacks already; stopping")
            return False
        path = self.checkpointer.last_valid() if self.is_main else None
        path = self._broadcast(str(path) if path else None)
        if path is None:
            self._on_event("P0", "rollback_impossible", "no valid checkpoint to roll back to; stopping")
            return False
        rollbacks, old_offset = st.rollbacks, st.data_offset
        self.load_checkpoint(Path(path))
        skip = self.spec.alerts.rollback_skip_batches
        self.state.rollbacks = rollbacks + 1
        self.state.data_offset = old_offset + (s + 1 - self.state.step) + skip
        self._on_event("P1", "rollback",
                       f"rolled back to {Path(path).name} after step {s + 1}; skipping {skip} batches "
                       f"(data offset {self.state.data_offset}); metrics of repeated steps are not re-logged")
        return True

    # ------------------------------------------------------------------ evaluation

    def evaluate(self) -> dict[str, float]:
        import torch

        from trainer.data import eval_batches

        model = self.raw_model
        model.eval()
        out: dict[str, float] = {}
        weights = self.spec.data.weights()
        agg_loss = agg_bpb = agg_w = 0.0
        bs = self.spec.train.micro_batch_size
        with torch.no_grad(), self.accelerator.autocast():
            for source in self.prepared.sources:
                loss_sum = count = 0.0
                for i, batch in enumerate(eval_batches(self.prepared, source, self.seq_len, bs, self.spec.train.eval_batches)):
                    if i % self.world != self.rank:
                        continue
                    inputs = self._tensors(batch)
                    n = float((inputs["labels"][:, 1:] != -100).sum())
                    if n == 0:
                        continue
                    loss = model(**inputs, use_cache=False).loss.float()
                    loss_sum += float(loss) * n
                    count += n
                loss_sum, count = self._all_reduce([loss_sum, count])
                if count == 0:
                    continue
                loss = loss_sum / count
                bpb = bits_per_byte(loss, self.prepared.bytes_per_token(source))
                out[f"eval/{source}/loss"] = loss
                out[f"eval/{source}/bpb"] = bpb
                w = weights.get(source, 0.0)
                if w > 0:
                    agg_loss, agg_bpb, agg_w = agg_loss + w * loss, agg_bpb + w * bpb, agg_w + w
        if agg_w:
            # Mixture-weighted: the objective the model is trained for, independent of eval set sizes.
            out["eval/loss"] = agg_loss / agg_w
            out["eval/bpb"] = agg_bpb / agg_w
        model.train()
        return out

    def _after_eval(self, metrics: dict[str, float]) -> bool:
        """Track the best eval loss; True when early stopping says stop."""
        st = self.state
        value = metrics.get("eval/loss")
        if value is None or not math.isfinite(value):
            return False
        st.eval_metric = value
        best, st.evals_without_improvement = track_best(st.best_metric, st.evals_without_improvement, value)
        if best != st.best_metric:
            st.best_metric, st.best_step = best, st.step
        patience = self.spec.train.early_stopping_patience
        return bool(patience) and st.evals_without_improvement >= patience

    # ------------------------------------------------------------------ the run

    def _peak_mem_gb(self) -> float:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.max_memory_allocated() / 1e9
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024

    def _handle_sigterm(self, signum: int, frame: Any) -> None:
        self._sigterm = True

    def _faults_after_step(self) -> None:
        step = self.state.step
        if _env_int("TRAINER_FAULT_SIGKILL_AT_STEP") == step and self.rank == (_env_int("TRAINER_FAULT_RANK") or 0):
            # Between checkpoints: a save still in flight finishes first, so the test knows which one survives.
            self.checkpointer.wait()
            self.sink.flush()
            for h in logging.getLogger("trainer").handlers:
                h.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if _env_int("TRAINER_FAULT_SIGTERM_AT_STEP") == step and "sigterm" not in self._injected:
            self._injected.add("sigterm")
            os.kill(os.getpid(), signal.SIGTERM)

    def run(self) -> tuple[dict[str, Any], int]:
        """Train to the end (or a stop), then evaluate, export and write result.json. Returns (result, exit code)."""
        tr = self.spec.train
        previous = signal.signal(signal.SIGTERM, self._handle_sigterm) if _main_thread() else None
        self.resume()
        if self.is_main:
            self.state.mlflow_run_id = self.sink.run_id
            self.sink.set_tags(self._tags())
            if self.state.step == 0:
                self.sink.log_params(self._params())
            self.sink.flush()
        watchdog = StallWatchdog(self.spec.alerts.stall_seconds, lambda idle: self._on_event(
            "P0", "stall", f"no step completed for {idle:.0f}s"))
        status, stop_reason, error = "finished", "max_steps", None
        exit_code = 0
        window: dict[str, Any] = {"t": 0.0, "tokens": 0, "rows": {}, "steps": 0}
        last: dict[str, float] = {}
        tokens_per_step = lambda: self.state.micro_batch_size * self.state.grad_accum_steps * self.world * self.seq_len  # noqa: E731
        log.info("training %s: %d params, %d steps, world %d, micro %d x accum %d, seq %d, precision %s",
                 self.spec.name, self.n_params, self.total_steps, self.world, self.state.micro_batch_size,
                 self.state.grad_accum_steps, self.seq_len, tr.precision)
        try:
            while self.state.step < self.total_steps:
                s = self.state.step
                t0 = time.perf_counter()
                res = self.train_step(s)
                if res.oom:
                    self._oom_fallback(s)
                    if res.sigterm:
                        self._sigterm = True
                    continue
                dt = time.perf_counter() - t0
                self.state.step = s + 1
                self.state.tokens += tokens_per_step()
                watchdog.beat()
                self.step_losses.append((s + 1, res.loss))
                log.info("step=%d loss=%r grad_norm=%r lr=%r", s + 1, res.loss, res.grad_norm,
                         self.scheduler.get_last_lr()[0], extra={"per_step": True})
                window["t"] += dt
                window["tokens"] += tokens_per_step()
                window["steps"] += 1
                for k, v in res.rows.items():
                    window["rows"][k] = window["rows"].get(k, 0) + v
                tps_step = tokens_per_step() / dt if dt > 0 else None
                verdict = self.detector.observe(s + 1, res.loss, res.grad_norm, tps_step if s > 2 else None)
                for alert in verdict.alerts:
                    self.alerts.emit(alert)
                if verdict.action == "rollback":
                    if not self.rollback(s):
                        status, stop_reason = "stopped", "rollback_failed"
                        break
                    continue
                if verdict.action == "stop":
                    status, stop_reason = "stopped", verdict.alerts[0].kind
                    break
                if (s + 1) % tr.log_interval == 0 or s + 1 == self.total_steps:
                    last = self._log_window(s + 1, res, window)
                    window = {"t": 0.0, "tokens": 0, "rows": {}, "steps": 0}
                stop_early = False
                if (s + 1) % tr.eval_interval == 0 and s + 1 < self.total_steps:
                    metrics = self.evaluate()
                    self.sink.log_metrics(s + 1, metrics)
                    stop_early = self._after_eval(metrics)
                    log.info("eval step %d: %s", s + 1, _fmt(metrics))
                if res.sigterm or self._sigterm:
                    self.save_checkpoint()
                    self.wait_checkpoints()
                    self._on_event("P2", "preempted", f"SIGTERM: checkpoint saved at step {s + 1}; exiting {EXIT_PREEMPTED}")
                    self.alerts.drain_to_sink()
                    self.sink.close("preempted")
                    watchdog.stop()
                    return {"status": "preempted", "steps": self.state.step}, EXIT_PREEMPTED
                if (s + 1) % tr.checkpoint_interval == 0 and s + 1 < self.total_steps:
                    self.save_checkpoint()
                self.alerts.drain_to_sink()
                if (s + 1) % tr.log_interval == 0:
                    self.sink.flush(wait=False)
                self._faults_after_step()
                self.step_done_at.append(time.perf_counter())
                if stop_early:
                    stop_reason = "early_stopping"
                    self._on_event("P2", "early_stopping",
                                   f"eval/loss did not improve for {self.state.evals_without_improvement} evaluations")
                    break
        except TrainingError as exc:
            status, stop_reason, error, exit_code = "failed", "error", str(exc), EXIT_FAILED
            self._on_event("P0", "training_error", str(exc))
        finally:
            watchdog.stop()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

        final_metrics: dict[str, float] = {}
        if status != "failed":
            if status == "finished":
                self.save_checkpoint()
            self.wait_checkpoints()
            final_metrics = self.evaluate()
            self.sink.log_metrics(self.state.step, final_metrics)
            if status == "finished":
                self._after_eval(final_metrics)
            if self.is_main:
                self.export()
        else:
            self.wait_checkpoints()
        if status == "stopped":
            exit_code = EXIT_FAILED
        final_metrics |= {k: last[k] for k in ("train/loss", "perf/tokens_per_s", "perf/mfu", "perf/peak_mem_gb") if k in last}
        if "train/loss" not in final_metrics and self.step_losses:
            final_metrics["train/loss"] = self.step_losses[-1][1]
        log.info("param_checksum=%s rank=%d", self.param_checksum(), self.rank)
        result = self._result(status, stop_reason, error, final_metrics)
        self.alerts.drain_to_sink()
        if self.is_main:
            self.sink.close(status)
            result["mlflow_run_id"] = self.sink.run_id
            ckpt.write_json_atomic(self.run_dir / "result.json", result)
        self._barrier()
        return result, exit_code

    def _log_window(self, step: int, res: StepResult, window: dict[str, Any]) -> dict[str, float]:
        sources = list(self.prepared.sources)
        counts = self._all_reduce([float(window["rows"].get(src, 0)) for src in sources])
        total_rows = sum(counts) or 1.0
        tps = window["tokens"] / window["t"] if window["t"] > 0 else 0.0
        metrics = {
            "train/loss": res.loss,
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/grad_norm": res.grad_norm,
            "perf/tokens_per_s": tps,
            "perf/mfu": tps * self.flops_per_token / (self.peak_flops * self.world),
            "perf/step_time_s": window["t"] / max(1, window["steps"]),
            "perf/peak_mem_gb": self._peak_mem_gb(),
        }
        metrics |= {f"data/mix/{src}": c / total_rows for src, c in zip(sources, counts, strict=True)}
        self.sink.log_metrics(step, metrics)
        log.info("step %d/%d %s", step, self.total_steps, _fmt(metrics))
        return metrics

    def param_checksum(self) -> str:
        """sha256 of every parameter's bytes: equal on all ranks when data parallelism is correct."""
        import hashlib

        digest = hashlib.sha256()
        for name, param in sorted(self.raw_model.named_parameters()):
            digest.update(name.encode())
            digest.update(param.detach().float().cpu().numpy().tobytes())
        return digest.hexdigest()[:16]

    def export(self) -> None:
        """RUN/model/: safetensors + config.json + tokenizer.json, for the registry."""
        out = self.run_dir / "model"
        tmp = self.run_dir / ".model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.raw_model.save_pretrained(tmp, safe_serialization=True)
        shutil.copy2(self.prepared.tokenizer_path, tmp / "tokenizer.json")
        shutil.rmtree(out, ignore_errors=True)
        os.rename(tmp, out)

    def _result(self, status: str, stop_reason: str, error: str | None, final_metrics: dict[str, float]) -> dict[str, Any]:
        st = self.state
        stalls = sorted(self.stalls)
        return {
            "status": status,
            "stop_reason": stop_reason,
            "error": error,
            "reason": error or stop_reason,
            "mlflow_run_id": self.sink.run_id,
            "experiment": self.spec.name,
            "steps": st.step,
            "total_steps": self.total_steps,
            "tokens": st.tokens,
            "final_metrics": final_metrics,
            "best_eval_loss": st.best_metric,
            "best_step": st.best_step,
            "env": env_fingerprint(self.world),
            "alerts": self.alerts.count,
            "wall_s": round(time.time() - self.t_start, 3),
            "spec_hash": st.spec_hash,
            "data_version": st.data_version,
            "world_size": self.world,
            "micro_batch_size": st.micro_batch_size,
            "grad_accum_steps": st.grad_accum_steps,
            "oom_fallbacks": st.oom_fallbacks,
            "rollbacks": st.rollbacks,
            "resumed_from": self.resumed_from,
            "n_params": self.n_params,
            "flops_per_token": self.flops_per_token,
            "checkpoint": {
                "mode": "async" if self.spec.train.async_checkpoint else "sync",
                "saves": len(stalls),
                "stall_s_median": stalls[len(stalls) // 2] if stalls else None,
                "write_s_median": sorted(self.ckpt_write_s)[len(self.ckpt_write_s) // 2] if self.ckpt_write_s else None,
            },
            "model_dir": str(self.run_dir / "model") if status != "failed" else None,
        }


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _fmt(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in metrics.items())
