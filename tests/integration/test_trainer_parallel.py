"""Sharded layouts as they really run: `accelerate launch` with two gloo ranks on CPU, FSDP2
and tensor parallelism, sharded checkpoints (torch.distributed.checkpoint) resumed on the
same, a smaller and a larger number of ranks, a truncated shard, the streamed export, and
downstream scoring after a sharded run: rank 0 scores the export once while rank 1 waits, and
the per-example records reach the run's MLflow run as artifacts (the session's MLflow server
keeps them under its artifacts folder: read as files).

Same tiny model and data as tests/infra/trainer_runs.py; 20 steps, no evaluation until the
end. Reference runs are module fixtures shared by the tests; the FSDP and TP runs also carry
`eval.tasks` (scored after training, so their losses are those of plain runs). Losses come
from metrics.jsonl. Elsewhere: FSDP2 with gradient clipping against DDP in
tests/integration/test_trainer_runs.py (it shares that module's 2-rank DDP run); SIGKILL of an
FSDP2 run between checkpoints resumed bitwise in tests/integration/test_models_training.py
(2 local ranks, rank 0 killed) and tests/integration/test_launch_multinode_fsdp.py (AdamW, the
static and Slurm launchers' relaunch).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.infra.lm_eval_tasks import choice_task
from tests.infra.trainer_runs import data_dir, run_trainer, step_losses, train_here  # noqa: F401 - fixture

STEPS = 20
FP32_ULPS = 4 * 2.0**-23
"""Relative tolerance of 4 float32 ulps: a layout that reduces in another order."""
COMMON: dict[str, Any] = {"max_steps": STEPS, "micro_batch_size": 2, "eval_interval": 1000, "checkpoint_interval": 5,
                          "keep_last": 4, "grad_clip": 0.0}
FSDP = {"dp": 2, "fsdp": True}
# Untied output weights: with a tied embedding / LM head the shared tensor's gradient is summed
# in another order under FSDP (measured: 7e-9 max difference after one backward), so the
# bitwise comparison uses the untied model; everything else does not depend on it.
MODEL = {"tie_word_embeddings": False}


def _ok(code: int, run_dir: Path) -> None:
    logs = sorted(run_dir.glob("stdout-*.log"))
    assert code == 0, logs[-1].read_text()[-4000:] if logs else (run_dir / "logs" / "rank0.log").read_text()[-4000:]


def _result(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "result.json").read_text())


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`eval.tasks` for the FSDP and TP runs: one tiny local multiple-choice task, 6 examples."""
    task = choice_task(tmp_path_factory.mktemp("tasks"))
    return {"name": "trainer-parallel", "eval": {"tasks": [{"path": str(task), "limit": 6}]}}


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> dict[str, Any]:  # noqa: F811
    code, run_dir = run_trainer(tmp_path_factory.mktemp("ddp"), data_dir, "ddp", ranks=2, model=MODEL, **COMMON)
    _ok(code, run_dir)
    return {"run_dir": run_dir, "losses": step_losses(run_dir)}


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory: pytest.TempPathFactory, data_dir: Path, tasks: dict[str, Any]) -> dict[str, Any]:  # noqa: F811
    code, run_dir = run_trainer(tmp_path_factory.mktemp("fsdp"), data_dir, "fsdp", ranks=2, parallel=FSDP, model=MODEL,
                                sections=tasks, **COMMON)
    _ok(code, run_dir)
    return {"run_dir": run_dir, "losses": step_losses(run_dir)}


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> dict[str, Any]:  # noqa: F811
    """One process, micro 4: the same global batch as 2 ranks x micro 2."""
    code, run_dir = train_here(tmp_path_factory.mktemp("single"), data_dir, "single", model=MODEL,
                               **(COMMON | {"micro_batch_size": 4}))
    _ok(code, run_dir)
    return {"run_dir": run_dir, "losses": step_losses(run_dir)}


def test_fsdp2_is_really_sharded_and_bitwise_equal_to_ddp(ddp: dict[str, Any], fsdp: dict[str, Any]) -> None:
    assert sorted(fsdp["losses"]) == list(range(1, STEPS + 1))
    for step, loss in ddp["losses"].items():
        assert fsdp["losses"][step] == loss, f"step {step}: FSDP {fsdp['losses'][step]!r} != DDP {loss!r}"
    result = _result(fsdp["run_dir"])
    layout = result["layout"]
    assert layout["sharded"] and layout["fsdp"] and layout["dp"] == 2
    assert layout["params_on_rank0"] <= result["n_params"] * 0.52  # about half: really sharded
    assert not _result(ddp["run_dir"])["layout"]["sharded"]
    # Sharded checkpoints: every rank its own shard, each listed with its sha256 in the manifest.
    newest = fsdp["run_dir"] / "checkpoints" / f"step_{STEPS:06d}"
    manifest = json.loads((newest / "MANIFEST.json").read_text())
    assert manifest["format"] == "dcp" and {"__0_0.distcp", "__1_0.distcp", ".metadata", "rng_rank0.pt",
                                            "rng_rank1.pt", "train_state.json"} <= set(manifest["files"])
    assert not (newest / "model.safetensors").exists()


def test_fsdp2_export_streamed_from_shards_equals_ddp_export(ddp: dict[str, Any], fsdp: dict[str, Any]) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    a = load_file(str(ddp["run_dir"] / "model" / "model.safetensors"))
    b = load_file(str(fsdp["run_dir"] / "model" / "model.safetensors"))
    assert set(a) == set(b)
    for key in a:
        assert (a[key] == b[key]).all(), key
    model = AutoModelForCausalLM.from_pretrained(fsdp["run_dir"] / "model")  # a loadable HF model
    assert sum(p.numel() for p in model.parameters()) == _result(fsdp["run_dir"])["n_params"]


def _resume_copy(src: Path, dst: Path, step: int) -> None:
    name = f"step_{step:06d}"
    (dst / "checkpoints").mkdir(parents=True)
    shutil.copytree(src / "checkpoints" / name, dst / "checkpoints" / name)


def test_sharded_checkpoint_resumes_on_one_process(
        tmp_path: Path, data_dir: Path, fsdp: dict[str, Any]) -> None:  # noqa: F811
    """2 ranks (FSDP) -> 1 process (no process group): DCP reshards; the global batch
    (micro 2 x 2 ranks -> micro 2 x accum 2) and the data position continue."""
    run_dir = tmp_path / "two-to-one"
    _resume_copy(fsdp["run_dir"], run_dir, 10)
    code, _ = train_here(tmp_path, data_dir, "two-to-one", run_dir=run_dir, model=MODEL, **COMMON)
    _ok(code, run_dir)
    result = _result(run_dir)
    assert result["resumed_from"].endswith("step_000010") and (result["micro_batch_size"], result["grad_accum_steps"]) == (2, 2)
    got = step_losses(run_dir)
    assert sorted(got) == list(range(11, STEPS + 1))  # nothing repeated, nothing skipped
    for step in got:
        assert got[step] == pytest.approx(fsdp["losses"][step], abs=1e-6), step


def test_one_process_checkpoint_resumes_sharded_on_two_ranks(
        tmp_path: Path, data_dir: Path, single: dict[str, Any]) -> None:  # noqa: F811
    """1 process -> 2 FSDP ranks: the one-process checkpoint is streamed into the shards."""
    run_dir = tmp_path / "one-to-two"
    _resume_copy(single["run_dir"], run_dir, 10)
    code, _ = run_trainer(tmp_path, data_dir, "one-to-two", ranks=2, parallel=FSDP, run_dir=run_dir, model=MODEL,
                          **COMMON)
    _ok(code, run_dir)
    got = step_losses(run_dir)
    assert sorted(got) == list(range(11, STEPS + 1))
    assert _result(run_dir)["resumed_from"].endswith("step_000010")
    for step in got:
        # One process against two FSDP ranks: the reductions run in another order, so the losses
        # agree to a few float32 ulps (4.9156 differed by 2.5 ulps on this machine's torch 2.13
        # build at step 17, before and after this round), not bitwise.
        assert got[step] == pytest.approx(single["losses"][step], rel=FP32_ULPS), step


def test_truncated_shard_is_skipped_with_an_alert_naming_it(
        tmp_path: Path, data_dir: Path, fsdp: dict[str, Any]) -> None:  # noqa: F811
    run_dir = tmp_path / "truncated"
    shutil.copytree(fsdp["run_dir"] / "checkpoints", run_dir / "checkpoints")
    for stale in ("step_000020", "step_000015"):
        shutil.rmtree(run_dir / "checkpoints" / stale)
    shard = run_dir / "checkpoints" / "step_000010" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    code, _ = train_here(tmp_path, data_dir, "truncated", run_dir=run_dir, model=MODEL, **COMMON)
    _ok(code, run_dir)
    assert _result(run_dir)["resumed_from"].endswith("step_000005")
    alerts = [json.loads(line) for line in (run_dir / "alerts.jsonl").read_text().splitlines()]
    skipped = [a for a in alerts if a["kind"] == "checkpoint_corrupt"]
    assert skipped and skipped[0]["level"] == "P1"
    assert "step_000010" in skipped[0]["message"] and "__1_0.distcp" in skipped[0]["message"]
    assert "truncated" in skipped[0]["message"]


@pytest.fixture(scope="module")
def tp(tmp_path_factory: pytest.TempPathFactory, data_dir: Path, tasks: dict[str, Any],  # noqa: F811
       mlflow_server: Any) -> dict[str, Any]:
    """TP 2 (dp 1): both ranks read the same rows, micro 4 (the global batch of 2 ranks x micro 2).
    Logged to the session's MLflow server, so its downstream records are uploaded."""
    code, run_dir = run_trainer(tmp_path_factory.mktemp("tp"), data_dir, "tp", ranks=2, parallel={"dp": 1, "tp": 2},
                                model=MODEL, uri=mlflow_server.uri, sections=tasks,
                                **(COMMON | {"micro_batch_size": 4}))
    _ok(code, run_dir)
    return {"run_dir": run_dir, "losses": step_losses(run_dir)}


def test_tensor_parallel_two_matches_one_process(tp: dict[str, Any], single: dict[str, Any]) -> None:
    """TP=2 (dp 1: FSDP x TP = 1 x 2) vs one process: q/k/v/gate/up column-wise, o/down row-wise."""
    run_dir = tp["run_dir"]
    got = tp["losses"]
    assert sorted(got) == list(range(1, STEPS + 1))
    for step, loss in single["losses"].items():
        assert got[step] == pytest.approx(loss, abs=1e-5), step
    layout = _result(run_dir)["layout"]
    assert layout["tp"] == 2 and layout["sharded"] and layout["params_on_rank0"] < _result(run_dir)["n_params"]


def test_activation_checkpointing_recomputes_the_same_losses(
        tmp_path: Path, data_dir: Path, single: dict[str, Any]) -> None:  # noqa: F811
    """`train.activation_checkpointing`: the backward recomputes each layer; same numbers, bitwise.
    4 steps: their learning rates equal the 20-step run's (warmup 2, then cosine from 1.0)."""
    code, run_dir = train_here(tmp_path, data_dir, "ac", model=MODEL,
                               **(COMMON | {"micro_batch_size": 4, "max_steps": 4, "activation_checkpointing": True}))
    _ok(code, run_dir)
    got = step_losses(run_dir)
    assert sorted(got) == list(range(1, 5))
    for step, loss in got.items():
        assert loss == single["losses"][step], step


def test_fsdp2_bf16_computes_in_bf16_and_keeps_fp32_weights(
        tmp_path: Path, data_dir: Path, fsdp: dict[str, Any]) -> None:  # noqa: F811
    """precision bf16 under FSDP: MixedPrecisionPolicy(param bf16, reduce fp32); the sharded
    master weights (what checkpoints and the export hold) stay fp32."""
    from trainer.checkpoint.sharded import model_tensors

    code, run_dir = run_trainer(tmp_path, data_dir, "bf16", ranks=2, parallel=FSDP, model=MODEL,
                                **(COMMON | {"max_steps": 6, "precision": "bf16"}))
    _ok(code, run_dir)
    got = step_losses(run_dir)
    assert sorted(got) == list(range(1, 7)) and got[6] < got[1]
    # Step 1 sees the same weights and rows as the fp32 run: close, but computed in bf16.
    assert got[1] != fsdp["losses"][1] and abs(got[1] - fsdp["losses"][1]) < 0.05
    dtypes = {str(dtype) for _, dtype in model_tensors(run_dir / "checkpoints" / "step_000006").values()}
    assert dtypes == {"torch.float32"}


def test_hsdp_shards_inside_a_node_and_replicates_across_nodes(
        tmp_path: Path, data_dir: Path, fsdp: dict[str, Any]) -> None:  # noqa: F811
    """4 ranks as 2 nodes x 2: a (replicate, shard) mesh; each rank holds half the model; the
    global batch (4 ranks x micro 1) and the losses match 2-rank FSDP (reduction order aside)."""
    code, run_dir = run_trainer(tmp_path, data_dir, "hsdp", ranks=4, nodes=2, parallel={"dp": 4, "fsdp": True},
                                model=MODEL, **(COMMON | {"micro_batch_size": 1, "max_steps": 6}))
    _ok(code, run_dir)
    result = _result(run_dir)
    assert (result["layout"]["replicate"], result["layout"]["shard"]) == (2, 2)
    assert result["layout"]["params_on_rank0"] <= result["n_params"] * 0.52
    got = step_losses(run_dir)
    assert sorted(got) == list(range(1, 7))
    for step in range(1, 5):  # the first three updates use the same learning rates as the 20-step run
        assert got[step] == pytest.approx(fsdp["losses"][step], abs=1e-6), step


def test_tensor_parallel_checkpoint_resumes_on_one_process(
        tmp_path: Path, data_dir: Path, tp: dict[str, Any]) -> None:  # noqa: F811
    """TP degree 2 -> 1: the column/row-wise shards are reassembled by DCP."""
    run_dir = tmp_path / "tp-to-one"
    _resume_copy(tp["run_dir"], run_dir, 10)
    code, _ = train_here(tmp_path, data_dir, "tp-to-one", run_dir=run_dir, model=MODEL,
                         **(COMMON | {"micro_batch_size": 4}))
    _ok(code, run_dir)
    got = step_losses(run_dir)
    assert sorted(got) == list(range(11, STEPS + 1))
    for step in got:
        assert got[step] == pytest.approx(tp["losses"][step], abs=1e-6), step


def test_fsdp_checkpoint_resumes_under_ddp(tmp_path: Path, data_dir: Path, fsdp: dict[str, Any]) -> None:  # noqa: F811
    """FSDP -> DDP on the same two ranks: every replica loads the whole model from the shards."""
    run_dir = tmp_path / "fsdp-to-ddp"
    _resume_copy(fsdp["run_dir"], run_dir, 15)
    code, _ = run_trainer(tmp_path, data_dir, "fsdp-to-ddp", ranks=2, run_dir=run_dir, model=MODEL, **COMMON)
    _ok(code, run_dir)
    result = _result(run_dir)
    assert not result["layout"]["sharded"] and result["resumed_from"].endswith("step_000015")
    assert result["param_checksums"][0] == result["param_checksums"][1]
    got = step_losses(run_dir)
    assert sorted(got) == list(range(16, STEPS + 1))
    for step in got:
        assert got[step] == pytest.approx(fsdp["losses"][step], abs=1e-6), step


def test_async_sharded_checkpoints_validate_and_do_not_change_training(
        tmp_path: Path, data_dir: Path, fsdp: dict[str, Any]) -> None:  # noqa: F811
    """`async_checkpoint` under FSDP: shards staged to CPU, written by a background thread over
    its own process group, validated and published at the next save; the stall is recorded."""
    from trainer.checkpoint.format import list_checkpoints, verify_checkpoint

    code, run_dir = run_trainer(tmp_path, data_dir, "async", ranks=2, parallel=FSDP, model=MODEL,
                                **(COMMON | {"async_checkpoint": True}))
    _ok(code, run_dir)
    assert step_losses(run_dir) == fsdp["losses"]  # bitwise: saving in the background changes nothing
    result = _result(run_dir)
    assert result["checkpoint"]["mode"] == "async" and result["checkpoint"]["saves"] == 4
    assert result["checkpoint"]["stall_s_median"] is not None
    saved = list_checkpoints(run_dir / "checkpoints")
    assert [s for s, _ in saved] == [20, 15, 10, 5] and all(verify_checkpoint(p) is None for _, p in saved)
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".tmp")]


def test_tasks_are_scored_once_on_rank_0_under_fsdp_and_tp(
        fsdp: dict[str, Any], tp: dict[str, Any], mlflow_server: Any) -> None:
    """Downstream scoring after a sharded run (FSDP and TP, each its own training): rank 0 scores
    the export once while rank 1 waits; the TP run's per-example records reach its MLflow run as
    artifacts (the upload does not depend on the layout), the FSDP run (no MLflow) says why not."""
    pytest.importorskip("lm_eval")
    for name, run in (("fsdp", fsdp), ("tp", tp)):
        run_dir = run["run_dir"]
        result = _result(run_dir)
        assert result["layout"]["sharded"], name
        metrics = {k: v for k, v in result["final_metrics"].items() if k.startswith("eval/task/")}
        assert metrics["eval/task/tiny_choice/n"] == 6 and 0 <= metrics["eval/task/tiny_choice/acc"] <= 1
        logs = {rank: (run_dir / "logs" / f"rank{rank}.log").read_text() for rank in (0, 1)}
        assert "downstream tasks scored" in logs[0] and "downstream tasks scored" not in logs[1]
        local = (run_dir / "downstream" / "samples_tiny_choice.jsonl").read_bytes()
        assert len(local.splitlines()) == 6
        if name == "fsdp":
            assert result["downstream"]["mlflow_artifacts"] == "not uploaded: no MLflow run"
            continue
        assert result["downstream"]["mlflow_artifacts"] == "downstream"
        uploaded = {p.name: p for p in Path(mlflow_server.artifacts).rglob("*")
                    if result["mlflow_run_id"] in p.parts and p.parent.name == "downstream"}
        assert set(uploaded) == {"results.json", "samples_tiny_choice.jsonl"}
        assert uploaded["samples_tiny_choice.jsonl"].read_bytes() == local
