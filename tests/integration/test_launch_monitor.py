"""Divergence is seen from step 1 and the spike policy acts on it: the real trainer with the
learning rate at the schema's maximum and no clipping, for each spike policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- the real trainer


@pytest.mark.parametrize("policy", ["stop", "rollback"])
def test_lr_at_the_schema_maximum_without_clipping_diverges_early_and_the_policy_acts(tmp_path, policy):
    from tests.infra.launch_helpers import USE_TRAINER, make_trainer_job

    if not USE_TRAINER:
        pytest.skip("needs the real trainer")
    from validation.spec import TrainSpec

    top = next(m.le for m in TrainSpec.model_fields["lr"].metadata if getattr(m, "le", None) is not None)
    job, spec = make_trainer_job(tmp_path, procs=1, train={"lr": top, "grad_clip": 0.0, "max_steps": 40,
                                                           "checkpoint_interval": 2, "eval_interval": 1000},
                                 alerts={"spike_policy": policy, "max_rollbacks": 2})
    out = subprocess.run([sys.executable, "-m", "trainer", "--spec", str(job.spec_path), "--run-dir", str(job.run_dir),
                          "--data-dir", str(job.data_dir), "--tracking-uri", "none"], cwd=REPO,
                         capture_output=True, text=True, timeout=300, env=dict(os.environ))
    alerts = [json.loads(line) for line in (job.run_dir / "alerts.jsonl").read_text().splitlines()]
    first = next(a for a in alerts if a["kind"] in ("divergence", "loss_spike", "grad_norm_spike"))
    assert first["level"] in ("P0", "P1") and first["step"] <= 10, alerts
    result = json.loads((job.run_dir / "result.json").read_text())
    assert out.returncode == 5, out.stderr[-2000:]
    assert result["status"] == "diverged" and isinstance(result["diverged_at_step"], int), result
    if policy == "rollback":
        assert [a["kind"] for a in alerts].count("rollback") == 2  # max_rollbacks, then it gives up
        assert result["stop_reason"] == "rollback_failed" and result["diverged_at_step"] >= first["step"]
    else:
        assert result["diverged_at_step"] == first["step"] == result["steps"]
