"""A full disk is its own failure: repeated checkpoint write failures escalate to a P0, and
one that says the disk is full stops the run at once (`DiskSpaceError`)."""

from __future__ import annotations

import pytest

from trainer.monitor import CheckpointFailures
from validation.errors import DiskSpaceError, TrainingError


def test_checkpoint_failures_escalate_and_a_full_disk_stops_at_once(tmp_path):
    events: list[tuple[str, str, str]] = []
    failures = CheckpointFailures(tmp_path, lambda *e: events.append(e), limit=3)
    for _ in range(2):
        failures.note("checkpoint_failed", "checkpoint at step 4 not written: permission denied")
        failures.raise_if_fatal()  # P1s only so far
    failures.note("checkpoint_failed", "checkpoint at step 6 not written: permission denied")
    with pytest.raises(TrainingError, match="3 checkpoint writes failed"):
        failures.raise_if_fatal()
    assert events[-1][:2] == ("P0", "checkpoint_failed_repeatedly")

    full = CheckpointFailures(tmp_path, lambda *e: events.append(e))
    full.note("checkpoint_failed", "SafetensorError: IoError(Os { code: 28, message: \"No space left on device\" })")
    with pytest.raises(DiskSpaceError, match="disk full while writing the checkpoint"):
        full.raise_if_fatal()
    assert events[-1][:2] == ("P0", "disk_full")
