"""A full disk under FSDP stops the run as it does one process (issue 39, item 4).

The same real 6 MB tmpfs as tests/integration/test_launch_diskfull.py, two gloo processes
sharding the model (FSDP, torch.distributed.checkpoint shards): a sharded save that hits ENOSPC
is a failed write (`checkpoint_failed`, then the P0 `disk_full`), not an invalid checkpoint, so
the run stops with result.json `disk_full`, the launcher does not retry, and the last
checkpoint stays intact.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from pipelines.launchers import Verdict, get_launcher, run_with_retries
from tests.integration.test_launch_diskfull import _fill, tiny_fs  # noqa: F401 - the fixture
from trainer.checkpoint import format as ckpt


def test_disk_full_mid_run_stops_an_fsdp_run_like_one_process(tiny_fs: Path, tmp_path: Path) -> None:  # noqa: F811
    from tests.infra.launch_helpers import USE_TRAINER, make_trainer_job, wait_until

    if not USE_TRAINER:
        pytest.skip("needs the real trainer")
    job, _ = make_trainer_job(tmp_path, procs=2, max_restarts=2,
                              train={"max_steps": 3000, "checkpoint_interval": 20, "eval_interval": 3000})
    run = tiny_fs / "run"
    run.mkdir()
    spec = json.loads(job.spec_path.read_text())
    spec["parallel"] = {"dp": 2, "fsdp": True}
    (run / "spec.resolved.json").write_text(json.dumps(spec, indent=2))
    job = replace(job, run_dir=run, spec_path=run / "spec.resolved.json", run_doctor=False)
    lines: list[str] = []
    box: dict[str, object] = {}
    thread = threading.Thread(target=lambda: box.update(
        out=run_with_retries(get_launcher("local"), job, on_log=lines.append)))
    thread.start()
    try:
        wait_until(lambda: bool(ckpt.valid_checkpoints(run / "checkpoints")), "the first checkpoint")
        (_, first), *_ = ckpt.valid_checkpoints(run / "checkpoints")
        assert sorted(p.name for p in first.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]  # sharded
        _fill(tiny_fs, leave_bytes=120_000)
        thread.join(timeout=300)
    finally:
        thread.join(timeout=300)
    outcome = box["out"]
    assert outcome.attempts == 1 and outcome.decisions[0].verdict is Verdict.GIVE_UP, (outcome, lines[-10:])
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "failed" and result["stop_reason"] == "disk_full", result
    alerts = [json.loads(line) for line in (run / "alerts.jsonl").read_text().splitlines()]
    kinds = [a["kind"] for a in alerts]
    assert "checkpoint_failed" in kinds and "checkpoint_invalid" not in kinds, kinds
    assert any(a["level"] == "P0" and a["kind"] == "disk_full" for a in alerts), alerts
    assert not list((run / "checkpoints").glob(".tmp_*")), "a failed save must not leave partial files"
    (_, last), *_ = ckpt.valid_checkpoints(run / "checkpoints")
    assert ckpt.verify_checkpoint(last) is None  # the previous state is intact
    os.remove(tiny_fs / "ballast")
    shutil.rmtree(run, ignore_errors=True)
