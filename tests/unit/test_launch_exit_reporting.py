"""Exit codes say what happened (issue 30, item 4). Reproduced on the old main: a SIGKILLed rank
was reported as "crashed: exit 1;" (torch elastic's own exit code), and `pipeline train` exited 5,
registered as retryable, on a startup failure the trainer had reported as exit 14."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from basics.errors import EXIT_CODES
from pipelines.launchers import Verdict
from pipelines.launchers.interface import LaunchHandle, Phase
from pipelines.launchers.local import LocalLauncher
from pipelines.launchers.retry import classify

# What accelerate's multi-process launch (torch elastic) printed when rank 1 got SIGKILL
# (`os.kill(os.getpid(), 9)`), then exited 1.
ELASTIC_SIGKILL = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
/tmp/k.py FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-02_08:55:17
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 19665)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 19665
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_08:55:17
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 19666)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 19666
=======================================================
"""
# accelerate's single-process launch of a trainer killed by SIGKILL, then exit 1.
SINGLE_SIGKILL = ("subprocess.CalledProcessError: Command '['/venv/bin/python', '-m', 'trainer']' died with "
                  "<Signals.SIGKILL: 9>.\n")


def _ended(tmp_path: Path, log: str, exit_code: int = 1):
    (tmp_path / "logs").mkdir(exist_ok=True)
    (tmp_path / "logs" / "launcher.log").write_text("[launcher] earlier attempt\n" + log)
    launcher = LocalLauncher()
    handle = LaunchHandle("local", "4242", tmp_path, extra={"log": str(tmp_path / "logs" / "launcher.log"),
                                                            "log_offset": 0, "ranks": [0, 2]})
    launcher._procs["4242"] = SimpleNamespace(poll=lambda: exit_code, pid=4242)  # type: ignore[assignment]
    return launcher.poll(handle)


def test_a_sigkilled_rank_is_reported_as_killed_by_its_signal(tmp_path: Path):
    state = _ended(tmp_path, "rank output\n" + ELASTIC_SIGKILL)
    assert state.phase is Phase.FAILED and state.exit_code == -9
    assert state.detail == "rank 1 killed by SIGKILL (pid 19666)"
    decision = classify(state.exit_code, state.result_status, phase=state.phase, failure=state.detail)
    assert decision.verdict is Verdict.RETRY and decision.reason == "crashed: rank 1 killed by SIGKILL (pid 19666)"


def test_a_single_process_killed_by_a_signal_and_a_rank_exit_code_are_read_from_the_log(tmp_path: Path):
    assert _ended(tmp_path, SINGLE_SIGKILL).detail == "killed by SIGKILL"
    startup = ELASTIC_SIGKILL.replace("exitcode  : -9 (pid: 19666)  (SIGKILL)", "exitcode  : 14 (pid: 19666) ")
    state = _ended(tmp_path, startup)
    assert state.exit_code == 14 and state.detail == "rank 1 exited 14 (pid 19666)"
    assert classify(state.exit_code, None, phase=state.phase).verdict is Verdict.GIVE_UP


def test_pipeline_train_exits_14_not_retryable_5_on_a_startup_failure(tmp_path: Path):
    from pipelines.exits import training_failure

    result = {"status": "failed", "stop_reason": "startup_failure", "error": "TrainingError: tokenizer has 320",
              "reason": "failed before the first step on rank 0: TrainingError: tokenizer has 320"}
    (tmp_path / "result.json").write_text(json.dumps(result))
    error = training_failure("next-line", 1, tmp_path, None)
    retry = {e.code: e.retry for e in EXIT_CODES}
    assert error.exit_code == 14 and retry[error.exit_code] is False
    assert str(error).startswith("training next-line seed 1 failed before its first step: failed before the first "
                                 "step on rank 0: TrainingError: tokenizer has 320")
    crashed = training_failure("next-line", 1, tmp_path / "none", SimpleNamespace(detail="rank 1 killed by SIGKILL"))
    assert crashed.exit_code == 5 and "ended 'no result.json': rank 1 killed by SIGKILL" in str(crashed)
