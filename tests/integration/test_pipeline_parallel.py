"""Pipeline parallelism (trainer/pipeline_parallel.py) on two gloo ranks against one process.

One launch checks the stages of three architectures (llama tied, llama_qknorm, nanogpt), one
schedule and activation checkpointing each (GPipe/none with per-block compile (aot_eager),
1F1B/selective, Interleaved 1F1B/full), against the one-process model: loss, gradient
norm (clipped) over two optimizer steps and an eval loss (tests/infra/pipeline_check.py). One
trainer run with pp 2 (1F1B), killed (SIGKILL of the first stage) and resumed from its DCP
checkpoint, then matches the one-process trainer's logged losses, gradient norms and eval loss,
redoes the lost step bitwise, and exports a model (streamed from the checkpoint). The same two
runs' step-2 checkpoints are then continued on the other layout (`--continue-from`'s seeding:
pp 2 -> one process, one process -> pp 2), and step 3 matches within float tolerance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.infra.model_variants import tiny
from tests.infra.pipeline_check import relative
from tests.infra.trainer_runs import REPO, data_dir, free_port, metrics_jsonl, run_trainer, train_here  # noqa: F401

TOLERANCE = 1e-3
RUN: dict[str, Any] = {"max_steps": 3, "micro_batch_size": 2, "grad_accum_steps": 2, "eval_interval": 1000,
                       "checkpoint_interval": 2}


def test_stages_of_three_architectures_match_one_process() -> None:
    cases = [{"model": json.loads(tiny(model_type, num_layers=4, vocab_size=384,
                                       max_position_embeddings=64).model_dump_json()),
              "schedule": schedule, "accum": 2, "checkpointing": checkpointing, "compile": backend}
             for model_type, schedule, checkpointing, backend in (
                 ("llama", "gpipe", "none", "aot_eager"), ("llama_qknorm", "1f1b", "selective", None),
                 ("nanogpt", "interleaved_1f1b", "full", None))]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), str(REPO / "tests" / "infra" / "pipeline_check.py"), json.dumps(cases)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(lines[0].removeprefix("RESULT "))
    assert results[0]["graphs"] >= 1  # the llama case's blocks ran compiled (aot_eager: dynamo's graphs)
    for case, result in zip(cases, results, strict=True):
        for key in ("loss", "grad_norm", "eval"):
            for staged, reference in result[key]:
                assert relative(staged, reference) <= TOLERANCE, (case["model"]["model_type"], key, staged, reference)


def _series(run_dir: Path) -> dict[tuple[int, str], list[float]]:
    """Every logged value per (step, key), in order."""
    keys = ("train/loss", "train/grad_norm", "eval/loss")
    out: dict[tuple[int, str], list[float]] = {}
    for p in metrics_jsonl(run_dir):
        if p["key"] in keys:
            out.setdefault((int(p["step"]), p["key"]), []).append(float(p["value"]))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> dict[str, Path]:  # noqa: F811
    """One process, and pp 2 (1F1B) killed after step 3 and resumed: each with a step-2 checkpoint."""
    tmp = tmp_path_factory.mktemp("pp")
    code, single = train_here(tmp, data_dir, "single", **RUN)
    assert code == 0
    # Rank 0 (the first stage, which logs) is killed with SIGKILL after step 3; the checkpoint of step 2 (DCP,
    # one file per stage) is resumed and step 3 is trained again, bitwise.
    code, staged = run_trainer(tmp, data_dir, "pp2", ranks=2, parallel={"dp": 1, "pp": 2},
                               env={"TRAINER_FAULT_SIGKILL_AT_STEP": "3"}, **RUN)
    assert code != 0 and not (staged / "result.json").exists()
    code, staged = run_trainer(tmp, data_dir, "pp2", ranks=2, parallel={"dp": 1, "pp": 2}, **RUN)
    assert code == 0, sorted(staged.glob("stdout-*.log"))[-1].read_text()[-4000:]
    return {"single": single, "pp2": staged, "tmp": tmp}


def _logged_steps(run_dir: Path, step: int) -> list[tuple[float, float]]:
    """(loss, grad_norm) of every `step=N` line rank 0 logged, in order."""
    out = []
    for line in (run_dir / "logs" / "rank0.log").read_text().splitlines():
        if f" trainer: step={step} loss=" in line:
            fields = dict(f.split("=", 1) for f in line.split(" trainer: ")[1].split())
            out.append((float(fields["loss"]), float(fields["grad_norm"])))
    return out


def test_two_stages_killed_resume_bitwise_and_match_one_process(runs: dict[str, Path]) -> None:
    single, staged = runs["single"], runs["pp2"]
    result = json.loads((staged / "result.json").read_text())
    assert result["status"] == "finished" and result["resumed_from"].endswith("step_000002")
    want, got = _series(single), _series(staged)
    assert set(want) == set(got) and any(key == "eval/loss" for _, key in want)
    # Step 3 before the kill and after the resume (rank 0's log keeps both; metrics.jsonl is cut
    # back to the checkpoint on resume): the same loss and norm, bitwise.
    redone = [line.split(" trainer: ")[1] for line in (staged / "logs" / "rank0.log").read_text().splitlines()
              if " trainer: step=3 loss=" in line]
    assert len(redone) == 2 and redone[0] == redone[1], redone
    for key, values in want.items():
        assert relative(got[key][-1], values[-1]) <= TOLERANCE, (key, got[key], values)
    assert (staged / "model" / "model.safetensors").is_file()


def test_two_stages_take_the_one_step_out_of_memory_fallback_and_deferred_reads(
        runs: dict[str, Path], data_dir: Path) -> None:  # noqa: F811
    """The stages run trainer/step.py's one step: an out-of-memory error on the last stage at step 2
    halves the micro batch on both stages (the schedule rebuilt for 4 micro-batches of 1), and with
    the loss and grad norm left on the device (the GPU path) every step still matches the
    uninterrupted pp 2 run (same rows and objective, another summation order)."""
    code, run = run_trainer(runs["tmp"], data_dir, "pp2-oom", ranks=2, parallel={"dp": 1, "pp": 2},
                            env={"TRAINER_INJECT_OOM_AT_STEP": "2", "TRAINER_INJECT_OOM_RANK": "1",
                                 "TRAINER_DEFER_STEP_METRICS": "1"}, **RUN | {"checkpoint_interval": 1000})
    assert code == 0, sorted(run.glob("stdout-*.log"))[-1].read_text()[-4000:]
    result = json.loads((run / "result.json").read_text())
    assert (result["micro_batch_size"], result["grad_accum_steps"], result["oom_fallbacks"]) == (1, 4, 1)
    assert any(json.loads(line)["kind"] == "oom_fallback" for line in (run / "alerts.jsonl").read_text().splitlines())
    for step in (1, 2, 3):
        (want,) = _logged_steps(runs["pp2"], step)[-1:]
        (got,) = _logged_steps(run, step)
        assert relative(got[0], want[0]) <= 1e-5 and relative(got[1], want[1]) <= 1e-5, (step, got, want)


def test_continue_between_two_stages_and_one_process_both_ways(runs: dict[str, Path], data_dir: Path) -> None:  # noqa: F811
    """`--continue-from` between pp 2 and pp 1: the pipeline's DCP shards (each stage its own
    parameters, the tied head as its own tensor on the last stage) load into the one model, and
    the one process's model.safetensors + optimizer.pt (tied head omitted, optimizer state by
    position) load into the two stages; step 3 then equals the uninterrupted run's."""
    from pipelines.continuation import Continuation, seed_run

    tmp = runs["tmp"]
    (want,) = _logged_steps(runs["single"], 3)
    for source, name, ranks, parallel in ((runs["pp2"], "pp2-to-1", 1, None),
                                          (runs["single"], "1-to-pp2", 2, {"dp": 1, "pp": 2})):
        target = tmp / name
        (target / "checkpoints").mkdir(parents=True)
        seed_run(Continuation(source, source / "checkpoints" / "step_000002", 2, {}, {}), target)
        code, _ = run_trainer(tmp, data_dir, name, ranks=ranks, parallel=parallel, run_dir=target, **RUN)
        assert code == 0, sorted(target.glob("stdout-*.log"))[-1].read_text()[-4000:]
        (got,) = _logged_steps(target, 3)
        assert relative(got[0], want[0]) <= 1e-5 and relative(got[1], want[1]) <= 1e-5, (name, got, want)
        alerts = (target / "alerts.jsonl").read_text()
        assert "resharded at step 2" in alerts and "pp 2" in alerts, alerts


def test_two_stages_times_two_replicas_match_one_process(runs: dict[str, Path], data_dir: Path) -> None:  # noqa: F811
    """pp 2 x dp 2 on four processes (stage-major ranks: 0, 1 run the first stage of replicas 0
    and 1, ranks 2, 3 the last): the same global batch (micro-batch 1 x 2 accumulation x 2
    replicas), the same losses, gradient norms and eval loss as one process."""
    code, run = run_trainer(runs["tmp"], data_dir, "pp2xdp2", ranks=4, parallel={"dp": 2, "pp": 2},
                            **RUN | {"micro_batch_size": 1, "checkpoint_interval": 1000})
    assert code == 0, sorted(run.glob("stdout-*.log"))[-1].read_text()[-4000:]
    want, got = _series(runs["single"]), _series(run)
    assert set(want) == set(got)
    for key, values in want.items():
        assert relative(got[key][-1], values[-1]) <= TOLERANCE, (key, got[key], values)


def test_two_stages_with_fsdp_over_two_replicas_continue_one_process(runs: dict[str, Path], data_dir: Path) -> None:  # noqa: F811
    """pp 2 x FSDP 2 (each stage sharded over its two replicas, torchtitan's PP x FSDP) continues
    the one process's step-2 checkpoint (full tensors sliced into each rank's shard of each
    stage) and trains step 3 as the one process did; rank 0 holds half of its stage's parameters
    (the first stage's with pp 2 alone), and its checkpoint is DCP shards."""
    target = runs["tmp"] / "1-to-pp2xfsdp2"
    (target / "checkpoints").mkdir(parents=True)
    from pipelines.continuation import Continuation, seed_run

    seed_run(Continuation(runs["single"], runs["single"] / "checkpoints" / "step_000002", 2, {}, {}), target)
    code, _ = run_trainer(runs["tmp"], data_dir, target.name, ranks=4, parallel={"dp": 2, "pp": 2, "fsdp": True},
                          run_dir=target, **RUN | {"micro_batch_size": 1})
    assert code == 0, sorted(target.glob("stdout-*.log"))[-1].read_text()[-4000:]
    (want,) = _logged_steps(runs["single"], 3)
    (got,) = _logged_steps(target, 3)
    assert relative(got[0], want[0]) <= 1e-5 and relative(got[1], want[1]) <= 1e-5, (got, want)
    staged = json.loads((target / "result.json").read_text())["layout"]
    whole_stage = json.loads((runs["pp2"] / "result.json").read_text())["layout"]["params_on_rank0"]
    assert staged["pp"] == 2 and abs(2 * staged["params_on_rank0"] - whole_stage) <= 64, (staged, whole_stage)
    assert sorted(p.name for p in (target / "checkpoints" / "step_000003").glob("*.distcp")) == [
        f"__{r}_0.distcp" for r in range(4)]


def test_two_stages_with_tensor_parallelism_inside_each_match_one_process(runs: dict[str, Path],
                                                                          data_dir: Path) -> None:  # noqa: F811
    """pp 2 x tp 2 on four processes (TP innermost: ranks 0, 1 split the first stage's blocks by
    the architecture's TP plan, ranks 2, 3 the last stage's): the one process's losses, gradient
    norms (a tensor whole on both TP ranks counted once) and eval loss."""
    code, run = run_trainer(runs["tmp"], data_dir, "pp2xtp2", ranks=4, parallel={"dp": 1, "pp": 2, "tp": 2},
                            **RUN | {"checkpoint_interval": 1000})
    assert code == 0, sorted(run.glob("stdout-*.log"))[-1].read_text()[-4000:]
    want, got = _series(runs["single"]), _series(run)
    assert set(want) == set(got)
    for key, values in want.items():
        assert relative(got[key][-1], values[-1]) <= TOLERANCE, (key, got[key], values)
    layout = json.loads((run / "result.json").read_text())["layout"]
    assert (layout["pp"], layout["tp"]) == (2, 2), layout
