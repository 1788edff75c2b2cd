"""`pipeline plan` prices what will actually run: a sweep as a whole (trials x selection
seeds + the winner on the hypothesis seeds + the baseline, with the tier of that total) and
the data preparation (input size, tasks, estimated time); a sweep spec has its own hash.

Reproduced on the previous main: the plan of a 4-trial H100 sweep showed one trial's
GPU-hours and "small: 1 approval"; the sweep spec's hash equalled its baseline's when the
swept base values matched; the plan said nothing about preparing the data.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from pipelines import cmd_validate
from validation.spec import ExperimentSpec

BASE = """\
name: gpu-base
owner: octocat
hypothesis:
  statement: The base configuration, trained as the reference for the sweep below.
  metric: eval/loss
  direction: decrease
  min_effect: 0.01
  baseline: champion
  seeds: 3
model: {model_type: llama, hidden_size: 1024, num_layers: 16, num_heads: 16, vocab_size: 32000}
data:
  sources: [{name: code, path: data/corpus/code.jsonl, weight: 1.0}]
  seq_len: 1024
train: {max_steps: 2000, micro_batch_size: 8, lr: 0.0003}
resource: {gpus_per_node: 8, gpu_type: h100, gpu_memory_gb: 80.0, max_gpu_hours: 8.0}
"""

SWEEP = """\
name: gpu-sweep
owner: octocat
extends: gpu-base.yaml
hypothesis:
  statement: The best of four peak learning rates lowers the held-out loss versus the base.
  metric: eval/loss
  direction: decrease
  min_effect: 0.01
  baseline: gpu-base
  seeds: 3
sweep:
  parameters: {train.lr: [0.0001, 0.0003, 0.001, 0.003]}
"""


@pytest.fixture()
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "gpu-base.yaml").write_text(BASE)
    (tmp_path / "experiments" / "gpu-sweep.yaml").write_text(SWEEP)
    corpus = tmp_path / "data" / "corpus"
    corpus.mkdir(parents=True)
    line = json.dumps({"text": "def f(x):\n    return x + 1\n" * 20}) + "\n"
    (corpus / "code.jsonl").write_text(line * 2000)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _plan(*args: str):
    app = typer.Typer()
    cmd_validate.register(app)
    return CliRunner().invoke(app, ["plan", *args])


def test_the_plan_of_a_sweep_prices_and_tiers_the_whole_sweep(repo: Path) -> None:
    result = _plan("experiments/gpu-sweep.yaml", "--format", "json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    one_trial = plan["preflight"]["compute"]["gpu_hours"]
    # The experiment's own plan prices its 3 seeds and the baseline's 3 (it once priced one run).
    assert (plan["preflight"]["cost"]["seeds"], plan["preflight"]["cost"]["baseline_runs"]) == (3, 3)
    sweep = plan["sweep"]
    # 4 trials x 1 selection seed + the winner on 3 hypothesis seeds + the baseline on 3 seeds.
    assert sweep["trials"] == 4 and sweep["selection_seeds"] == 1 and sweep["confirm_seeds"] == 3
    assert sweep["gpu_hours"] == pytest.approx(10 * one_trial, rel=1e-3)
    assert sweep["tier"]["name"] == "large" and plan["tier"] == sweep["tier"]  # what applies

    text = _plan("experiments/gpu-sweep.yaml")
    assert text.exit_code == 0, text.output
    assert "4 trials x 1 selection seed(s)" in text.stdout
    assert "tier (whole sweep)   large: 2 approval(s)" in text.stdout
    assert "sweep.parameters.train.lr" in text.stdout
    assert 'sweep: null' not in text.stdout  # the section's fields are the change, not a placeholder


def test_a_sweep_over_the_budget_is_refused_by_the_plan_tier(repo: Path) -> None:
    path = repo / "experiments" / "gpu-sweep.yaml"
    path.write_text(SWEEP.replace("sweep:\n", "resource: {max_gpu_hours: 2.0}\nsweep:\n"))
    plan = json.loads(_plan("experiments/gpu-sweep.yaml", "--format", "json").stdout)
    assert plan["preflight"]["compute"]["gpu_hours"] < 2.0  # one run alone is within the budget
    assert plan["tier"]["name"] == "refused" and "max_gpu_hours" in plan["tier"]["reason"]


def test_a_plain_experiment_keeps_its_own_tier_and_has_no_sweep_section(repo: Path) -> None:
    plan = json.loads(_plan("experiments/gpu-base.yaml", "--format", "json").stdout)
    assert plan["sweep"] is None and plan["tier"] == plan["preflight"]["tier"]


def test_the_plan_shows_the_data_preparation_estimate(repo: Path) -> None:
    size = (repo / "data" / "corpus" / "code.jsonl").stat().st_size
    plan = json.loads(_plan("experiments/gpu-base.yaml", "--format", "json").stdout)
    prep = plan["data_preparation"]
    assert prep["input_bytes"] == size and prep["tasks"] >= 1 and prep["estimated_seconds"] > 0
    text = _plan("experiments/gpu-base.yaml").stdout
    assert f"{size / 1e6:,.1f} MB" in text and "to prepare" in text


def test_missing_data_does_not_fail_the_plan_but_says_so(repo: Path) -> None:
    (repo / "data" / "corpus" / "code.jsonl").unlink()
    result = _plan("experiments/gpu-base.yaml", "--format", "json")
    assert result.exit_code == 0, result.output
    assert "code.jsonl" in json.loads(result.stdout)["data_preparation"]["error"]


def test_a_sweep_spec_has_its_own_hash_even_when_its_values_equal_the_baseline(repo: Path) -> None:
    from validation.loader import load_spec

    base = load_spec(repo / "experiments" / "gpu-base.yaml")
    sweep = load_spec(repo / "experiments" / "gpu-sweep.yaml")
    assert sweep.train.lr == base.train.lr  # the swept field's base value is the baseline's
    assert sweep.spec_hash() != base.spec_hash()
    # A spec without a sweep hashes as before (no `sweep` key in its identity).
    data = base.model_dump(mode="json", by_alias=True)
    assert ExperimentSpec.model_validate({**data, "sweep": None}).spec_hash() == base.spec_hash()
    assert "sweep" not in base.training_dict()
