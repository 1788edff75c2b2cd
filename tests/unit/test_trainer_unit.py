"""Pure parts of the trainer: schedule, anomaly detection, checkpoint manifests and retention,
exactly-once metric filtering, the smoke shrink, FLOPs arithmetic."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from trainer.checkpoint import format as ckpt
from trainer.metric_sinks import JsonlMetrics, filter_new_points, read_jsonl_tolerant
from trainer.model import bits_per_byte, flops_per_token
from trainer.monitor import AnomalyDetector, track_best
from trainer.optim import lr_factor
from validation.spec import AlertsSpec, model_spec


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_lr_warms_up_then_decays_to_min_ratio(schedule: str) -> None:
    factors = [lr_factor(s, 10, 100, schedule, 0.1) for s in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert all(b >= a for a, b in zip(factors[:10], factors[1:10], strict=False))
    assert all(b <= a + 1e-12 for a, b in zip(factors[10:], factors[11:], strict=False))
    end = lr_factor(100, 10, 100, schedule, 0.1)
    assert end == pytest.approx(1.0 if schedule == "constant" else 0.1)


def _feed(det: AnomalyDetector, n: int, loss: float = 2.0, grad: float = 1.0) -> None:
    for i in range(n):
        assert det.observe(i + 1, loss - 0.001 * i, grad).action == "none"


@pytest.mark.parametrize(("policy", "action"), [("alert", "stop"), ("stop", "stop"), ("rollback", "rollback")])
def test_nonfinite_loss_is_p0_and_never_just_alerted(policy: str, action: str) -> None:
    det = AnomalyDetector(AlertsSpec(spike_policy=policy))
    _feed(det, 3)
    verdict = det.observe(4, float("nan"), 1.0)
    assert verdict.action == action and verdict.alerts[0].level == "P0" and verdict.alerts[0].kind == "divergence"
    assert det.observe(5, 1.9, float("inf")).alerts[0].kind == "divergence"


def test_grad_norm_spike_follows_policy_and_does_not_poison_the_mean() -> None:
    det = AnomalyDetector(AlertsSpec(spike_policy="rollback", grad_norm_factor=10.0))
    _feed(det, 20)
    verdict = det.observe(21, 1.98, 50.0)
    assert verdict.action == "rollback" and [a.kind for a in verdict.alerts] == ["grad_norm_spike"]
    assert 50.0 not in det.grads  # the spike stays out of the baseline
    assert det.observe(22, 1.98, 5.0).action == "none"  # 5x is below the factor


def test_loss_spike_and_loss_rising_and_throughput_drop() -> None:
    det = AnomalyDetector(AlertsSpec(spike_policy="alert", loss_rise_steps=5))
    _feed(det, 20)
    spike = det.observe(21, 10.0, 1.0)
    assert [a.kind for a in spike.alerts] == ["loss_spike"] and spike.action == "none"
    kinds = []
    for i in range(10):
        kinds += [a.kind for a in det.observe(30 + i, 2.0 + 0.01 * i, 1.0).alerts]
    assert kinds.count("loss_rising") == 1  # once per rising phase, not every step
    det2 = AnomalyDetector(AlertsSpec(throughput_drop=0.5))
    for i in range(16):  # the first steps of a process are not judged (warm-up)
        assert not det2.observe(i + 1, 2.0, 1.0, tokens_per_s=1000.0).alerts
    drop = det2.observe(17, 2.0, 1.0, tokens_per_s=400.0)
    assert [(a.level, a.kind) for a in drop.alerts] == [("P2", "throughput_drop")]


def test_detector_state_round_trips_through_json() -> None:
    det = AnomalyDetector(AlertsSpec())
    _feed(det, 15)
    state = json.loads(json.dumps(det.state()))
    other = AnomalyDetector(AlertsSpec())
    other.load_state(state)
    assert other.state() == det.state()


def test_early_stopping_counts_evaluations_without_improvement() -> None:
    best, stale = None, 0
    for value in (3.0, 2.5, 2.6, 2.5, 2.4):
        best, stale = track_best(best, stale, value)
    assert (best, stale) == (2.4, 0)
    best, stale = track_best(best, stale, 2.4)
    assert stale == 1


def _fake_checkpoint(root: Path, step: int, eval_metric: float | None = None) -> Path:
    tmp = ckpt.tmp_dir_for(root, step)
    tmp.mkdir(parents=True)
    (tmp / "model.safetensors").write_bytes(b"w" * 64 + bytes([step % 256]))
    (tmp / ckpt.TRAIN_STATE).write_text(json.dumps({"step": step, "eval_metric": eval_metric}))
    ckpt.write_manifest(tmp, step)
    final = root / ckpt.checkpoint_name(step)
    tmp.rename(final)
    return final


def test_manifest_detects_flip_truncation_missing_file_and_missing_manifest(tmp_path: Path) -> None:
    paths = {s: _fake_checkpoint(tmp_path, s) for s in (10, 20, 30, 40, 50)}
    assert all(ckpt.verify_checkpoint(p) is None for p in paths.values())
    data = bytearray((paths[50] / "model.safetensors").read_bytes())
    data[3] ^= 1
    (paths[50] / "model.safetensors").write_bytes(bytes(data))
    (paths[40] / "model.safetensors").write_bytes(b"w")
    (paths[30] / ckpt.MANIFEST).unlink()
    (paths[20] / ckpt.TRAIN_STATE).unlink()
    events: list[tuple[str, str, str]] = []
    found = ckpt.find_resume_checkpoint(tmp_path, lambda *e: events.append(e))
    assert found == paths[10]
    reasons = [e[2] for e in events]
    assert "sha256 mismatch" in reasons[0] and "step_000050" in reasons[0]
    assert "truncated" in reasons[1]
    assert "MANIFEST.json missing" in reasons[2]
    assert "train_state.json missing" in reasons[3]
    assert all(level == "P1" for level, *_ in events)
    assert [e[3] for e in events] == [50, 40, 30, 20]  # each stamped with its checkpoint's step


def test_retention_keeps_last_k_and_best_and_ignores_saves_in_progress(tmp_path: Path) -> None:
    for step, metric in ((10, 3.0), (20, 1.5), (30, 2.0), (40, 2.5), (50, 2.2)):
        _fake_checkpoint(tmp_path, step, metric)
    in_progress = ckpt.tmp_dir_for(tmp_path, 60)
    in_progress.mkdir()
    (tmp_path / "step_000070").mkdir()  # no manifest: not a checkpoint, not touched by retention
    deleted = ckpt.apply_retention(tmp_path, keep_last=2, protect=set())
    assert sorted(p.name for p in deleted) == ["step_000010", "step_000030"]
    assert in_progress.is_dir() and (tmp_path / "step_000070").is_dir()
    assert [s for s, _ in ckpt.valid_checkpoints(tmp_path)] == [50, 40, 20]
    assert ckpt.clean_stale_temporaries(tmp_path) == [in_progress]


def test_filter_new_points_keeps_each_key_step_once() -> None:
    marks = {"train/loss": 5}
    points = [("train/loss", 4, 1.0, 0), ("train/loss", 6, 1.0, 0), ("train/loss", 6, 2.0, 0), ("eval/loss", 6, 3.0, 0)]
    assert filter_new_points(points, marks) == [("train/loss", 6, 1.0, 0), ("eval/loss", 6, 3.0, 0)]
    assert marks == {"train/loss": 6, "eval/loss": 6}


def test_metrics_jsonl_survives_a_partial_last_line_and_drops_repeats(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "key": "train/loss", "value": 2.0}\n{"step": 2, "key": "train/lo')
    sink = JsonlMetrics(path)
    sink.log_metrics(1, {"train/loss": 9.0})
    sink.log_metrics(2, {"train/loss": 1.5})
    sink.flush()
    records, good = read_jsonl_tolerant(path)
    assert good == path.stat().st_size
    assert [(r["step"], r["value"]) for r in records] == [(1, 2.0), (2, 1.5)]


def test_flops_and_bits_per_byte() -> None:
    m = model_spec({"model_type": "llama", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 256})
    n = m.parameter_count()
    norms = 2 * 2 * 64 + 64  # two RMSNorms per layer and the final one: not matmuls
    assert flops_per_token(m, 128) == 6 * (n - norms) + 12 * 2 * 64 * 128
    assert bits_per_byte(math.log(2) * 4.0, 4.0) == pytest.approx(1.0)
    assert math.isnan(bits_per_byte(float("inf"), 4.0))


def test_smoke_spec_shrinks_model_and_keeps_data() -> None:
    from trainer.smoke import smoke_spec
    from validation.spec import ExperimentSpec

    spec = ExperimentSpec.model_validate({
        "name": "big-one", "owner": "someone",
        "hypothesis": {"statement": "A much larger model lowers the held-out loss on the mixture.",
                       "metric": "eval/loss", "direction": "decrease", "min_effect": 0.01, "baseline": "champion"},
        "model": {"model_type": "qwen2", "hidden_size": 1024, "num_layers": 24, "num_heads": 16, "num_kv_heads": 4,
                  "vocab_size": 32000},
        "data": {"sources": [{"name": "code", "path": "data/demo/code.jsonl", "weight": 1.0}], "seq_len": 1024},
        "train": {"token_budget": 10**9, "precision": "fp16", "micro_batch_size": 32},
        "resource": {"gpus_per_node": 8, "nodes": 2, "gpu_type": "h100"},
    })
    small = smoke_spec(spec, tokenizer_vocab=1000)
    assert (small.model.hidden_size, small.model.num_layers, small.model.num_kv_heads) == (64, 2, 2)
    assert small.model.model_type == "qwen2" and small.model.vocab_size == 1024
    assert small.data.seq_len == 64 and small.data.sources == spec.data.sources
    assert small.total_steps(1) == 30 and small.resource.world_size == 1
    assert small.model.parameter_count() < 200_000


def test_smoke_keeps_the_experiments_optimizer_lr_and_schedule() -> None:
    """Reproduced on the old main: smoke forced lr 3e-3 and a constant schedule whatever the
    experiment said (and AdamW: there was no other). It is shrunk in steps, not changed in kind."""
    from trainer.smoke import SMOKE_STEPS, smoke_spec
    from validation.spec import ExperimentSpec

    spec = ExperimentSpec.model_validate({
        "name": "muon-run", "owner": "someone",
        "hypothesis": {"statement": "Muon on the hidden matrices lowers the held-out loss on the mixture.",
                       "metric": "eval/loss", "direction": "decrease", "min_effect": 0.01, "baseline": "champion"},
        "model": {"model_type": "nanogpt", "hidden_size": 256, "num_layers": 6, "num_heads": 4, "vocab_size": 4096},
        "data": {"sources": [{"name": "code", "path": "data/demo/code.jsonl", "weight": 1.0}], "seq_len": 256},
        "train": {"max_steps": 300, "warmup_steps": 60, "lr": 6e-3, "schedule": "linear", "min_lr_ratio": 0.2,
                  "optimizer": {"name": "muon", "lr": 0.05, "momentum": 0.9}},
    })
    small = smoke_spec(spec, tokenizer_vocab=1000)
    assert small.model.model_type == "nanogpt" and small.model.hidden_size == 64
    assert small.train.optimizer == spec.train.optimizer  # Muon with its own lr and momentum
    assert (small.train.lr, small.train.schedule, small.train.min_lr_ratio) == (6e-3, "linear", 0.2)
    assert small.train.warmup_steps == round(60 * SMOKE_STEPS / 300)  # the same share of the run


def test_stall_watchdog_raises_when_no_step_completes() -> None:
    import threading

    from trainer.monitor import StallWatchdog

    fired = threading.Event()
    dog = StallWatchdog(0.05, lambda idle: fired.set())
    try:
        assert fired.wait(10.0)
    finally:
        dog.stop()


def test_a_stopped_stall_watchdog_no_longer_holds_the_trainer() -> None:
    """Its thread holds `on_stall` (a closure over the trainer, its model and optimizer): after
    `stop()` the thread is gone, not merely asked to go, so that a finished trainer is freed at once
    (CI once counted a live model after a run while a busy machine had not yet scheduled it)."""
    import weakref

    from trainer.monitor import StallWatchdog

    class Owner:
        pass

    owner = Owner()
    dog = StallWatchdog(60.0, lambda idle, o=owner: None)
    gone = weakref.ref(owner)
    del owner
    dog.stop()
    assert not dog._thread.is_alive()
    del dog
    assert gone() is None


def test_disk_full_during_checkpoint_keeps_previous_state_and_reports(tmp_path: Path) -> None:
    """A file-size limit makes the write fail with EFBIG (as a full disk gives ENOSPC): the
    save is reported, its temporary directory removed, and the previous checkpoint still resumes."""
    import resource
    import signal

    import torch

    from trainer.checkpoint.unsharded import Snapshot, save_snapshot
    from trainer.checkpoint.writer import CheckpointWriter

    events: list[tuple[str, str, str]] = []
    writer = CheckpointWriter(tmp_path, keep_last=2, async_save=False, on_event=lambda *e: events.append(e))

    def save(step: int, numel: int) -> None:
        snap = Snapshot(step, {"w": torch.zeros(numel)}, {"state": {}}, {"scheduler": {}}, {"step": step})
        save_snapshot(writer, snap, validator=lambda d, s: None)

    save(1, 16)
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, old_limit[1]))
    try:
        save(2, 1_000_000)  # 4 MB of weights
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert [o.ok for o in writer.outcomes] == [True, False]
    assert events and events[0][1] == "checkpoint_failed" and "File too large" in events[0][2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000001"]
    assert ckpt.find_resume_checkpoint(tmp_path) == tmp_path / "step_000001"


def test_the_writer_runs_saves_in_its_thread_publishes_and_rejects(tmp_path: Path) -> None:
    """Both layouts' one writer: a job runs in the `checkpoint-writer` thread; publish writes the
    manifest and renames into place (replacing an older save of the same step); reject removes it."""
    import threading
    import time

    from trainer.checkpoint.writer import CheckpointWriter

    events: list[tuple[str, ...]] = []
    writer = CheckpointWriter(tmp_path, keep_last=2, async_save=True, on_event=lambda *e: events.append(e))
    threads: set[str] = set()

    def job(step: int, body: bytes, valid: bool = True) -> Callable[[], None]:
        def run() -> None:
            threads.add(threading.current_thread().name)
            started = time.perf_counter()
            tmp = ckpt.tmp_dir_for(tmp_path, step)
            tmp.mkdir()
            (tmp / ckpt.MODEL).write_bytes(body)
            ckpt.write_train_state(tmp, {"step": step})
            if valid:
                writer.publish(step, tmp, started)
            else:
                writer.reject(step, tmp, "forward pass differs", started)
        return run

    for step, body, valid in ((10, b"old", True), (10, b"new", True), (20, b"w", True), (30, b"x", False)):
        writer.submit(job(step, body, valid))
    writer.wait()
    assert threads == {"checkpoint-writer"}
    assert [(o.step, o.ok) for o in writer.outcomes] == [(10, True), (10, True), (20, True), (30, False)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000010", "step_000020"]
    assert (tmp_path / "step_000010" / ckpt.MODEL).read_bytes() == b"new"
    assert all(ckpt.verify_checkpoint(p) is None for _, p in ckpt.valid_checkpoints(tmp_path))
    assert [e[:2] for e in events] == [("P1", "checkpoint_invalid")] and "step 30" in events[0][2]


def test_slow_steps_are_a_fault_a_test_can_ask_for_and_a_real_run_never_gets() -> None:
    """`TRAINER_FAULT_STEP_SECONDS`: every step as slow as a busy machine's, so that a cancel sent
    at an early eval (a pruned sweep trial) lands mid-run however fast this machine is."""
    import time

    from trainer.faults import FaultPlan, InjectedFaults

    assert type(FaultPlan.from_env(0, {})) is FaultPlan
    plan = FaultPlan.from_env(0, {"TRAINER_FAULT_STEP_SECONDS": "0.05"})
    assert isinstance(plan, InjectedFaults) and plan.step_seconds == 0.05
    started = time.perf_counter()
    plan.after_step(1, lambda: None)
    assert time.perf_counter() - started >= 0.05
