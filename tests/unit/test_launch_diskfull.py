"""A full disk is its own failure: repeated checkpoint write failures escalate to a P0, and
one that says the disk is full stops the run at once (`DiskSpaceError`)."""

from __future__ import annotations

import pytest

from basics.errors import DiskSpaceError, TrainingError
from trainer.monitor import CheckpointFailures


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


@pytest.mark.parametrize(("reason", "kind"), [
    ("not written: [Errno 28] No space left on device", "checkpoint_failed"),
    ("shard model.layers.0.weight differs after reload", "checkpoint_invalid"),
])
def test_a_sharded_save_that_raised_is_a_failed_write_not_an_invalid_checkpoint(tmp_path, reason, kind):
    """Issue 39 item 4: a sharded write that hit a full disk was reported as `checkpoint_invalid`,
    so the disk-full stop and the stop at the third failure never triggered under FSDP, TP or
    pipeline stages. Now it is `checkpoint_failed`, as for one process, and a full disk stops."""
    from types import SimpleNamespace

    from trainer.checkpoint.sharded import ShardedStorage
    from trainer.checkpoint.writer import CheckpointWriter

    events: list[tuple[str, str, str]] = []
    failures = CheckpointFailures(tmp_path, lambda *e: events.append(e))

    def on_event(level: str, what: str, message: str) -> None:
        events.append((level, what, message))
        failures.note(what, message)

    writer = CheckpointWriter(tmp_path / "checkpoints", keep_last=1, async_save=False, on_event=on_event)
    comm = SimpleNamespace(world=1, barrier=lambda: None, gather=lambda obj: [obj])
    live = SimpleNamespace(writer=writer, comm=comm, rank=0, is_main=True)
    tmp = tmp_path / "checkpoints" / ".tmp_step_000004"
    tmp.mkdir(parents=True)
    ShardedStorage(live)._complete(4, tmp, reason, 0.0)  # type: ignore[arg-type]
    assert events[0][:2] == ("P1", kind) and not tmp.exists()
    if kind == "checkpoint_failed":
        assert "No space left on device" in events[0][2] and "not written: not written" not in events[0][2]
        with pytest.raises(DiskSpaceError, match="disk full while writing the checkpoint"):
            failures.raise_if_fatal()
    else:
        failures.raise_if_fatal()  # an invalid save alone stops nothing
