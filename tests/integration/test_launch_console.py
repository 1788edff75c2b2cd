"""The console tells the story: when every checkpoint is corrupt, the real trainer says the run
restarts at step 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_all_corrupt_checkpoints_say_the_run_restarts_from_step_0(tmp_path):
    from tests.infra.launch_helpers import USE_TRAINER, make_trainer_job

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
