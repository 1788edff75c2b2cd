"""The six published configurations under experiments/published/: each validates in a fresh
clone (the demo corpus's paths) and `pipeline plan` counts its published parameters, without
torch. The folder is not one that anything iterates over to train or smoke (the shipped
examples are experiments/*.yaml)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from pipelines import cmd_validate

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = {  # file -> parameters of the published checkpoint
    "gpt2-small": 124_439_808,
    "gpt2-xl": 1_557_611_200,
    "llama2-7b": 6_738_415_616,
    "llama3-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "qwen2-0_5b": 494_032_768,
}


def test_the_folder_holds_exactly_the_published_examples():
    assert {p.stem for p in (REPO / "experiments" / "published").glob("*.y*ml")} == set(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_plan_counts_the_published_parameters(name: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)
    torch_before = "torch" in sys.modules
    app = typer.Typer()
    cmd_validate.register(app)
    result = CliRunner().invoke(app, ["plan", f"experiments/published/{name}.yaml", "--format", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["experiment"] == name
    assert plan["preflight"]["parameters"] == PUBLISHED[name]
    assert torch_before or "torch" not in sys.modules
