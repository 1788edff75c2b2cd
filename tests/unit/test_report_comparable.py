"""Comparable metrics only (issue 20, item 5): `eval/loss` means nats per token of a tokenizer
on a held-out set, so two sides with different tokenizers or held-out settings compare two
different quantities. Validate refuses such a hypothesis at its line (suggesting `eval/bpb`),
and the report marks any metric whose definition differs between the sides.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reports.records import RunRecord
from reports.render import render_markdown
from reports.report import definition_differences, make_report

REPO = Path(__file__).resolve().parents[2]
CANDIDATE = """\
name: {name}
owner: someone
extends: base.yaml
hypothesis:
  statement: A larger tokenizer vocabulary lowers the held-out loss by at least two percent.
  metric: {metric}
  direction: decrease
  min_effect: 0.02
  baseline: base
  seeds: 3
data:
  tokenizer:
    vocab_size: 1024
"""


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "experiments").mkdir()
    (tmp_path / "data" / "demo").mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    shutil.copy(REPO / "experiments" / "base.yaml", tmp_path / "experiments" / "base.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PIPELINE_DATA_ROOTS", raising=False)
    return tmp_path


def test_eval_loss_across_tokenizers_is_refused_at_its_line_with_bpb_suggested(repo):
    from basics.errors import SpecError
    from validation.loader import load_spec

    path = repo / "experiments" / "vocab-1024.yaml"
    text = CANDIDATE.format(name="vocab-1024", metric="eval/loss")
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    line = text.splitlines().index("  metric: eval/loss") + 1
    message = str(caught.value)
    assert f"vocab-1024.yaml:{line}:" in message and "hypothesis.metric" in message
    assert "data.tokenizer" in message and "`eval/bpb`" in message
    path.write_text(CANDIDATE.format(name="vocab-1024", metric="eval/bpb"))
    assert load_spec(path).hypothesis.metric == "eval/bpb"  # bits per byte compare across tokenizers


def test_eval_loss_across_held_out_settings_is_refused(repo):
    from basics.errors import SpecError
    from validation.loader import load_spec

    path = repo / "experiments" / "bigger-eval.yaml"
    text = CANDIDATE.format(name="bigger-eval", metric="eval/bpb").replace(
        "  tokenizer:\n    vocab_size: 1024\n", "  eval_fraction: 0.2\n")
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert "data.eval_fraction" in str(caught.value) and "held-out settings" in str(caught.value)


def _run(seed, value, params, experiment):
    return RunRecord(f"{experiment}-{seed}", experiment, seed, "finished",
                     {"eval/loss": value, "eval/bpb": value / 3, "eval/code/loss": value}, params=params)


def test_the_report_marks_a_metric_defined_differently_and_does_not_decide_on_it():
    base_p = {"data.tokenizer.vocab_size": 2048, "data.sources.code.path": "data/demo/code.jsonl", "data.seq_len": 128}
    cand_p = {**base_p, "data.tokenizer.vocab_size": 1024}
    assert definition_differences(cand_p, base_p, "eval/loss") == ("data.tokenizer.vocab_size",)
    assert definition_differences(cand_p, base_p, "eval/bpb") == ()
    bases = [_run(s, 3.5 + 0.02 * s, base_p, "base") for s in (1, 2, 3)]
    cands = [_run(s, (3.5 + 0.02 * s) * r, cand_p, "vocab") for s, r in zip((1, 2, 3), (0.9, 0.91, 0.89), strict=True)]
    h = {"metric": "eval/loss", "direction": "decrease", "min_effect": 0.02, "baseline": "base", "seeds": 3}
    report = make_report(cands, bases, h)
    assert report.verdict.outcome == "inconclusive" and "different quantity" in report.verdict.reason
    assert set(report.definitions) == {"eval/loss", "eval/code/loss"}
    md = render_markdown(report)
    assert "defined differently (`data.tokenizer.vocab_size`)" in md and "Defined differently on the two sides" in md
    bpb = make_report(cands, bases, {**h, "metric": "eval/bpb"})
    assert bpb.verdict.outcome == "supported", bpb.verdict.reason
    assert json.dumps(list(bpb.definitions))  # serialisable keys
