"""The `local` launcher for real: accelerate with 2 CPU processes (one process: `solo`), cancel, crash and retry.

Runs the real trainer (`python -m trainer`) when it is importable, else the probe in
`tests/infra/probe_train.py`, which follows the same contract.

Two-process trainings of the real trainer with this launcher are in `test_launch_ownership.py`,
which shares them between claims: `test_two_process_training_finishes` (moved there) and the
cancel that checkpoints first, then stops
(`test_pipeline_cancel_returns_when_no_rank_is_alive_and_the_rerun_resumes`).
"""

from __future__ import annotations

import os

from pipelines.launchers import Phase, Verdict, get_launcher, run_with_retries
from tests.infra.launch_helpers import (
    USE_TRAINER,
    make_job,
    probe_events,
    probe_ranks,
    result,
    training_job,
)


def test_two_processes_really_form_one_process_group(tmp_path):
    job, _ = make_job(tmp_path, procs=2)
    launcher = get_launcher("local")
    lines: list[str] = []
    state = launcher.wait(launcher.submit(job), on_log=lines.append)
    assert state.phase is Phase.SUCCEEDED, state
    ranks = probe_ranks(job.run_dir)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["world_size"] == 2 and r["allreduce"] == 3.0 for r in ranks)  # 1 + 2 summed across ranks
    assert any("probe rank 1/2" in line for line in lines)  # streamed to on_log
    assert "probe rank 0/2" in (job.run_dir / "logs" / "launcher.log").read_text()
    assert "ready: 0 error(s)" in (job.run_dir / "logs" / "doctor.txt").read_text()


def test_crash_is_retried_and_resumes_from_the_checkpoint(tmp_path):
    # One process: with two, torchrun gives the surviving peer 30 s to exit before SIGKILL.
    job = training_job(tmp_path, procs=1, crash=True)
    lines: list[str] = []
    outcome = run_with_retries(get_launcher("local"), job, on_log=lines.append)
    assert outcome.attempts == 2 and outcome.decisions[0].verdict is Verdict.RETRY
    assert outcome.state.ok, outcome.state
    assert any("restart 1/2 resumes from the last valid checkpoint" in line for line in lines)
    if USE_TRAINER:
        done = result(job.run_dir)
        assert done["status"] == "finished" and done["resumed_from"].endswith("step_000004")
    else:
        starts = [e for e in probe_events(job.run_dir) if e["event"] == "start"]
        assert [e["resumed_from"] for e in starts] == [None, 2]


def test_bad_result_is_not_retried(tmp_path):
    job, _ = make_job(tmp_path, procs=1)
    from dataclasses import replace

    job = replace(job, env={"PROBE_RESULT_STATUS": "failed", "PROBE_STEPS": "1"})
    outcome = run_with_retries(get_launcher("local"), job)
    assert outcome.attempts == 1
    assert outcome.decisions[0].verdict is Verdict.GIVE_UP and "bad result" in outcome.decisions[0].reason
    assert outcome.state.phase is Phase.FAILED and outcome.state.result_status == "failed"


def test_a_one_process_job_gets_the_environment_accelerate_launch_would_give_it(tmp_path, monkeypatch):
    """One process starts under `solo`, not `accelerate launch`: its environment is what
    accelerate's own code computes for the same command line (CPU and GPU, threads given or not)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    from pipelines.launchers.solo import one_process_env

    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no accelerate config file of this machine
    for use_gpu in (False, True):
        for threads in (None, "3"):
            if threads is None:
                monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
            else:
                monkeypatch.setenv("OMP_NUM_THREADS", threads)
            flags = (["--num_processes", "1"] if use_gpu else ["--cpu", "--num_processes", "1"]) + [
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "trainer"]
            args = _validate_launch_command(launch_command_parser().parse_args(flags))[0]
            _, want = prepare_simple_launcher_cmd_env(args)
            assert one_process_env(dict(os.environ), use_gpu) == want, (use_gpu, threads)
