"""The last line of a failed smoke says why (issue 30, item 4). Reproduced on the old main: an
experiment whose lr diverged ended `pipeline run` with "smoke run of X failed: finished,
loss_decreasing, checkpoint_validated, resume_equal", the P0 divergence alert (loss 30.5 at
step 6) only in the log above it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from basics.errors import TrainingError
from trainer.smoke import why_failed

DIVERGED = "loss 30.5 at step 6 is above ln(vocab)+1 = 7.24: worse than guessing uniformly"
CHECKS = {"finished": False, "loss_finite": True, "loss_decreasing": False, "checkpoint_validated": False,
          "parameters_match": True, "flops_match": True, "resume_equal": False}


def test_a_diverged_smoke_ends_pipeline_run_with_the_divergence_step_and_loss(tmp_path: Path, monkeypatch):
    import trainer.smoke
    from pipelines.orchestrate import ExperimentFlow

    alerts = tmp_path / "alerts.jsonl"
    alerts.write_text(json.dumps({"level": "P1", "kind": "loss_spike", "message": "spike", "step": 5}) + "\n"
                      + json.dumps({"level": "P0", "kind": "divergence", "message": DIVERGED, "step": 6}) + "\n")
    reason = why_failed(CHECKS, {"status": "diverged", "diverged_at_step": 6}, alerts, losses={1: 5.0, 6: 30.5},
                        resumed={}, parameters=(10, 10), notes={})
    result = {"status": "failed", "checks": CHECKS, "reason": reason, "run_dir": str(tmp_path)}
    monkeypatch.setattr(trainer.smoke, "run_smoke", lambda *a, **k: dict(result))
    resolved = SimpleNamespace(spec=SimpleNamespace(name="hot-lr"))
    with pytest.raises(TrainingError) as failed:
        ExperimentFlow._smoke(None, resolved, None, tmp_path / "smoke")  # type: ignore[arg-type]
    assert str(failed.value) == (f"smoke run of hot-lr failed: diverged at step 6: {DIVERGED} (failed checks: "
                                 "finished, loss_decreasing, checkpoint_validated, resume_equal)")


def test_a_resume_that_goes_another_way_names_the_step_and_both_losses(tmp_path: Path):
    losses = {s: 5.0 - s / 10 for s in range(1, 31)}
    resumed = {s: v for s, v in losses.items() if s > 15} | {17: 3.25}
    checks = dict.fromkeys(CHECKS, True) | {"resume_equal": False}
    reason = why_failed(checks, {"status": "finished"}, tmp_path / "none.jsonl", losses=losses, resumed=resumed,
                        parameters=(10, 10), notes={})
    assert reason.startswith("resumed from the step 15 checkpoint, step 17 has loss 3.25 instead of 3.3: "), reason
    assert "optimizer's state outside its state_dict()" in reason
