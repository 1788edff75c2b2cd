"""A scratch repository whose base experiment scores a local lm-eval task (tests/*/test_downstream_spec.py).

`task_repo(tmp_path, monkeypatch)` (the scratch repository, made the working directory; the
test modules' `repo` fixture) and `write(repo, body)` (an experiment on top of base.yaml that
states a task metric as its hypothesis)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TASK_YAML = """\
task: tiny_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: tiny_choice.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{prompt}}"
doc_to_choice: choices
doc_to_target: answer
process_docs: !function utils.process_docs
metric_list:
  - metric: acc
    higher_is_better: true
"""


def task_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "experiments").mkdir()
    tasks = tmp_path / "data" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "tiny_choice.yaml").write_text(TASK_YAML, encoding="utf-8")
    (tasks / "tiny_choice.jsonl").write_text('{"prompt": "a", "choices": ["b", "c"], "answer": 0}\n')
    base = (REPO / "experiments" / "base.yaml").read_text(encoding="utf-8").split("\neval:")[0]
    # The baseline scores the same task entry (a task metric compares the same definition).
    (tmp_path / "experiments" / "base.yaml").write_text(
        base + "\neval:\n  tasks:\n    - path: data/tasks/tiny_choice.yaml\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PIPELINE_DATA_ROOTS", raising=False)
    return tmp_path


def write(repo: Path, body: str, metric: str = "eval/task/tiny_choice/acc") -> Path:
    text = textwrap.dedent(f"""\
        name: tasks
        extends: base.yaml
        hypothesis:
          statement: A single change to the base experiment should raise the task accuracy measurably.
          metric: {metric}
          direction: increase
          min_effect: 0.01
          baseline: base
        """) + textwrap.dedent(body)
    path = repo / "experiments" / "tasks.yaml"
    path.write_text(text, encoding="utf-8")
    return path

