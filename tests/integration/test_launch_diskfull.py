"""A full disk is its own failure: clear message with the path and the space, exit code
`disk-space`, not relaunched, the last valid checkpoint intact.

The run directory lives on a real, tiny tmpfs that the test fills up (needs the right to
mount, i.e. root, as in CI's container; skipped elsewhere). Before: the export's ENOSPC was
a traceback and exit 1, relaunched three times, each retraining, ending 'no result.json'.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from basics.errors import exit_code
from pipelines.launchers import Verdict, get_launcher, run_with_retries
from trainer.checkpoint import format as ckpt


@pytest.fixture
def tiny_fs(tmp_path):
    """A 6 MB tmpfs (a real file system that really fills up)."""
    mount = tmp_path / "fs"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()[:200]}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(mount: Path, leave_bytes: int) -> None:
    """Leave about `leave_bytes` free. The run writes beside us (a checkpoint in flight between
    the measure and the write made the write itself hit ENOSPC once): then give back
    `leave_bytes` of the ballast, so the disk is as full as asked, not fuller."""
    ballast = mount / "ballast"
    free = shutil.disk_usage(mount).free
    try:
        with open(ballast, "wb") as fh:
            fh.write(b"\0" * max(0, free - leave_bytes))
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        os.truncate(ballast, max(0, ballast.stat().st_size - leave_bytes))


def _job_on(mount: Path, tmp: Path, **train: object):
    from tests.infra.launch_helpers import USE_TRAINER, make_trainer_job

    if not USE_TRAINER:
        pytest.skip("needs the real trainer")
    job, _ = make_trainer_job(tmp, procs=1, train=train, max_restarts=2)
    run = mount / "run"
    run.mkdir()
    shutil.copy2(job.spec_path, run / "spec.resolved.json")
    return replace(job, run_dir=run, spec_path=run / "spec.resolved.json", run_doctor=False)


def _assert_classified(job, outcome, lines: list[str]) -> dict:
    assert outcome.attempts == 1 and outcome.decisions[0].verdict is Verdict.GIVE_UP, (outcome, lines[-10:])
    result = json.loads((job.run_dir / "result.json").read_text())
    assert result["status"] == "failed" and result["stop_reason"] == "disk_full"
    log = (job.run_dir / "logs" / "launcher.log").read_text()
    error = next(line for line in log.splitlines() if line.startswith("error: disk full while writing"))
    assert "MB free" in error and str(job.run_dir) in error, error
    # The trainer's own exit code (accelerate's single-process launcher reports it, then exits 1).
    assert f"returned non-zero exit status {exit_code('disk-space')}" in log
    assert 'File "' + str(Path(ckpt.__file__).parents[1]) not in log, "no traceback from the trainer"
    assert not (job.run_dir / ".model.tmp").exists()
    assert not list((job.run_dir / "checkpoints").glob(".tmp_*")), "a failed save must not leave partial files"
    return result


def test_disk_full_at_the_final_checkpoint_and_export(tiny_fs, tmp_path):
    job = _job_on(tiny_fs, tmp_path, max_steps=6, checkpoint_interval=1000, eval_interval=1000)
    _fill(tiny_fs, leave_bytes=150_000)  # logs and metrics fit; a checkpoint or the model do not
    lines: list[str] = []
    outcome = run_with_retries(get_launcher("local"), job, on_log=lines.append)
    _assert_classified(job, outcome, lines)
    assert not (job.run_dir / "model").exists()


def test_disk_full_mid_run_stops_with_the_last_checkpoint_intact(tiny_fs, tmp_path):
    import threading

    from tests.infra.launch_helpers import wait_until

    job = _job_on(tiny_fs, tmp_path, max_steps=3000, checkpoint_interval=20, eval_interval=3000)
    lines: list[str] = []
    box: dict[str, object] = {}
    thread = threading.Thread(target=lambda: box.update(
        out=run_with_retries(get_launcher("local"), job, on_log=lines.append)))
    thread.start()
    wait_until(lambda: bool(ckpt.valid_checkpoints(job.run_dir / "checkpoints")), "the first checkpoint")
    _fill(tiny_fs, leave_bytes=120_000)
    thread.join(timeout=300)
    _assert_classified(job, box["out"], lines)
    alerts = [json.loads(line) for line in (job.run_dir / "alerts.jsonl").read_text().splitlines()]
    assert any(a["level"] == "P0" and a["kind"] == "disk_full" for a in alerts), alerts
    (last_step, last), *_ = ckpt.valid_checkpoints(job.run_dir / "checkpoints")
    assert ckpt.verify_checkpoint(last) is None  # the previous state is intact
    os.remove(tiny_fs / "ballast")
