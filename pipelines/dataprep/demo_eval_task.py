"""The demo's downstream task: which of four candidate lines really comes next in a Python
definition? Built from the demo corpus's `code` source, no download.

The task YAML is shipped (`data/tasks/demo_next_line.yaml`, an lm-eval `multiple_choice` task
over `dataset_path: json`); this module writes its data, `data/demo/demo_next_line.jsonl`,
when the demo corpus is built. Only documents the training data holds out (the same hash
rule, `pipelines.dataprep.clean.is_held_out`, at the base experiment's `eval_fraction`) become
examples, so neither model trained on them. Distractors are lines of other held-out
definitions with the same indentation as the right answer, so indentation gives nothing away.
Deterministic: the same corpus gives the same file, byte for byte.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from pipelines.dataprep.clean import clean_text, document_hash, is_held_out

TASK_NAME = "demo_next_line"
DATA_FILE = f"{TASK_NAME}.jsonl"
PROMPT_LINES = (3, 6)
"""Cut points: an example shows a definition's first 3 (or 6) lines and asks for the next."""
MIN_LINE_CHARS = 12
CHOICES = 4


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def build_next_line_task(code_jsonl: Path, out_file: Path, eval_fraction: float = 0.05, seed: int = 0,
                         max_examples: int = 1000) -> int:
    """Write the task's examples (`prompt`, `choices`, `answer`) to `out_file`; returns how many."""
    held_out: list[list[str]] = []
    with open(code_jsonl, encoding="utf-8") as fh:
        for line in fh:
            text = clean_text(json.loads(line).get("text", ""))
            if text and is_held_out(document_hash(text), eval_fraction):
                held_out.append(text.splitlines())
    pool: dict[int, list[tuple[int, str]]] = {}
    for d, lines in enumerate(held_out):
        for ln in lines:
            if len(ln.strip()) >= MIN_LINE_CHARS:
                pool.setdefault(_indent(ln), []).append((d, ln.rstrip()))
    rng = random.Random(seed)
    examples: list[dict[str, Any]] = []
    for d, lines in enumerate(held_out):
        for cut in PROMPT_LINES:
            if len(examples) >= max_examples or len(lines) <= cut:
                continue
            target = lines[cut].rstrip()
            if len(target.strip()) < MIN_LINE_CHARS or any(not ln.strip() for ln in lines[:1]):
                continue
            others = sorted({ln for doc, ln in pool.get(_indent(target), []) if doc != d and ln != target})
            if len(others) < CHOICES - 1:
                continue
            choices = rng.sample(others, CHOICES - 1)
            answer = rng.randrange(CHOICES)
            choices.insert(answer, target)
            examples.append({"prompt": "\n".join(ln.rstrip() for ln in lines[:cut]), "choices": choices,
                             "answer": answer})
    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_file.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for example in examples:
            fh.write(json.dumps(example, sort_keys=True) + "\n")
    tmp.replace(out_file)
    return len(examples)


def build_demo_task(demo_dir: Path) -> Path:
    """The demo task's data beside the demo corpus (`<demo_dir>/demo_next_line.jsonl`)."""
    out = Path(demo_dir) / DATA_FILE
    build_next_line_task(Path(demo_dir) / "code.jsonl", out)
    return out
