"""`extends` across architectures and optimizers: a child that changes `model_type` (or the
optimizer's `name`) inherits only the fields both plug-ins declare in the same class, and the
plan's diff against the base shows every field it did not inherit.

Reproduced on the old main: `model_type: gpt2` with GPT-2 small's sizes over the llama
`base.yaml` inherited `intermediate_size: 384` (a SwiGLU width there, the MLP width in GPT-2):
74,862,336 parameters instead of 124,439,808, and the plan's diff did not show it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from pipelines import cmd_validate
from validation.loader import load_spec

REPO = Path(__file__).resolve().parents[2]
GPT2_SMALL = """name: gpt2-child
extends: base.yaml
hypothesis:
  statement: A GPT-2 small block on the demo mixture is a fair reference for the Llama baseline here.
model:
  model_type: gpt2
  hidden_size: 768
  num_layers: 12
  num_heads: 12
  vocab_size: 50257
  max_position_embeddings: 1024
"""


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "experiments").mkdir()
    (tmp_path / "data" / "demo").mkdir(parents=True)
    shutil.copy(REPO / "experiments" / "base.yaml", tmp_path / "experiments" / "base.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PIPELINE_DATA_ROOTS", raising=False)
    return tmp_path


def test_a_child_switching_to_gpt2_does_not_inherit_the_llama_mlp_width(repo: Path):
    (repo / "experiments" / "gpt2-child.yaml").write_text(GPT2_SMALL)
    spec = load_spec(repo / "experiments" / "gpt2-child.yaml")
    assert spec.model.model_type == "gpt2" and spec.model.intermediate_size is None
    assert spec.model.parameter_count() == 124_439_808  # GPT-2 small, published
    # Fields both architectures declare in the same class are inherited.
    assert spec.model.attn_implementation == "sdpa" and spec.model.tie_word_embeddings is True

    app = typer.Typer()
    cmd_validate.register(app)
    result = CliRunner().invoke(app, ["plan", "experiments/gpt2-child.yaml", "--format", "json"])
    assert result.exit_code == 0, result.output
    changes = {c["field"]: (c["from"], c["to"]) for c in json.loads(result.stdout)["changes"]}
    assert changes["model.model_type"] == ("llama", "gpt2")
    assert changes["model.intermediate_size"] == (384, None)
    assert changes["model.num_kv_heads"] == (4, "<unset>")


def test_a_child_within_the_llama_family_inherits_the_family_fields(repo: Path):
    (repo / "experiments" / "to-mistral.yaml").write_text(
        "name: to-mistral\nextends: base.yaml\nhypothesis:\n  statement: Mistral's class with the base sizes "
        "trains like the Llama base on this mixture.\nmodel:\n  model_type: mistral\n")
    spec = load_spec(repo / "experiments" / "to-mistral.yaml")
    assert (spec.model.intermediate_size, spec.model.num_kv_heads) == (384, 4)


def test_a_child_switching_optimizer_does_not_inherit_a_field_of_the_same_name(repo: Path):
    base = repo / "experiments" / "base.yaml"
    base.write_text(base.read_text().replace("  lr: 3.0e-3\n", "  lr: 3.0e-3\n  optimizer:\n    name: adamw\n"
                                                                       "    eps: 1.0e-6\n"))
    (repo / "experiments" / "to-adafactor.yaml").write_text(
        "name: to-adafactor\nextends: base.yaml\nhypothesis:\n  statement: Adafactor reaches the base loss "
        "with less optimizer memory on this mixture.\ntrain:\n  optimizer:\n    name: adafactor\n")
    spec = load_spec(repo / "experiments" / "to-adafactor.yaml")
    # AdamW's eps (1e-8 scale, in the denominator) is not Adafactor's eps (1e-3, a clipping floor).
    assert spec.train.optimizer.name == "adafactor" and spec.train.optimizer.eps == 1e-3
