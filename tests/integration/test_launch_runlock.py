"""One writer per run directory (`trainer.runlock`) and exactly-once metric marks under racing
writers, with real processes (fast: no torch, no accelerate)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from trainer.metric_sinks import JsonlMetrics
from trainer.runlock import RunDirBusy, acquire_rank_lock, live_ranks

HOLDER = """
import sys, time
from trainer.runlock import join_job
join_job(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


def _hold(run_dir: Path, rank: int = 0) -> subprocess.Popen[str]:
    env = dict(os.environ, RANK=str(rank), PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_live_holder_refuses_a_second_writer_and_the_kernel_frees_the_lock_on_death(tmp_path):
    holder = _hold(tmp_path, rank=0)
    try:
        ranks = live_ranks(tmp_path)
        assert [r["pid"] for r in ranks] == [holder.pid] and ranks[0]["rank"] == 0
        with pytest.raises(RunDirBusy, match=rf"rank 0 of another job is alive \(pid {holder.pid} on "):
            acquire_rank_lock(tmp_path, 0, wait_s=0.3)
        acquire_rank_lock(tmp_path, 1, wait_s=0.3).release()  # other ranks' locks are free
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert live_ranks(tmp_path) == []  # released by the kernel, no stale pid file to clean
    acquire_rank_lock(tmp_path, 0, wait_s=0.3).release()


def test_the_same_process_may_join_twice(tmp_path):
    first = acquire_rank_lock(tmp_path, 3)
    assert acquire_rank_lock(tmp_path, 3, wait_s=0.1) is first
    first.release()


def _writer(path: str, seed: int) -> None:
    import random

    rng = random.Random(seed)
    sink = JsonlMetrics(Path(path))
    for step in range(1, 301):
        sink.log_metrics(step, {"train/loss": float(step), "eval/loss": float(-step)})
        if rng.random() < 0.3:
            sink.flush()
            time.sleep(rng.random() / 500)
    sink.close("finished")


def test_two_racing_writers_record_every_point_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    ctx = mp.get_context("spawn")
    writers = [ctx.Process(target=_writer, args=(str(path), seed)) for seed in (1, 2, 3)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(60)
        assert w.exitcode == 0
    points = [json.loads(line) for line in path.read_text().splitlines()]
    counts = Counter((p["key"], p["step"]) for p in points)
    assert max(counts.values()) == 1, [k for k, c in counts.items() if c > 1][:5]
    # Nothing lost either: every step of both keys is there (from whichever writer got it first).
    assert set(counts) == {(k, s) for k in ("train/loss", "eval/loss") for s in range(1, 301)}


# --------------------------------------------------------------------------- in-process smoke runs

SMOKE_SPEC = """\
name: lock-smoke
owner: octocat
hypothesis: {statement: The smoke run of this spec owns its run directory., metric: eval/loss,
             direction: decrease, min_effect: 0.01, baseline: champion}
model: {model_type: llama, hidden_size: 32, num_layers: 2, num_heads: 2, vocab_size: 512}
data:
  sources: [{name: code, path: data/code.jsonl, weight: 1.0}]
  seq_len: 32
  tokenizer: {vocab_size: 512}
train: {max_steps: 40}
"""

SMOKE_IN_FLIGHT = """
import sys, time
from pathlib import Path
from trainer.smoke import run_smoke
from validation.resolved import resolve

class InFlight:
    # The smoke reads its data's vocabulary once it owns the run directory: mark the directory
    # as in use, tell the test, and stay there.
    path = Path(sys.argv[1])
    @property
    def vocab_size(self):
        Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
        (Path(sys.argv[1]) / "in-flight").write_text("mine")
        print("held", flush=True)
        time.sleep(600)

run_smoke(resolve(Path(sys.argv[2])), InFlight(), Path(sys.argv[1]))
"""


class _Unread:
    """Data a smoke run must not reach: a refused run stops before it reads or deletes anything."""

    path = Path("/nonexistent")

    @property
    def vocab_size(self) -> int:
        raise LookupError("the smoke read its data")


def _smoke_spec(tmp_path: Path) -> Path:
    (tmp_path / "experiments").mkdir()
    spec = tmp_path / "experiments" / "lock-smoke.yaml"
    spec.write_text(SMOKE_SPEC)
    return spec


@pytest.fixture
def quick_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    # The retry window before refusing covers a launcher's instant probe; 0.3 s keeps the test short.
    import trainer.runlock

    monkeypatch.setattr(trainer.runlock, "ACQUIRE_WAIT_S", 0.3)


def test_a_smoke_in_flight_refuses_a_second_smoke_on_its_run_dir(tmp_path, quick_refusal):
    from trainer.smoke import run_smoke
    from validation.resolved import resolve

    spec = _smoke_spec(tmp_path)
    run_dir = tmp_path / "runs" / "smoke"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    holder = subprocess.Popen([sys.executable, "-c", SMOKE_IN_FLIGHT, str(run_dir), str(spec)],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        # The old smoke wiped the directory (the first run's files with it) and trained into it.
        with pytest.raises(RunDirBusy, match=rf"rank 0 of another job is alive \(pid {holder.pid} on "):
            run_smoke(resolve(spec), _Unread(), run_dir)
        assert (run_dir / "in-flight").read_text() == "mine"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert live_ranks(run_dir) == []


def test_a_trainer_job_on_the_run_dir_refuses_the_smoke(tmp_path, quick_refusal):
    from trainer.smoke import run_smoke
    from validation.resolved import resolve

    spec = _smoke_spec(tmp_path)
    run_dir = tmp_path / "run"
    holder = _hold(run_dir, rank=0)  # what `python -m trainer` takes first (`join_job`)
    try:
        with pytest.raises(RunDirBusy, match=rf"pid {holder.pid} on "):
            run_smoke(resolve(spec), _Unread(), run_dir)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_the_smoke_lets_go_of_its_run_dir_and_keeps_a_lock_its_process_already_held(tmp_path):
    from trainer.smoke import run_smoke
    from validation.resolved import resolve

    resolved = resolve(_smoke_spec(tmp_path))
    run_dir = tmp_path / "run"
    with pytest.raises(LookupError):
        run_smoke(resolved, _Unread(), run_dir)
    assert live_ranks(run_dir) == []  # released when the smoke ends, however it ends

    outer = acquire_rank_lock(run_dir, 0)  # e.g. a notebook that joined the job first
    try:
        with pytest.raises(LookupError):  # re-entrant: not refused by its own process
            run_smoke(resolved, _Unread(), run_dir)
        assert [r["pid"] for r in live_ranks(run_dir)] == [os.getpid()]  # and not released under it
    finally:
        outer.release()
