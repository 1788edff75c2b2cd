"""The full-scale dry run (trainer/dry_run.py, `pipeline plan --dry-run`): the real model on fake
tensors, sharded by the trainer's own code over a fake process group, one tracked step.

Reproduced on main (issue 29, "a TP plan that only fails at full width"): a Llama whose MLP width
(700) does not split over tp=8 passed validate, plan and the smoke (which shrinks the MLP to 128)
and failed only after `/train`, inside a forward, as `RuntimeError: a and b must have same
reduction dim, but got [...] X [...]`; there was no dry run to catch it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from pipelines import cmd_validate
from validation.spec import ExperimentSpec

# Small but not tiny: every width above the smoke's (hidden 64, MLP 128), 8 heads over 4 kv heads.
MODEL = {"model_type": "llama", "hidden_size": 256, "num_layers": 2, "num_heads": 8, "num_kv_heads": 4,
         "intermediate_size": 704, "vocab_size": 8192, "max_position_embeddings": 512, "tie_word_embeddings": False}


def spec(parallel: dict[str, Any], model: dict[str, Any] | None = None) -> ExperimentSpec:
    world = parallel.get("dp", 1) * parallel.get("tp", 1) * parallel.get("pp", 1)
    return ExperimentSpec.model_validate({
        "name": "dry-run-test", "owner": "ml-platform",
        "hypothesis": {"statement": "The planned layout trains this model within the device memory.",
                       "metric": "eval/loss", "direction": "decrease", "min_effect": 0.01, "baseline": "champion"},
        "model": MODEL | (model or {}),
        "data": {"sources": [{"name": "code", "path": "data/demo/code.jsonl", "weight": 1.0}], "seq_len": 256},
        "train": {"max_steps": 100, "micro_batch_size": 2, "precision": "bf16",
                  "grad_accum_steps": parallel.get("pp", 1)},
        "parallel": parallel,
        "resource": {"gpus_per_node": world, "gpu_type": "h100", "gpu_memory_gb": 80, "max_gpu_hours": 10},
    })


@pytest.mark.parametrize("parallel", [{"dp": 4, "fsdp": True}, {"dp": 2, "tp": 2, "fsdp": True}],
                         ids=["fsdp4", "fsdp2xtp2"])
def test_the_tracked_peak_splits_into_the_plan_categories_near_the_analytic_number(parallel: dict[str, Any]) -> None:
    import torch.distributed as dist

    from trainer.dry_run import CATEGORIES, dry_run

    result = dry_run(spec(parallel))

    assert not dist.is_initialized()  # the fake process group is gone
    assert result.world_size == 4 and result.ranks_simulated == [0] and result.tracker == "FSDPMemTracker"
    assert set(result.by_category) == set(CATEGORIES)
    assert sum(v for k, v in result.by_category.items() if k != "overhead") == result.tracked_bytes
    assert result.by_category["overhead"] == sum(result.unseen.values()) > 0
    assert result.peak_bytes == result.tracked_bytes + sum(result.unseen.values())
    # The optimizer state is this rank's shard (a naive reading of the tracker gave the full one).
    assert result.by_category["optimizer_state"] == pytest.approx(
        result.analytic_by_category["optimizer_state"], rel=0.03)
    assert 0.65 <= result.ratio <= 1.35, result.render_text()
    data = result.to_dict()
    assert {"peak_bytes", "analytic_bytes", "by_category", "ranks_simulated", "seconds"} <= set(data)


def test_fsdp_accumulation_keeps_gradients_sharded_between_micro_batches() -> None:
    """Reproduced on main: under accelerate's no_sync FSDP2 kept every gradient unsharded in fp32
    until the last micro-batch (here 4x the sharded gradients; 40 GiB a device for Llama-3-70B
    at FSDP 8 x TP 8 with 8 micro-batches), which the plan did not count. The trainer (and so the
    dry run, which steps as trainer/step.py does) reduce-scatters every micro-batch."""
    from trainer.dry_run import dry_run

    def gradients(accum: int) -> int:
        one = spec({"dp": 4, "fsdp": True})
        return dry_run(one.model_copy(update={"train": one.train.model_copy(update={"grad_accum_steps": accum})})
                       ).by_category["gradients"]

    # At the peak (the loss of the last micro-batch) the earlier micro-batch's gradients exist:
    # this rank's fp32 shard of them, not every parameter's unsharded fp32 gradient (4x as much).
    sharded_fp32 = spec({"dp": 4, "fsdp": True}).model.parameter_count() * 4 // 4
    assert gradients(1) == 0
    assert gradients(2) == pytest.approx(sharded_fp32, rel=0.05)


def test_a_tp_split_that_fails_only_at_full_width_is_refused_naming_module_and_dimension(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = spec({"dp": 1, "tp": 8, "fsdp": True}, {"num_kv_heads": 8, "intermediate_size": 700})
    assert bad.model.tp_problem(8) is None  # validation has nothing against it: heads split
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    (tmp_path / "data" / "demo").mkdir(parents=True)
    (tmp_path / "data" / "demo" / "code.jsonl").write_text(json.dumps({"text": "def f():\n    pass\n"}) + "\n")
    (tmp_path / "experiments").mkdir()
    path = tmp_path / "experiments" / "dry-run-test.yaml"
    path.write_text(json.dumps(bad.model_dump(mode="json", exclude_none=True)))
    monkeypatch.chdir(tmp_path)
    app = typer.Typer()
    cmd_validate.register(app)

    result = CliRunner().invoke(app, ["plan", str(path), "--dry-run", "--format", "json"])

    assert result.exit_code != 0
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "'mlp.gate_proj'" in errors[0] and "700 output features" in errors[0] and "tp=8" in errors[0]
    assert "error" in json.loads(result.stdout)["dry_run"]


def test_a_two_stage_plan_dry_run_reports_a_tracked_peak_for_each_stage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pipeline plan --dry-run` on a pp 2 layout simulates the first and the last stage's ranks
    (the trainer's own stages and the real 1F1B schedule over a fake process group) and reports
    a tracked peak for each, the larger being the layout's; no process group is left behind."""
    import torch.distributed as dist

    staged = spec({"dp": 1, "pp": 2})
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    (tmp_path / "data" / "demo").mkdir(parents=True)
    (tmp_path / "data" / "demo" / "code.jsonl").write_text(json.dumps({"text": "def f():\n    pass\n"}) + "\n")
    (tmp_path / "experiments").mkdir()
    path = tmp_path / "experiments" / "dry-run-test.yaml"
    path.write_text(json.dumps(staged.model_dump(mode="json", exclude_none=True)))
    monkeypatch.chdir(tmp_path)
    app = typer.Typer()
    cmd_validate.register(app)

    result = CliRunner().invoke(app, ["plan", str(path), "--dry-run", "--format", "json"])

    assert result.exit_code == 0, result.output
    assert not dist.is_initialized()
    dry = json.loads(result.stdout)["dry_run"]
    assert dry["ranks_simulated"] == [0, 1] and dry["world_size"] == 2
    peaks = dry["stage_peaks"]
    assert set(peaks) == {"stage 0", "stage 1"} and all(v > 0 for v in peaks.values())
    assert dry["tracked_bytes"] == max(peaks.values())
    # The last stage holds the LM head, its logits and the loss: more than the first here.
    assert peaks["stage 1"] > peaks["stage 0"]
    assert dry["problems"] == [], dry["problems"]


def test_adafactor_steps_fsdp_x_tp_shards_and_a_failure_in_the_optimizer_step_names_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Reproduced on main: Adafactor stopped the dry run under every layout (`step_t.item()` on a
    fake tensor inside its step), and the message blamed `model.embed_tokens (backward)`, the
    last module the backward visited. The optimizer's scalar reads are answered (noted), Adafactor
    steps DTensor shards (models/optimizers/adafactor.py), and a failure after the backward names
    the optimizer step."""
    import trainer.optim
    from basics.errors import DryRunFailed
    from models import optimizer_configs
    from trainer.dry_run import dry_run

    # Adafactor on FSDP x TP shards (a 2-D mesh); AdamW is every other dry-run test's, and the
    # recorded held-out calibration rows step Adafactor, Muon and SGD under DDP, FSDP and TP at
    # full size (bench/results/plan_calibration_heldout.json, tests/unit/test_plan_calibration.py).
    base = spec({"dp": 2, "tp": 2, "fsdp": True})
    adafactor = base.model_copy(update={"train": base.train.model_copy(
        update={"optimizer": optimizer_configs()["adafactor"].model_validate({"name": "adafactor"})})})
    result = dry_run(adafactor)
    assert result.tracked_bytes > 0
    assert any("scalar reads inside its step answered" in note for note in result.notes), result.notes

    build = trainer.optim.build_optimizer

    def broken(model: Any, train: Any, arch: Any) -> Any:
        optimizer = build(model, train, arch)

        def step(closure: Any = None) -> None:
            raise RuntimeError("this optimizer cannot step")

        optimizer.step = step
        return optimizer

    monkeypatch.setattr(trainer.optim, "build_optimizer", broken)
    with pytest.raises(DryRunFailed, match=r"fails at full size in the optimizer step \(adamw\): RuntimeError: "
                                           r"this optimizer cannot step"):
        dry_run(base)
