"""One owner per job: the local launcher reaches every rank, whatever session torch elastic
put it in, and nothing else writes into a run directory while a job lives in it.

Real processes: `accelerate launch` with 2 CPU ranks of the real trainer (tiny model).
Torch elastic starts each rank in a session of its own, so these fail on a launcher that
signals and watches only its own process group (the ranks trained on to the end and a
rerun wrote every eval key a second time).
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
from tests.infra.launch_helpers import USE_TRAINER, make_trainer_job, result, wait_until
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
def reference_losses(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """train/loss of every step of the same 2-rank job, uninterrupted."""
    job = _job(tmp_path_factory.mktemp("reference"))
    launcher = get_launcher("local")
    state = launcher.wait(launcher.submit(job))
    assert state.ok, state
    return _losses(job.run_dir)


def test_sigkill_to_the_launcher_group_takes_every_rank_and_the_rerun_resumes_bitwise(tmp_path, reference_losses):
    job = _job(tmp_path)
    launcher = get_launcher("local")
    handle = launcher.submit(job)
    pids = _rank_pids(job.run_dir)
    # Each rank is its own session leader: out of reach of a signal to the launcher's group.
    assert all(os.getsid(pid) == pid for pid in pids)
    wait_until(lambda: _checkpoint_done(job.run_dir, 40), "the first checkpoint")
    os.killpg(int(handle.job_id), signal.SIGKILL)
    killed_at = time.monotonic()
    wait_until(lambda: not _pids_alive(pids), "every rank to die", limit_s=GRACE_S)
    print(f"ranks gone {time.monotonic() - killed_at:.2f}s after SIGKILL to the launcher group")
    assert live_ranks(job.run_dir) == []
    assert launcher.poll(handle).done
    assert not (job.run_dir / "result.json").exists()

    state = launcher.wait(launcher.submit(job))  # the rerun
    assert state.ok, state
    done = result(job.run_dir)
    assert done["status"] == "finished" and done["resumed_from"]
    assert _losses(job.run_dir) == reference_losses  # every step, bit for bit
    _assert_each_point_once(job.run_dir)


def test_pipeline_cancel_returns_when_no_rank_is_alive_and_the_rerun_resumes(tmp_path):
    job = _job(tmp_path, max_steps=3000, checkpoint_interval=3000, eval_interval=3000)
    launcher = get_launcher("local")
    launcher.submit(job)
    pids = _rank_pids(job.run_dir)
    wait_until(lambda: len(_losses(job.run_dir)) >= 5, "the first steps")
    assert launcher.poll(get_handle(job.run_dir)).phase is Phase.RUNNING
    # From another process, as a user would: it must not return before every rank is gone.
    out = subprocess.run([sys.executable, "-m", "pipelines", "cancel", str(job.run_dir)], cwd=REPO,
                         capture_output=True, text=True, timeout=GRACE_S + 60)
    assert out.returncode == 0, out.stderr
    assert _pids_alive(pids) == [] and live_ranks(job.run_dir) == []
    assert "no rank alive" in out.stdout and "cancelled" in out.stdout, out.stdout
    ckpts = sorted((job.run_dir / "checkpoints").glob("step_*/MANIFEST.json"))
    assert ckpts, "SIGTERM must leave a checkpoint"
    stopped_at = int(ckpts[-1].parent.name.split("_")[1])

    handle = launcher.submit(job)  # the rerun resumes; stopped again after a few steps
    wait_until(lambda: max(_losses(job.run_dir)) > stopped_at + 3, "the rerun's first steps")
    state = launcher.cancel(handle)
    assert state.phase is Phase.CANCELLED and "no rank alive" in state.detail, state
    log = (job.run_dir / "logs" / "rank0.log").read_text()
    assert f"resumed from {job.run_dir / 'checkpoints' / f'step_{stopped_at:06d}'}" in log
    _assert_each_point_once(job.run_dir)


def test_a_second_job_on_a_live_run_dir_is_refused_and_the_time_limit_leaves_no_rank(tmp_path):
    job = _job(tmp_path, max_steps=3000, checkpoint_interval=3000, eval_interval=3000)
    launcher = get_launcher("local")
    handle = launcher.submit(job)
    pids = _rank_pids(job.run_dir)
    try:
        # By the launcher, before anything starts...
        with pytest.raises(RunDirBusy, match="is in use by a live job: rank 0"):
            get_launcher("local").submit(job)
        # ...and by the trainer itself, started by hand on the same directory (one rank).
        env = dict(os.environ, RANK="0")
        out = subprocess.run([sys.executable, "-m", "trainer", "--spec", str(job.spec_path), "--run-dir",
                              str(job.run_dir), "--data-dir", str(job.data_dir), "--tracking-uri", "none"],
                             cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == RunDirBusy.exit_code, out.stderr[-2000:]
        assert f"run directory {job.run_dir} is in use: rank 0 of another job is alive (pid {pids[0]}" in out.stderr
        assert "Traceback" not in out.stderr
        # The time limit (here: already reached) returns only once no rank is alive, and says so.
        wait_until(lambda: len(_losses(job.run_dir)) >= 3, "the first steps")
        limited = replace(handle, extra={**handle.extra, "time_limit_s": time.time() - handle.submitted_at})
        state = launcher.wait(limited)
        assert state.phase is Phase.TIMEOUT and "no rank alive" in state.detail, state
        assert _pids_alive(pids) == [] and live_ranks(job.run_dir) == []
    finally:
        if live_ranks(job.run_dir):
            launcher.cancel(handle)


def test_sigterm_to_the_launcher_group_relaunch_waits_for_the_checkpoint(tmp_path, reference_losses):
    job = _job(tmp_path)
    lines: list[str] = []
    box: dict[str, object] = {}
    thread = threading.Thread(target=lambda: box.update(out=run_with_retries(get_launcher("local"), job,
                                                                              on_log=lines.append)))
    thread.start()
    wait_until(lambda: (job.run_dir / "launch.json").exists() and len(live_ranks(job.run_dir)) == 2, "ranks")
    wait_until(lambda: len(_losses(job.run_dir)) >= 10, "the first steps")
    pgid = int(json.loads((job.run_dir / "launch.json").read_text())["job_id"])
    os.killpg(pgid, signal.SIGTERM)  # preemption-like: the ranks checkpoint, the attempt is retried
    thread.join(timeout=300)
    outcome = box["out"]
    assert outcome.state.ok and outcome.attempts == 2, (outcome, lines[-20:])
    done = result(job.run_dir)
    log = (job.run_dir / "logs" / "rank0.log").read_text()
    saved = [line for line in log.splitlines() if "SIGTERM: checkpoint saved at step" in line]
    assert saved, "the first attempt must have saved its SIGTERM checkpoint"
    step = int(saved[0].split("at step ")[1].split(";")[0])
    assert done["resumed_from"].endswith(f"step_{step:06d}")  # not an older one: it waited for it
    assert _losses(job.run_dir) == reference_losses
    _assert_each_point_once(job.run_dir)


def test_an_immediate_relaunch_waits_for_the_old_attempt_to_exit(tmp_path):
    job = _job(tmp_path, max_steps=3000, checkpoint_interval=3000, eval_interval=3000)
    first = get_launcher("local")
    handle = first.submit(job)
    pids = _rank_pids(job.run_dir)
    wait_until(lambda: len(_losses(job.run_dir)) >= 5, "the first steps")
    os.killpg(int(handle.job_id), signal.SIGTERM)  # the old attempt starts its SIGTERM checkpoint...
    # ...and a relaunch is submitted at once, by another launcher (as after a crash of the pipeline).
    second = get_launcher("local")
    relaunch = second.submit(replace(job, wait_previous_s=GRACE_S + 30))
    try:
        assert _pids_alive(pids) == [], "submit returned while the old ranks were alive"
        log = (job.run_dir / "logs" / "launcher.log").read_text()
        assert "waiting up to" in log and "for the previous attempt to exit" in log
        saved = sorted((job.run_dir / "checkpoints").glob("step_*/MANIFEST.json"))
        assert saved, "the old attempt's SIGTERM checkpoint must be complete before the relaunch starts"
        step = int(saved[-1].parent.name.split("_")[1])
        wait_until(lambda: f"resumed from {saved[-1].parent}" in (job.run_dir / "logs" / "rank0.log").read_text(),
                   "the relaunch to resume")
        assert max(_losses(job.run_dir)) >= step
    finally:
        second.cancel(relaunch)
    _assert_each_point_once(job.run_dir)
