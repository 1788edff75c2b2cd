"""The trainer as it really runs: `python -m trainer` processes (and `accelerate launch` with
two gloo ranks: DDP, and FSDP2 with gradient clipping against the same DDP run), a real MLflow
server, faults injected for real (SIGKILL, SIGTERM, corrupt checkpoints, an unreachable server,
out-of-memory, NaN).

Tiny model (hidden 32, 2 layers, vocab 384, seq 32) and 12 steps so the whole module
stays around two minutes on 2 shared cores. Loss equality across runs is bitwise
(`==` on the floats), which CPU + deterministic mode guarantees. Losses are read from
`metrics.jsonl` (train/loss at every step, each step recorded once: a resumed run does
not re-record the steps it repeats), never from log text.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.infra.trainer_runs import (  # noqa: F401 - data_dir is a fixture
    STEPS,
    data_dir,
    free_port,
    metrics_jsonl,
    run_trainer,
    step_losses,
    train_here,
)


def assert_same_losses(run_dir: Path, reference: dict[int, float]) -> None:
    seen = step_losses(run_dir)
    assert sorted(seen) == sorted(reference)
    for step, loss in seen.items():
        assert loss == reference[step], f"step {step}: {loss!r} != {reference[step]!r}"


def mlflow_points(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, data_dir: Path, mlflow_server: Any) -> dict[str, Any]:  # noqa: F811
    """One uninterrupted single-rank run: its per-step losses are the reference for the rest."""
    tmp = tmp_path_factory.mktemp("reference")
    run_dir = tmp / "ref"
    run_dir.mkdir()
    identity = {"run_id": "ref-0001", "experiment": "trainer-test", "seed": 7, "code_version": "abc123",
                "dirty": False, "spec_hash": "x", "data_version": "y", "pr": 42, "launcher": "local"}
    (run_dir / "identity.json").write_text(json.dumps(identity))
    code, run_dir = train_here(tmp, data_dir, "ref", uri=mlflow_server.uri)
    assert code == 0
    losses = step_losses(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    return {"run_dir": run_dir, "losses": losses, "identity": identity}


def test_run_writes_contract_files_and_logs_each_point_once(reference: dict[str, Any], mlflow_server: Any) -> None:
    from mlflow.tracking import MlflowClient

    from trainer.checkpoint.format import list_checkpoints, verify_checkpoint

    run_dir = reference["run_dir"]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "finished" and result["steps"] == STEPS
    assert result["tokens"] == STEPS * 4 * 32
    for key in ("eval/loss", "eval/bpb", "eval/code/loss", "eval/docs/bpb", "train/loss", "perf/tokens_per_s",
                "perf/mfu", "perf/peak_mem_gb"):
        assert key in result["final_metrics"], key
    assert result["final_metrics"]["eval/loss"] < 6.0  # ln(384) = 5.95 at random init
    assert {"torch", "transformers", "cpu_model", "gpu_model", "world_size"} <= set(result["env"])
    assert {p.name for p in (run_dir / "model").iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    # The export was loaded where it was written, as its config.json says (issue 38).
    assert result["export"]["loadable"] is True, result["export"]
    assert result["export"]["verified"].startswith("verified on the export: LlamaForCausalLM (model_type llama) loads "
                                                   "it with no missing or unexpected keys")
    assert json.loads((run_dir / "model" / "export.json").read_text())["export"]["verified"] == result["export"]["verified"]
    # Checkpoints: last 3 kept (4, 8, 12), each verifies.
    steps = [s for s, _ in list_checkpoints(run_dir / "checkpoints")]
    assert steps == [12, 8, 4]
    assert all(verify_checkpoint(p) is None for _, p in list_checkpoints(run_dir / "checkpoints"))
    state = json.loads((run_dir / "checkpoints" / "step_000008" / "train_state.json").read_text())
    assert state["step"] == 8 and state["mlflow_run_id"] == result["mlflow_run_id"]

    # metrics.jsonl: each (key, step) once; train/loss at every step equals the log.
    points = metrics_jsonl(run_dir)
    assert len({(p["key"], p["step"]) for p in points}) == len(points)
    train_loss = {p["step"]: p["value"] for p in points if p["key"] == "train/loss"}
    assert train_loss == reference["losses"]
    assert {f"data/mix/{s}" for s in ("code", "docs", "reference")} <= {p["key"] for p in points}

    # MLflow: same points, once each; tags from identity.json and the environment.
    run = MlflowClient(mlflow_server.uri).get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert mlflow_points(mlflow_server.uri, run.info.run_id, "train/loss") == sorted(train_loss.items())
    assert run.data.tags["pipeline.pr"] == "42" and run.data.tags["pipeline.code_version"] == "abc123"
    assert "env.torch" in run.data.tags and run.data.params["model.hidden_size"] == "32"
    assert [s for s, _ in mlflow_points(mlflow_server.uri, run.info.run_id, "eval/loss")] == [6, 12]


@pytest.mark.parametrize(("kill_at", "resume_at"), [(6, 4), (11, 8)])
def test_sigkill_between_checkpoints_then_resume_is_bitwise_identical(
        tmp_path: Path, data_dir: Path, reference: dict[str, Any], mlflow_server: Any, kill_at: int, resume_at: int) -> None:  # noqa: F811
    """Killed between checkpoints (every 4 steps, written asynchronously); the resumed run
    repeats the lost steps with the same losses, continues the same MLflow run, logs each point once."""
    code, run_dir = run_trainer(tmp_path, data_dir, "killed", uri=mlflow_server.uri, async_checkpoint=True,
                                env={"TRAINER_FAULT_SIGKILL_AT_STEP": str(kill_at)})
    assert code == -signal.SIGKILL
    assert not (run_dir / "result.json").exists()
    run_id = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    code, _ = train_here(tmp_path, data_dir, "killed", uri=mlflow_server.uri, async_checkpoint=True)
    assert code == 0
    result = json.loads((run_dir / "result.json").read_text())
    assert result["resumed_from"].endswith(f"step_{resume_at:06d}") and result["mlflow_run_id"] == run_id
    assert_same_losses(run_dir, reference["losses"])
    assert mlflow_points(mlflow_server.uri, run_id, "train/loss") == sorted(reference["losses"].items())
    points = metrics_jsonl(run_dir)
    assert len({(p["key"], p["step"]) for p in points}) == len(points)


def test_corrupt_and_truncated_checkpoints_are_skipped_with_an_alert(
        tmp_path: Path, data_dir: Path, reference: dict[str, Any]) -> None:  # noqa: F811
    run_dir = tmp_path / "corrupt"
    shutil.copytree(reference["run_dir"] / "checkpoints", run_dir / "checkpoints")
    newest = run_dir / "checkpoints" / "step_000012" / "optimizer.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    newest.write_bytes(bytes(data))
    truncated = run_dir / "checkpoints" / "step_000008" / "model.safetensors"
    truncated.write_bytes(truncated.read_bytes()[:100])
    code, _ = train_here(tmp_path, data_dir, "corrupt", run_dir=run_dir)
    assert code == 0
    result = json.loads((run_dir / "result.json").read_text())
    assert result["resumed_from"].endswith("step_000004")
    alerts = [json.loads(line) for line in (run_dir / "alerts.jsonl").read_text().splitlines()]
    skipped = [a["message"] for a in alerts if a["kind"] == "checkpoint_corrupt"]
    assert any("step_000012" in m and "optimizer.pt sha256 mismatch" in m for m in skipped)
    assert any("step_000008" in m and "model.safetensors" in m and "truncated" in m for m in skipped)
    assert_same_losses(run_dir, {s: v for s, v in reference["losses"].items() if s > 4})


def test_sigterm_saves_a_checkpoint_and_exits_143_then_resumes(
        tmp_path: Path, data_dir: Path, reference: dict[str, Any]) -> None:  # noqa: F811
    code, run_dir = train_here(tmp_path, data_dir, "term", env={"TRAINER_FAULT_SIGTERM_AT_STEP": "5"})
    assert code == 143
    from trainer.checkpoint.format import list_checkpoints, verify_checkpoint

    newest_step, newest = list_checkpoints(run_dir / "checkpoints")[0]
    assert newest_step == 6 and verify_checkpoint(newest) is None  # saved at the end of the step that saw the signal
    code, _ = train_here(tmp_path, data_dir, "term")
    assert code == 0
    assert json.loads((run_dir / "result.json").read_text())["resumed_from"].endswith("step_000006")
    assert_same_losses(run_dir, reference["losses"])


def test_mlflow_down_for_the_whole_run_then_spool_replayed_once(
        tmp_path: Path, data_dir: Path, reference: dict[str, Any], mlflow_server: Any) -> None:  # noqa: F811
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    code, run_dir = train_here(tmp_path, data_dir, "offline", uri=dead)
    assert code == 0
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "finished" and result["mlflow_run_id"] is None
    spooled = (run_dir / "mlflow_spool.jsonl").read_text().splitlines()
    assert len([r for r in spooled if '"t": "m"' in r]) == len(metrics_jsonl(run_dir))

    from trainer.spool_replay import replay_spool

    for _ in range(2):  # replaying twice must not duplicate anything
        replay_spool(run_dir, mlflow_server.uri)
    result = json.loads((run_dir / "result.json").read_text())
    run_id = result["mlflow_run_id"]
    assert run_id and not (run_dir / "mlflow_spool.jsonl").exists()
    assert mlflow_points(mlflow_server.uri, run_id, "train/loss") == sorted(reference["losses"].items())
    for p in metrics_jsonl(run_dir):
        assert len(mlflow_points(mlflow_server.uri, run_id, p["key"])) == len(
            [q for q in metrics_jsonl(run_dir) if q["key"] == p["key"]])


def test_oom_fallback_halves_micro_batch_keeps_global_batch(
        tmp_path: Path, data_dir: Path, reference: dict[str, Any]) -> None:  # noqa: F811
    code, run_dir = train_here(tmp_path, data_dir, "oom", env={"TRAINER_INJECT_OOM_AT_STEP": "3"})
    assert code == 0
    result = json.loads((run_dir / "result.json").read_text())
    assert (result["micro_batch_size"], result["grad_accum_steps"], result["oom_fallbacks"]) == (2, 2, 1)
    alerts = [json.loads(line) for line in (run_dir / "alerts.jsonl").read_text().splitlines()]
    assert any(a["kind"] == "oom_fallback" for a in alerts)
    # Same rows, same token-weighted objective: only the summation order differs.
    for step, loss in step_losses(run_dir).items():
        assert loss == pytest.approx(reference["losses"][step], abs=1e-5)  # measured <= 5e-7
    state = json.loads((run_dir / "checkpoints" / "step_000008" / "train_state.json").read_text())
    assert (state["micro_batch_size"], state["grad_accum_steps"]) == (2, 2)


def test_oom_below_the_floor_stops_with_what_to_change(tmp_path: Path, data_dir: Path) -> None:  # noqa: F811
    code, run_dir = train_here(tmp_path, data_dir, "oomfloor", min_micro_batch_size=4,
                                env={"TRAINER_INJECT_OOM_AT_STEP": "2"})
    assert code == 5
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "failed" and "min_micro_batch_size" in result["error"]


def test_nan_loss_rolls_back_to_last_checkpoint_and_skips_batches(tmp_path: Path, data_dir: Path) -> None:  # noqa: F811
    code, run_dir = train_here(tmp_path, data_dir, "nan", alerts={"spike_policy": "rollback", "rollback_skip_batches": 3},
                               env={"TRAINER_INJECT_NAN_AT_STEP": "6"})
    assert code == 0
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "finished" and result["rollbacks"] == 1
    kinds = [json.loads(line)["kind"] for line in (run_dir / "alerts.jsonl").read_text().splitlines()]
    assert "divergence" in kinds and "rollback" in kinds
    state = json.loads((run_dir / "checkpoints" / "step_000012" / "train_state.json").read_text())
    assert state["data_offset"] == (6 - 4) + 3  # steps 5-6 undone, 3 batches skipped
    losses = step_losses(run_dir)  # step 6's NaN is not recorded; repeated step 5 is recorded once
    assert sorted(losses) == list(range(1, STEPS + 1)) and all(math.isfinite(v) for v in losses.values())


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> dict[str, Any]:  # noqa: F811
    """One uninterrupted 2-rank run (micro 2 per rank): the reference for every 2-rank layout."""
    tmp = tmp_path_factory.mktemp("ddp-reference")
    code, run_dir = run_trainer(tmp, data_dir, "ddp-ref", ranks=2, micro_batch_size=2)
    assert code == 0, (run_dir / "stdout-0.log").read_text()[-3000:]
    return {"run_dir": run_dir, "losses": step_losses(run_dir)}


def test_two_gloo_ranks_match_one_rank_and_resume_exactly(
        tmp_path: Path, data_dir: Path, reference: dict[str, Any], ddp_reference: dict[str, Any]) -> None:  # noqa: F811
    """2 ranks x micro 2 see the same global rows as 1 rank x micro 4; the loss is the
    token-weighted mean of the global batch in both, so only float summation order differs.
    Killed at step 6 and resumed from step 4: bitwise equal to the uninterrupted 2-rank run."""
    for step, loss in ddp_reference["losses"].items():
        assert loss == pytest.approx(reference["losses"][step], abs=1e-5)  # 2 ranks vs 1: measured <= 1e-6
    code, run_dir = run_trainer(tmp_path, data_dir, "ddp", ranks=2, micro_batch_size=2,
                                env={"TRAINER_FAULT_SIGKILL_AT_STEP": "6"})
    assert code != 0  # rank 0 killed; the launcher tears rank 1 down
    assert max(step_losses(run_dir)) == 6
    code, _ = run_trainer(tmp_path, data_dir, "ddp", ranks=2, micro_batch_size=2)
    assert code == 0, (run_dir / "stdout-1.log").read_text()[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["resumed_from"].endswith("step_000004") and result["world_size"] == 2
    assert_same_losses(run_dir, ddp_reference["losses"])
    checksums = result["param_checksums"]
    assert len(checksums) == 2 and checksums[0] == checksums[1]  # replicas identical after the resume


def test_fsdp2_with_clipping_matches_ddp_within_1e6(
        tmp_path: Path, data_dir: Path, ddp_reference: dict[str, Any]) -> None:  # noqa: F811
    """FSDP2 on the same two ranks and spec as the 2-rank DDP reference, whose gradients are
    clipped (grad_clip 1.0, the default, and some steps' norms exceed it): the norm of the sharded
    gradients may be reduced in another order, so the losses are held to 1e-6, not to bitwise
    equality (measured equal with this spec)."""
    grad_norms = [p["value"] for p in metrics_jsonl(ddp_reference["run_dir"]) if p["key"] == "train/grad_norm"]
    assert max(grad_norms) > 1.0  # clipping really acts in this run
    code, run_dir = run_trainer(tmp_path, data_dir, "fsdp-clip", ranks=2, micro_batch_size=2,
                                parallel={"dp": 2, "fsdp": True})
    assert code == 0, (run_dir / "stdout-0.log").read_text()[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["layout"]["fsdp"] and result["layout"]["sharded"]
    want, got = ddp_reference["losses"], step_losses(run_dir)
    assert sorted(got) == sorted(want)
    for step in want:
        assert got[step] == pytest.approx(want[step], abs=1e-6), step


def test_mlflow_server_down_then_back_mid_run_records_every_point_once(tmp_path: Path) -> None:
    """The sink against a real server that is absent for the first half and started on the
    same port for the second: spooled points are replayed first, then the new ones; a
    replay that repeats already-acknowledged points records nothing twice."""
    from tests.infra.mlflow_server import MlflowServer
    from trainer.metric_sinks import SPOOL, MlflowSink

    port = free_port()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sink = MlflowSink(f"http://127.0.0.1:{port}", "sink-restart", run_dir)
    assert sink.run_id is None
    for step in range(1, 6):
        sink.log_metrics(step, {"train/loss": 1.0 / step, "train/lr": 0.1})
    sink.flush()
    assert (run_dir / SPOOL).is_file()
    with MlflowServer(tmp_path / "server", port) as server:
        for step in range(6, 11):
            sink.log_metrics(step, {"train/loss": 1.0 / step, "train/lr": 0.1})
        sink.flush(force=True)  # the server is back: spool first, then the new points
        assert not (run_dir / SPOOL).exists() and sink.run_id
        # A resumed process repeats steps 8-10 (as after a kill): nothing is recorded twice.
        again = MlflowSink(server.uri, "sink-restart", run_dir)
        assert again.run_id == sink.run_id
        for step in range(8, 13):
            again.log_metrics(step, {"train/loss": 1.0 / step})
        again.close("finished")
        losses = mlflow_points(server.uri, sink.run_id, "train/loss")
        assert [s for s, _ in losses] == list(range(1, 13))
        assert len(mlflow_points(server.uri, sink.run_id, "train/lr")) == 10


def test_init_from_an_exported_model_starts_from_its_weights(
        tmp_path: Path, data_dir: Path, reference: dict[str, Any]) -> None:  # noqa: F811
    exported = reference["run_dir"] / "model"
    code, run_dir = train_here(tmp_path, data_dir, "warm", model={"init_from": str(exported)}, max_steps=2,
                               eval_interval=100, checkpoint_interval=100)
    assert code == 0
    first = step_losses(run_dir)[1]
    assert first < reference["losses"][1] - 0.3  # trained weights, not a random init (ln 384 = 5.95)
