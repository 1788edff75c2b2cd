"""A failure that repeats identically at startup is not relaunched (issue 23, part 7): its exit
code is never retried, while a transient startup error still is."""

from __future__ import annotations

from basics.errors import no_retry_exit_codes
from pipelines.launchers import Verdict
from pipelines.launchers.retry import classify
from tests.infra.launch_helpers import result


def test_startup_exit_code_is_never_retried():
    assert 14 in no_retry_exit_codes()
    assert classify(14, None).verdict is Verdict.GIVE_UP
    assert classify(1, None).verdict is Verdict.RETRY  # a crash after the first step still is


def test_transient_startup_errors_are_still_relaunched(tmp_path):
    from trainer.entry import record_startup_failure

    assert not record_startup_failure(tmp_path, RuntimeError("Connection reset by peer during rendezvous"))
    assert not (tmp_path / "result.json").exists()
    assert record_startup_failure(tmp_path, RuntimeError("The size of tensor a (64) must match the size of tensor b (128)"))
    assert "RuntimeError: The size of tensor a (64)" in result(tmp_path)["error"]
