"""One owner per job: the local launcher reaches every rank, whatever session torch elastic
put it in, and nothing else writes into a run directory while a job lives in it.

Real processes: `accelerate launch` with 2 CPU ranks of the real trainer (tiny model).
Torch elastic starts each rank in a session of its own, so these fail on a launcher that
signals and watches only its own process group (the ranks trained on to the end and a
rerun wrote every eval key a second time).

Trainings are shared (module fixtures): one uninterrupted reference run (also the check that a
2-process training finishes); one run directory SIGKILLed, rerun, SIGTERMed and retried (the
SIGKILL and SIGTERM tests); one run directory with three long attempts in sequence (refused
second job, `pipeline cancel`, rerun, immediate relaunch, time limit).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from pipelines.launchers import Phase, get_launcher, run_with_retries
from tests.infra.launch_helpers import USE_TRAINER, checkpoints, make_trainer_job, result, wait_until
from trainer.runlock import RunDirBusy, live_ranks

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not USE_TRAINER, reason="needs the real trainer (python -m trainer)")]

REPO = Path(__file__).resolve().parents[2]
# Short steps (~30 ms), checkpoints every 40: a kill lands between checkpoints, mid-run.
TRAIN = {"max_steps": 160, "checkpoint_interval": 40, "eval_interval": 80, "log_interval": 1}
GRACE_S = 20.0


def _job(tmp: Path, **train: object):
    job, _ = make_trainer_job(tmp, procs=2, train=TRAIN | train)
    return replace(job, grace_seconds=GRACE_S)


def _points(run_dir: Path) -> list[tuple[str, int, float]]:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(p["key"], p["step"], p["value"]) for p in map(json.loads, lines)]


def _losses(run_dir: Path) -> dict[int, float]:
    return {s: v for k, s, v in _points(run_dir) if k == "train/loss"}


def _assert_each_point_once(run_dir: Path) -> None:
    keys = [(k, s) for k, s, _ in _points(run_dir)]
    dupes = {x for x in keys if keys.count(x) > 1}
    assert not dupes, f"recorded twice: {sorted(dupes)[:8]}"


def _pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X"):
            alive.append(pid)
    return alive


def _rank_pids(run_dir: Path) -> list[int]:
    wait_until(lambda: len(live_ranks(run_dir)) == 2, "both ranks holding their locks")
    return [int(r["pid"]) for r in live_ranks(run_dir)]


@pytest.fixture(autouse=True)
def _no_job_left_behind(tmp_path):
    """A failing test must not leave its 2-rank job training on the shared CPUs."""
    yield
    run_dir = tmp_path / "run"
    if (run_dir / "launch.json").exists() and live_ranks(run_dir):
        get_launcher("local").cancel(get_handle(run_dir))


def get_handle(run_dir: Path):
    from pipelines.launchers import handle_for_run

    return handle_for_run(run_dir)


def _checkpoint_done(run_dir: Path, step: int) -> bool:
    return (run_dir / "checkpoints" / f"step_{step:06d}" / "MANIFEST.json").is_file()


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The same 2-rank job, uninterrupted, followed from its saved handle."""
    job = _job(tmp_path_factory.mktemp("reference"))
    launcher = get_launcher("local")
    handle = launcher.submit(job)
    # Followed from the saved handle, as `pipeline status RUN` would.
    saved_id = get_handle(job.run_dir).job_id
    return {"run_dir": job.run_dir, "job_id": handle.job_id, "saved_id": saved_id, "state": launcher.wait(handle)}


@pytest.fixture(scope="module")
def reference_losses(reference_run: dict[str, object]) -> dict[int, float]:
    """train/loss of every step of the same 2-rank job, uninterrupted."""
    assert reference_run["state"].ok, reference_run["state"]
    return _losses(reference_run["run_dir"])


def test_two_process_training_finishes(reference_run):
    """The local launcher's 2-process training of the real trainer finishes (moved here from
    `test_launch_local.py` to share this module's reference run)."""
    assert reference_run["saved_id"] == reference_run["job_id"]
    state = reference_run["state"]
    assert state.ok and state.result_status == "finished", state
    done = result(reference_run["run_dir"])
    assert done["status"] == "finished" and done["world_size"] == 2


def _stop_leftovers(run_dir: Path) -> None:
    if (run_dir / "launch.json").exists() and live_ranks(run_dir):
        get_launcher("local").cancel(get_handle(run_dir))


@pytest.fixture(scope="module")
def killed_then_terminated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One run directory, two interruptions in sequence (what the two tests below check):

    1. the job is SIGKILLed through the launcher's process group after its first checkpoint;
    2. the rerun (under `run_with_retries`) resumes from that checkpoint, is SIGTERMed through
       its launcher group a few steps later (preemption-like), and the retry resumes from the
       SIGTERM checkpoint and finishes. What was seen on the way is returned."""
    run_dir = tmp_path_factory.mktemp("killed") / "run"
    job = _job(run_dir.parent)
    seen: dict[str, object] = {"run_dir": run_dir}
    try:
        launcher = get_launcher("local")
        handle = launcher.submit(job)
        pids = _rank_pids(run_dir)
        # Each rank is its own session leader: out of reach of a signal to the launcher's group.
        seen["own_sessions"] = all(os.getsid(pid) == pid for pid in pids)
        wait_until(lambda: _checkpoint_done(run_dir, 40), "the first checkpoint")
        os.killpg(int(handle.job_id), signal.SIGKILL)
        killed_at = time.monotonic()
        wait_until(lambda: not _pids_alive(pids), "every rank to die", limit_s=GRACE_S)
        print(f"ranks gone {time.monotonic() - killed_at:.2f}s after SIGKILL to the launcher group")
        seen["live_ranks_after_kill"] = live_ranks(run_dir)
        seen["poll_done_after_kill"] = launcher.poll(handle).done
        seen["result_after_kill"] = (run_dir / "result.json").exists()
        seen["checkpoint_at_kill"] = max(int(p.parent.name.split("_")[1])
                                         for p in (run_dir / "checkpoints").glob("step_*/MANIFEST.json"))
        killed_step = max(_losses(run_dir))

        lines: list[str] = []
        box: dict[str, object] = {}
        rerun = threading.Thread(target=lambda: box.update(out=run_with_retries(get_launcher("local"), job,
                                                                                 on_log=lines.append)))
        rerun.start()
        resumed = "resumed from " + str(run_dir / "checkpoints" / f"step_{seen['checkpoint_at_kill']:06d}")
        rank0_log = run_dir / "logs" / "rank0.log"
        wait_until(lambda: rank0_log.exists() and resumed in rank0_log.read_text(), "the rerun to resume")
        seen["rerun_resumed_from_the_kill_checkpoint"] = True
        # Past the step the killed job had reached: only the rerun records those.
        wait_until(lambda: max(_losses(run_dir)) >= killed_step + 3, "the rerun's first steps")
        pgid = int(json.loads((run_dir / "launch.json").read_text())["job_id"])
        os.killpg(pgid, signal.SIGTERM)  # the ranks checkpoint, the attempt is retried
        rerun.join(timeout=300)
        seen["outcome"], seen["lines"] = box.get("out"), lines
        return seen
    finally:
        _stop_leftovers(run_dir)


def test_sigkill_to_the_launcher_group_takes_every_rank_and_the_rerun_resumes_bitwise(killed_then_terminated,
                                                                                       reference_losses):
    seen = killed_then_terminated
    run_dir = seen["run_dir"]
    assert seen["own_sessions"]
    assert seen["live_ranks_after_kill"] == []
    assert seen["poll_done_after_kill"]
    assert not seen["result_after_kill"]
    # The rerun resumed from the checkpoint the killed job left (and, SIGTERMed, was retried).
    assert seen["rerun_resumed_from_the_kill_checkpoint"]
    outcome = seen["outcome"]
    assert outcome is not None and outcome.state.ok, (outcome, seen["lines"][-20:])
    done = result(run_dir)
    assert done["status"] == "finished" and done["resumed_from"]
    assert _losses(run_dir) == reference_losses  # every step, bit for bit
    _assert_each_point_once(run_dir)


def test_sigterm_to_the_launcher_group_relaunch_waits_for_the_checkpoint(killed_then_terminated, reference_losses):
    seen = killed_then_terminated
    run_dir = seen["run_dir"]
    outcome = seen["outcome"]
    assert outcome is not None and outcome.state.ok and outcome.attempts == 2, (outcome, seen["lines"][-20:])
    done = result(run_dir)
    log = (run_dir / "logs" / "rank0.log").read_text()
    saved = [line for line in log.splitlines() if "SIGTERM: checkpoint saved at step" in line]
    assert saved, "the first attempt must have saved its SIGTERM checkpoint"
    step = int(saved[0].split("at step ")[1].split(";")[0])
    assert step > seen["checkpoint_at_kill"]
    assert done["resumed_from"].endswith(f"step_{step:06d}")  # not an older one: it waited for it
    assert _losses(run_dir) == reference_losses
    _assert_each_point_once(run_dir)


@pytest.fixture(scope="module")
def live_run_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One run directory, three long attempts in sequence (what the three tests below check):

    A. while it trains, a second job is refused (by the launcher and by the trainer itself);
       then `pipeline cancel` (another process) stops it;
    B. the rerun resumes from the cancel's checkpoint; SIGTERM to its launcher group and, at
       once, a relaunch by another launcher, which must wait for B's SIGTERM checkpoint;
    C. that relaunch resumes from it; its time limit (already reached) stops it.
    What was seen on the way is returned."""
    run_dir = tmp_path_factory.mktemp("live") / "run"
    job = _job(run_dir.parent, max_steps=3000, checkpoint_interval=3000, eval_interval=3000)
    seen: dict[str, object] = {"run_dir": run_dir}
    rank0_log = run_dir / "logs" / "rank0.log"
    try:
        # A: refused twice, then cancelled.
        launcher = get_launcher("local")
        launcher.submit(job)
        pids = _rank_pids(run_dir)
        seen["pids_a"] = pids
        try:  # by the launcher, before anything starts...
            get_launcher("local").submit(job)
            seen["launcher_refusal"] = None
        except RunDirBusy as exc:
            seen["launcher_refusal"] = str(exc)
        # ...and by the trainer itself, started by hand on the same directory (one rank).
        env = dict(os.environ, RANK="0")
        seen["by_hand"] = subprocess.run(
            [sys.executable, "-m", "trainer", "--spec", str(job.spec_path), "--run-dir", str(run_dir),
             "--data-dir", str(job.data_dir), "--tracking-uri", "none"],
            cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
        wait_until(lambda: len(_losses(run_dir)) >= 5, "the first steps")
        seen["phase_before_cancel"] = launcher.poll(get_handle(run_dir)).phase
        seen["checkpoints_before_cancel"] = checkpoints(run_dir)
        launcher_log = run_dir / "logs" / "launcher.log"
        log_offset = launcher_log.stat().st_size
        # From another process, as a user would: it must not return before every rank is gone.
        seen["cancel"] = subprocess.run([sys.executable, "-m", "pipelines", "cancel", str(run_dir)], cwd=REPO,
                                        capture_output=True, text=True, timeout=GRACE_S + 60)
        seen["alive_after_cancel"] = _pids_alive(pids) + [int(r["pid"]) for r in live_ranks(run_dir)]
        seen["result_after_cancel"] = (run_dir / "result.json").exists()
        seen["launcher_log_of_cancel"] = launcher_log.read_bytes()[log_offset:].decode(errors="replace")
        ckpts = sorted((run_dir / "checkpoints").glob("step_*/MANIFEST.json"))
        seen["cancel_checkpoint"] = int(ckpts[-1].parent.name.split("_")[1]) if ckpts else None
        if not ckpts:
            return seen

        # B: the rerun resumes from the cancel's checkpoint...
        stopped_at = seen["cancel_checkpoint"]
        handle_b = launcher.submit(job)
        pids_b = _rank_pids(run_dir)
        wait_until(lambda: max(_losses(run_dir)) > stopped_at + 3, "the rerun's first steps")
        seen["rerun_log"] = rank0_log.read_text()
        # ...and is SIGTERMed: it starts its SIGTERM checkpoint, and a relaunch is submitted at
        # once, by another launcher (as after a crash of the pipeline).
        os.killpg(int(handle_b.job_id), signal.SIGTERM)
        second = get_launcher("local")
        handle_c = second.submit(replace(job, wait_previous_s=GRACE_S + 30))
        try:
            seen["alive_after_relaunch_submit"] = _pids_alive(pids_b)
            seen["launcher_log"] = (run_dir / "logs" / "launcher.log").read_text()
            saved = sorted((run_dir / "checkpoints").glob("step_*/MANIFEST.json"))
            seen["checkpoint_before_relaunch"] = int(saved[-1].parent.name.split("_")[1])
            resumed = f"resumed from {saved[-1].parent}"
            wait_until(lambda: rank0_log.read_text().count(resumed) >= 1 and len(live_ranks(run_dir)) == 2,
                       "the relaunch to resume")
            seen["relaunch_max_step"] = max(_losses(run_dir))
            # C: the time limit (here: already reached) returns only once no rank is alive.
            pids_c = [int(r["pid"]) for r in live_ranks(run_dir)]
            wait_until(lambda: max(_losses(run_dir)) >= seen["checkpoint_before_relaunch"] + 3,
                       "the relaunch's first steps")
            limited = replace(handle_c, extra={**handle_c.extra, "time_limit_s": time.time() - handle_c.submitted_at})
            seen["time_limit"] = second.wait(limited)
            seen["alive_after_time_limit"] = _pids_alive(pids_c) + [int(r["pid"]) for r in live_ranks(run_dir)]
        finally:
            if live_ranks(run_dir):
                second.cancel(handle_c)
        return seen
    finally:
        _stop_leftovers(run_dir)


def test_pipeline_cancel_returns_when_no_rank_is_alive_and_the_rerun_resumes(live_run_dir):
    """Also what was `test_launch_local.py::test_cancel_checkpoints_first_then_stops`: the
    cancel checkpoints first (none was due), then stops; the job has no result."""
    seen = live_run_dir
    run_dir = seen["run_dir"]
    assert seen["phase_before_cancel"] is Phase.RUNNING
    assert seen["checkpoints_before_cancel"] == []  # no periodic checkpoint is due in this run
    out = seen["cancel"]
    assert out.returncode == 0, out.stderr
    assert seen["alive_after_cancel"] == []
    # The launcher's cancel, as the CLI reports it: cancelled, once no rank was alive.
    assert "-> cancelled (" in out.stdout and "no rank alive" in out.stdout, out.stdout
    assert seen["cancel_checkpoint"] is not None, "SIGTERM must leave a checkpoint"
    assert not seen["result_after_cancel"]
    assert "SIGTERM: checkpoint saved" in seen["launcher_log_of_cancel"]
    stopped_at = seen["cancel_checkpoint"]
    assert f"resumed from {run_dir / 'checkpoints' / f'step_{stopped_at:06d}'}" in seen["rerun_log"]
    _assert_each_point_once(run_dir)


def test_a_second_job_on_a_live_run_dir_is_refused_and_the_time_limit_leaves_no_rank(live_run_dir):
    seen = live_run_dir
    # By the launcher, before anything starts...
    assert seen["launcher_refusal"] is not None and "is in use by a live job: rank 0" in seen["launcher_refusal"]
    # ...and by the trainer itself, started by hand on the same directory (one rank).
    out = seen["by_hand"]
    run_dir = seen["run_dir"]
    assert out.returncode == RunDirBusy.exit_code, out.stderr[-2000:]
    assert f"run directory {run_dir} is in use: rank 0 of another job is alive (pid {seen['pids_a'][0]}" in out.stderr
    assert "Traceback" not in out.stderr
    # The time limit (here: already reached) returns only once no rank is alive, and says so.
    state = seen["time_limit"]
    assert state.phase is Phase.TIMEOUT and "no rank alive" in state.detail, state
    assert seen["alive_after_time_limit"] == []


def test_an_immediate_relaunch_waits_for_the_old_attempt_to_exit(live_run_dir):
    seen = live_run_dir
    assert seen["alive_after_relaunch_submit"] == [], "submit returned while the old ranks were alive"
    log = seen["launcher_log"]
    assert "waiting up to" in log and "for the previous attempt to exit" in log
    # The old attempt's SIGTERM checkpoint was complete before the relaunch started, and it resumed from it.
    step = seen["checkpoint_before_relaunch"]
    assert step > seen["cancel_checkpoint"], "the old attempt's SIGTERM checkpoint must be complete first"
    assert seen["relaunch_max_step"] >= step
    _assert_each_point_once(seen["run_dir"])
