"""Pipeline parallelism without processes: what `validate` refuses (file:line) and how the layers
are split (the numbers: tests/integration/test_pipeline_parallel.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipelines.cli import app

SPEC = """\
name: staged
owner: octocat
hypothesis:
  statement: Two pipeline stages train the tiny model exactly as one process does.
  metric: eval/loss
  direction: decrease
  min_effect: 0.01
  baseline: champion
model: {{model_type: {model_type}, hidden_size: 32, num_layers: 4, num_heads: 2, vocab_size: 512}}
data:
  sources: [{{name: code, path: data/missing/code.jsonl, weight: 1.0}}]
  seq_len: 32
  tokenizer: {{vocab_size: 512}}
train: {{max_steps: 40, grad_accum_steps: {accum}}}
resource: {{cpu_processes: {ranks}}}
parallel: {parallel}
"""


def _validate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallel: str, ranks: int = 3, accum: int = 4,
              model_type: str = "llama") -> str:
    (tmp_path / "experiments").mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "experiments" / "staged.yaml").write_text(
        SPEC.format(parallel=parallel, ranks=ranks, accum=accum, model_type=model_type))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["validate", "experiments/staged.yaml"])
    assert "Traceback" not in result.output
    return result.output if result.exit_code else ""


def test_pp_that_does_not_divide_the_layers_is_refused_at_its_line(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    out = _validate(tmp_path, monkeypatch, "{dp: 1, pp: 3}")
    assert "experiments/staged.yaml:16:" in out and "parallel.pp" in out
    assert "pp=3 must divide model.num_layers (4)" in out and "pp_split" in out


def test_an_uneven_split_is_accepted_when_it_sums_to_the_layers(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert _validate(tmp_path, monkeypatch, "{dp: 1, pp: 3, pp_split: [2, 1, 1]}") == ""


def test_a_split_that_misses_layers_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _validate(tmp_path, monkeypatch, "{dp: 1, pp: 3, pp_split: [1, 1, 1]}")
    assert "parallel.pp_split" in out and "summing to model.num_layers (4)" in out


def test_interleaved_stages_count_two_per_rank_in_the_layer_split(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from validation.rules import virtual_stages_per_rank

    assert [virtual_stages_per_rank(s) for s in ("gpipe", "1f1b", "interleaved_1f1b")] == [1, 1, 2]
    out = _validate(tmp_path, monkeypatch, "{dp: 1, pp: 3, pp_schedule: interleaved_1f1b}")
    assert "pp=3 x 2 interleaved stages = 6 must divide model.num_layers (4)" in out


def test_1f1b_needs_a_micro_batch_per_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _validate(tmp_path, monkeypatch, "{dp: 1, pp: 2}", ranks=2, accum=1)
    assert "train.grad_accum_steps" in out and "needs at least 2 micro-batches" in out


def test_a_router_loss_cannot_be_staged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _validate(tmp_path, monkeypatch, "{dp: 1, pp: 2}", ranks=2, model_type="moe")
    assert "parallel.pp" in out and "router loss summed over all blocks" in out


def test_stage_split() -> None:
    from basics.errors import TrainingError
    from trainer.pipeline_parallel import stage_split

    assert stage_split(4, 2) == [[0, 1], [2, 3]]
    assert stage_split(4, 3, [2, 1, 1]) == [[0, 1], [2], [3]]
    with pytest.raises(TrainingError):
        stage_split(4, 3, [1, 1, 1])


def test_the_plan_counts_the_bubble_and_the_micro_batches_in_flight() -> None:
    from validation.plan.compute import pipeline_bubble_factor, pipeline_bubble_fraction
    from validation.plan.memory import pipeline_in_flight

    assert pipeline_bubble_fraction(1, 8) == 0.0 and pipeline_bubble_factor(1, 8) == 1.0
    assert pipeline_bubble_fraction(4, 8, "gpipe") == pipeline_bubble_fraction(4, 8, "1f1b") == 3 / 11
    assert pipeline_bubble_fraction(4, 8, "interleaved_1f1b") == 3 / 19
    assert abs(pipeline_bubble_factor(4, 8) - 11 / 8) < 1e-12  # = 1 + (pp - 1) / m
    assert (pipeline_in_flight(4, 8, "gpipe"), pipeline_in_flight(4, 8, "1f1b"), pipeline_in_flight(1, 8)) == (8, 4, 1)
    assert pipeline_in_flight(4, 8, "interleaved_1f1b") == 4 * (1 + 3 / 8)
