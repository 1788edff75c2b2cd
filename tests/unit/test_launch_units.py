"""Pure parts of the launchers: retry rules, accelerate command lines, the sbatch script, Slurm states."""

from __future__ import annotations

from pathlib import Path

import pytest

from basics.errors import LaunchError
from pipelines.launchers import LaunchHandle, LaunchJob, Phase, Verdict, classify, get_launcher, job_from_spec
from pipelines.launchers.commands import Rendezvous, accelerate_command, launch_env
from pipelines.launchers.logtail import LogTail
from pipelines.launchers.slurm import parse_scontrol, render_sbatch, state_from_fields
from pipelines.launchers.static import node_rank_of


def _job(tmp_path: Path, **kw: object) -> LaunchJob:
    base = dict(spec_path=tmp_path / "run/spec.resolved.json", run_dir=tmp_path / "run", data_dir=tmp_path / "cache")
    return LaunchJob(**(base | kw))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- retry rules


@pytest.mark.parametrize(
    ("exit_code", "status", "cancelled", "phase", "verdict"),
    [
        (0, "finished", False, None, Verdict.SUCCESS),
        (0, None, False, None, Verdict.SUCCESS),
        (1, None, False, None, Verdict.RETRY),  # Python crash, or accelerate's summary of any rank failure
        (-9, None, False, None, Verdict.RETRY),  # SIGKILL / OOM killer
        (137, None, False, None, Verdict.RETRY),
        (143, None, False, None, Verdict.RETRY),  # preemption: the trainer checkpointed
        (5, "failed", False, None, Verdict.GIVE_UP),  # a bad result is not retried
        (5, "stopped", False, None, Verdict.GIVE_UP),  # divergence / alert policy stop
        (143, "stopped", False, None, Verdict.RETRY),  # killed by SIGTERM wins over an old stop
        (2, None, False, None, Verdict.GIVE_UP),  # usage / spec error: deterministic
        (11, None, False, None, Verdict.GIVE_UP),  # doctor refused
        (143, None, True, None, Verdict.GIVE_UP),  # cancelled by a user
        (None, None, False, Phase.LOST, Verdict.RETRY),  # node failure
        (0, None, False, Phase.TIMEOUT, Verdict.RETRY),
    ],
)
def test_retry_rules(exit_code, status, cancelled, phase, verdict):
    assert classify(exit_code, status, cancelled, phase).verdict is verdict


# --------------------------------------------------------------------------- accelerate command lines


def test_cpu_single_process_is_one_plain_process(tmp_path):
    cmd = accelerate_command(_job(tmp_path), Rendezvous())
    assert cmd[1:4] == ["-m", "accelerate.commands.launch", "--cpu"]
    assert "--multi_gpu" not in cmd and "--main_process_port" not in cmd
    assert cmd[cmd.index("-m", 3):][:2] == ["-m", "trainer"]


def test_cpu_processes_use_multi_gpu_with_gloo_switches(tmp_path):
    job = _job(tmp_path, procs_per_node=2, tracking_uri="http://127.0.0.1:5000")
    cmd = accelerate_command(job, Rendezvous(main_port=12345))
    joined = " ".join(cmd)
    assert "--multi_gpu --num_processes 2" in joined
    assert "--num_machines 1 --mixed_precision no --dynamo_backend no" in joined
    assert "--main_process_port 12345" in joined and "--machine_rank" not in joined
    assert joined.endswith(f"--spec {job.spec_path} --run-dir {job.run_dir} --data-dir {job.data_dir} "
                           "--tracking-uri http://127.0.0.1:5000")
    env = launch_env(job, base={})
    assert env["ACCELERATE_USE_CPU"] == "true" and env["MLFLOW_DISABLE_TELEMETRY"] == "true"


def test_multi_node_gpu_counts_every_process_and_passes_machine_rank(tmp_path):
    job = _job(tmp_path, nodes=2, procs_per_node=8, use_gpu=True)
    cmd = " ".join(accelerate_command(job, Rendezvous(num_machines=2, machine_rank=1, main_ip="10.0.0.1",
                                                      main_port=29400)))
    assert "--num_processes 16 --multi_gpu" in cmd and "--cpu" not in cmd
    assert "--num_machines 2" in cmd and "--machine_rank 1" in cmd and "--main_process_ip 10.0.0.1" in cmd
    assert "ACCELERATE_USE_CPU" not in launch_env(job, base={})


# --------------------------------------------------------------------------- Slurm


def test_sbatch_script_has_resources_and_per_node_rank(tmp_path):
    job = _job(tmp_path, nodes=2, procs_per_node=4, use_gpu=True, partition="gpu", time_limit_minutes=90,
               env={"WANDB_MODE": "off it's quoted"}, max_restarts=2)
    script = render_sbatch(job, python="/opt/venv/bin/python")
    for directive in ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:4", "--cpus-per-task=16", "--time=90",
                      "--partition=gpu", "--requeue", f"--output={job.run_dir}/logs/slurm-%j.out",
                      f"--error={job.run_dir}/logs/slurm-%j.err"):
        assert f"#SBATCH {directive}\n" in script
    assert "scontrol show hostnames \"$SLURM_JOB_NODELIST\"" in script
    assert "MAIN_PORT=$((20000 + SLURM_JOB_ID % 20000))" in script
    assert "pipelines.doctor" in script and "--max-restarts 2" in script
    # The per-node command is one single-quoted word: $SLURM_NODEID reaches each task's shell unexpanded.
    node_line = script.splitlines()[-1]
    quoted = node_line[node_line.index("bash -c ") + len("bash -c "):]
    assert quoted.startswith("'") and quoted.endswith("'")
    assert '--machine_rank "$SLURM_NODEID"' in quoted and '--num_machines "$SLURM_NNODES"' in quoted
    assert "export WANDB_MODE='off it'\"'\"'s quoted'" in script


def test_scontrol_fields_map_to_phases():
    text = ("JobId=7 JobName=run UserId=root(0) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) "
            "Requeue=1 Restarts=1 BatchFlag=1 ExitCode=1:0 NodeList=n[1-2]")
    fields = parse_scontrol(text)
    state = state_from_fields(fields, None, cancelled=False)
    assert state.phase is Phase.FAILED and state.exit_code == 1 and "restarts=1" in state.detail
    assert state_from_fields({"JobState": "COMPLETING"}, None, False).phase is Phase.RUNNING
    assert state_from_fields({"JobState": "NODE_FAIL", "ExitCode": "0:9"}, None, False).exit_code == -9
    assert state_from_fields({"JobState": "FAILED", "ExitCode": "143:0"}, None, True).phase is Phase.CANCELLED


# --------------------------------------------------------------------------- handles, registry, static


def test_handle_round_trips_through_run_dir(tmp_path):
    handle = LaunchHandle(launcher="slurm", job_id="42", run_dir=tmp_path, extra={"logs": ["a", "b"]})
    handle.save()
    assert LaunchHandle.load(tmp_path) == handle


def test_get_launcher_names():
    assert {get_launcher(n).name for n in ("local", "slurm", "static")} == {"local", "slurm", "static"}
    with pytest.raises(LaunchError, match="unknown launcher 'kubernetes'"):
        get_launcher("kubernetes")


def test_static_node_rank_from_env_and_bounds(tmp_path, monkeypatch):
    job = _job(tmp_path, nodes=2, rendezvous="10.1.2.3:29400")
    monkeypatch.delenv("NODE_RANK", raising=False)
    with pytest.raises(LaunchError, match="NODE_RANK"):
        node_rank_of(job)
    monkeypatch.setenv("NODE_RANK", "1")
    assert node_rank_of(job) == 1
    monkeypatch.setenv("NODE_RANK", "2")
    with pytest.raises(LaunchError, match="outside 0..1"):
        node_rank_of(job)


def test_job_from_spec_takes_resources(tmp_path):
    from tests.infra.launch_helpers import tiny_spec_dict
    from validation.spec import ExperimentSpec

    spec = ExperimentSpec.model_validate(tiny_spec_dict(tmp_path, nodes=2, procs=2, launcher="slurm", max_restarts=5))
    job = job_from_spec(spec, spec_path=tmp_path / "s.json", run_dir=tmp_path / "r", data_dir=tmp_path / "c")
    assert (job.nodes, job.procs_per_node, job.world_size, job.use_gpu, job.max_restarts) == (2, 2, 4, False, 5)


def test_log_tail_sends_only_complete_new_lines(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("one\ntw")
    seen: list[str] = []
    tail = LogTail([log])
    tail.pump(seen.append)
    with log.open("a") as fh:
        fh.write("o\nthree")
    tail.pump(seen.append)
    tail.pump(seen.append, final=True)
    assert seen == ["one", "two", "three"]


def test_run_with_retries_submits_a_self_retrying_launcher_once(tmp_path):
    from pipelines.launchers import JobState, run_with_retries

    class CrashingSelfRetrying:
        """A launcher whose jobs retry inside (like Slurm) and always end crashed."""

        name = "fake"
        retries_inside = True

        def __init__(self) -> None:
            self.submits = 0

        def submit(self, job):
            self.submits += 1
            return LaunchHandle(launcher="fake", job_id=str(self.submits), run_dir=job.run_dir)

        def poll(self, handle):
            return JobState(Phase.FAILED, 1)

        def wait(self, handle, timeout=None, on_log=None):
            return self.poll(handle)

        def cancel(self, handle):
            return self.poll(handle)

    launcher = CrashingSelfRetrying()
    outcome = run_with_retries(launcher, _job(tmp_path, max_restarts=3))
    assert launcher.submits == 1 and outcome.attempts == 1 and outcome.decisions[0].verdict is Verdict.RETRY


def test_slurm_refuses_a_run_directory_with_whitespace_before_writing_anything(tmp_path):
    """sbatch splits an #SBATCH line at whitespace: `--output=/runs/my run/...` would name
    another file (found by the Slurm sweep bench in a temporary folder with a space)."""
    from basics.errors import LaunchError
    from pipelines.launchers.slurm import SlurmLauncher

    job = _job(tmp_path / "with space")
    with pytest.raises(LaunchError, match="contains whitespace"):
        SlurmLauncher().submit(job)
    assert not (tmp_path / "with space").exists()
