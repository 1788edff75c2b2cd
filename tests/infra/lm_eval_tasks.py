"""Tiny local lm-eval tasks: a multiple-choice task YAML (`dataset_path: json`, no hub) and
its generated examples, next-line choices over a few lines of code (`LINES`)."""

from __future__ import annotations

import json
from pathlib import Path

TASK = """\
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {name}.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{prompt}}}}"
doc_to_choice: choices
doc_to_target: answer
target_delimiter: "\\n"
{extra}metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""
LINES = ["def add(a, b):", "    return a + b", "def sub(a, b):", "    return a - b", "class Point:",
         "    x: int = 0", "    y: int = 0", "for i in range(10):", "    print(i)", "import os"]


def choice_task(root: Path, name: str = "tiny_choice", extra: str = "", n: int = 12) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.jsonl", "w") as fh:
        for i in range(n):
            choices = [LINES[(i + k) % len(LINES)] for k in range(1, 5)]
            fh.write(json.dumps({"prompt": LINES[i % len(LINES)], "choices": choices, "answer": i % 4}) + "\n")
    (root / f"{name}.yaml").write_text(TASK.format(name=name, extra=extra))
    return root / f"{name}.yaml"
