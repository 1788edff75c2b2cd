"""The console tells the story: P0/P1 alerts and relaunches, one line each, as they happen; the
rerun hint names the command the user ran."""

from __future__ import annotations

import logging
import sys

from pipelines.launchers import JobState, LaunchHandle, Phase, run_with_retries
from pipelines.launchers.logtail import story_lines
from trainer.monitor import Alert, AlertLog


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


def test_the_rerun_hint_names_the_command_that_was_run(monkeypatch):
    from pipelines.cmd_run import _rerun_command

    monkeypatch.setattr(sys, "argv", ["/venv/bin/pipeline", "train", "experiments/my lr.yaml", "--launcher", "slurm"])
    assert _rerun_command() == "pipeline train 'experiments/my lr.yaml' --launcher slurm"
