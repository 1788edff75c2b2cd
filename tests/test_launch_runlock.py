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

from trainer.runlock import RunDirBusy, acquire_rank_lock, live_ranks
from trainer.tracking import JsonlMetrics

pytestmark = pytest.mark.integration

HOLDER = """
import sys, time
from trainer.runlock import join_job
join_job(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


def _hold(run_dir: Path, rank: int = 0) -> subprocess.Popen[str]:
    env = dict(os.environ, RANK=str(rank), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
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
