"""The console tells the story: P0/P1 alerts and relaunches, one line each, as they happen; the
rerun hint names the command the user ran; all-corrupt checkpoints say the run restarts at 0."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.launchers import JobState, LaunchHandle, Phase, run_with_retries
from pipelines.launchers.logtail import story_lines
from trainer.monitor import Alert, AlertLog

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.unit
def test_alerts_and_relaunches_become_one_console_line_each(tmp_path):
    told: list[tuple[str, str]] = []
    sink = story_lines(lambda event, line: told.append((event, line)))

    # Alert lines exactly as the trainer's rank-0 console writes them.
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Collect()
    handler.setFormatter(logging.Formatter("%(asctime)s rank0 %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("trainer.monitor")
    logger.addHandler(handler)
    try:
        alerts = AlertLog(None, None, 0)
        alerts.emit(Alert("P0", "divergence", "loss 14.5 at step 6 is above ln(vocab)+1", 6, "stop"))
        alerts.emit(Alert("P1", "loss_spike", "loss 6.5 > 5.8", 9))
        alerts.emit(Alert("P2", "throughput_drop", "400 tokens/s < 0.5 x median 1000", 12))
    finally:
        logger.removeHandler(handler)

    # Relaunch lines exactly as run_with_retries says them (a launcher whose job crashes once).
    class CrashOnce:
        name = "fake"

        def __init__(self) -> None:
            self.n = 0

        def submit(self, job):
            self.n += 1
            return LaunchHandle(launcher="fake", job_id=str(self.n), run_dir=job.run_dir)

        def poll(self, handle):
            return JobState(Phase.FAILED, 1) if handle.job_id == "1" else JobState(Phase.SUCCEEDED, 0)

        def wait(self, handle, timeout=None, on_log=None):
            if on_log:
                on_log("2026-12-01 05:00:00,000 rank0 INFO trainer: step 3/6 train/loss=5.4")  # not for the console
            return self.poll(handle)

        def cancel(self, handle):
            return self.poll(handle)

    from pipelines.launchers import LaunchJob

    job = LaunchJob(spec_path=tmp_path / "s.json", run_dir=tmp_path, data_dir=tmp_path, max_restarts=2)
    lines: list[str] = []
    run_with_retries(CrashOnce(), job, on_log=lambda line: (lines.append(line), sink(line)))
    for line in records:
        sink(line)

    assert ("relaunch", "attempt 1 crashed: exit 1; restart 1/2 resumes from the last valid checkpoint") in told
    assert ("alert", "P0 divergence at step 6: loss 14.5 at step 6 is above ln(vocab)+1") in told
    assert ("alert", "P1 loss_spike at step 9: loss 6.5 > 5.8") in told
    assert len(told) == 3  # no P2, no step lines


@pytest.mark.unit
def test_the_rerun_hint_names_the_command_that_was_run(monkeypatch):
    from pipelines.cmd_run import _rerun_command

    monkeypatch.setattr(sys, "argv", ["/venv/bin/pipeline", "train", "experiments/my lr.yaml", "--launcher", "slurm"])
    assert _rerun_command() == "pipeline train 'experiments/my lr.yaml' --launcher slurm"


@pytest.mark.integration
def test_all_corrupt_checkpoints_say_the_run_restarts_from_step_0(tmp_path):
    from infra.launch_helpers import USE_TRAINER, make_trainer_job

    if not USE_TRAINER:
        pytest.skip("needs the real trainer")
    job, _ = make_trainer_job(tmp_path, procs=1, train={"max_steps": 4, "checkpoint_interval": 2, "keep_last": 2})
    cmd = [sys.executable, "-m", "trainer", "--spec", str(job.spec_path), "--run-dir", str(job.run_dir),
           "--data-dir", str(job.data_dir), "--tracking-uri", "none"]
    assert subprocess.run(cmd, cwd=REPO, capture_output=True, timeout=300).returncode == 0
    for weights in (job.run_dir / "checkpoints").glob("step_*/model.safetensors"):
        weights.write_bytes(b"corrupt")
    (job.run_dir / "result.json").unlink()
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    alerts = [json.loads(line) for line in (job.run_dir / "alerts.jsonl").read_text().splitlines()]
    restart = [a for a in alerts if a["kind"] == "restart_from_scratch"]
    assert len(restart) == 1 and restart[0]["level"] == "P1" and "restarting from step 0" in restart[0]["message"]
    assert "restarting from step 0" in out.stderr  # on the console, not only in the files
    assert json.loads((job.run_dir / "result.json").read_text())["resumed_from"] is None
