"""Validation messages in the project's own words (issue 37, item 6): every message says what the
field takes (its range, its form or an example), never pydantic's wording or a raw regex.

The five broken files of the issue, each as a newcomer writes it: a wrong type, a misspelt
metric, a misspelt `extends` base, `min_effect: 2%`, and an unclosed bracket. Each message
is held whole here, so a change of wording is a reviewed change.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from validation.loader import check_spec

REPO = Path(__file__).resolve().parents[2]
PYDANTIC_WORDS = ("Input should", "String should", "List should", "unable to parse", "pattern '")


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "experiments").mkdir()
    (tmp_path / "data" / "demo").mkdir(parents=True)
    shutil.copy(REPO / "experiments" / "base.yaml", tmp_path / "experiments" / "base.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PIPELINE_DATA_ROOTS", raising=False)
    return tmp_path


def spec_file(repo: Path, name: str, body: str, *, extends: str = "base.yaml",
              metric: str = "eval/loss", min_effect: str = "0.02") -> Path:
    text = textwrap.dedent(f"""\
        name: {name}
        extends: {extends}
        hypothesis:
          statement: A single change to the base experiment should lower the held-out loss measurably.
          metric: {metric}
          direction: decrease
          min_effect: {min_effect}
          baseline: base
        """) + textwrap.dedent(body)
    path = repo / "experiments" / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def only_issue(path: Path) -> str:
    spec, issues = check_spec(path)
    assert spec is None and len(issues) == 1, [i.text() for i in issues]
    text = issues[0].text()
    assert not any(word in text for word in PYDANTIC_WORDS), text
    return text


def test_a_wrong_type_says_what_the_field_takes_and_its_range(repo: Path):
    path = spec_file(repo, "wide", "model:\n  hidden_size: wide\n")
    assert only_issue(path) == (
        "experiments/wide.yaml:10:16: model.hidden_size: must be a whole number from 8 to 65,536, got 'wide'"
    )


def test_a_metric_typo_says_what_a_metric_name_looks_like_and_suggests_the_known_one(repo: Path):
    path = spec_file(repo, "typo", "", metric="eval/los")
    assert only_issue(path) == (
        "experiments/typo.yaml:5:11: hypothesis.metric: 'eval/los' is not a metric the trainer logs; "
        "did you mean 'eval/loss'? A metric is eval/loss or eval/bpb (held-out, all sources), "
        "eval/<source>/loss or eval/<source>/bpb (one of data.sources: code, docs, reference), train/loss, "
        "perf/tokens_per_s, perf/mfu, perf/peak_mem_gb, or eval/task/<task>/<measure> of a task in eval.tasks"
    )


def test_a_metric_with_no_close_match_still_gets_the_form_without_a_regex(repo: Path):
    message = only_issue(spec_file(repo, "acc", "", metric="accuracy"))
    assert "'accuracy' is not a metric the trainer logs; A metric" not in message
    assert "'accuracy' is not a metric the trainer logs. A metric is eval/loss" in message
    assert "^" not in message and "|" not in message


def test_a_misspelt_extends_base_suggests_the_file_that_exists(repo: Path):
    path = spec_file(repo, "child", "", extends="bsae.yaml")
    assert only_issue(path) == (
        "experiments/child.yaml:2:10: extends: base file 'bsae.yaml' does not exist; did you mean 'base.yaml'?"
    )


def test_a_percentage_for_a_fraction_gets_the_hint_to_write_the_fraction(repo: Path):
    path = spec_file(repo, "pct", "", min_effect="2%")
    assert only_issue(path) == (
        "experiments/pct.yaml:7:15: hypothesis.min_effect: must be a number above 0 and at most 10, got '2%'; "
        "write a percentage as a fraction: 0.02 for 2%"
    )


def test_an_unclosed_bracket_is_reported_at_the_bracket_that_opened_it(repo: Path):
    path = spec_file(repo, "unclosed", "model: {hidden_size: 128, num_layers: 4\ntrain:\n  lr: 0.001\n")
    assert only_issue(path) == (
        "experiments/unclosed.yaml:9:8: <yaml>: YAML syntax error: the '{' opened here is never closed "
        "(line 10 starts the next key); end it with '}': {hidden_size: 128, num_layers: 4}"
    )


def test_a_key_from_another_trainer_is_mapped_and_an_unknown_one_lists_the_keys(repo: Path):
    path = spec_file(repo, "hf-style", "train:\n  learning_rate: 0.001\n")
    assert only_issue(path).endswith("train.learning_rate: unknown key 'learning_rate'; did you mean 'lr'?")
    path = spec_file(repo, "zero", "parallel:\n  zero: 3\n")
    assert only_issue(path).endswith(
        "parallel.zero: unknown key 'zero'; parallel takes dp, tp, pp, pp_schedule, pp_split, fsdp, reduce_dtype")
