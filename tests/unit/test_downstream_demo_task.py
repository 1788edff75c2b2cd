"""The demo's downstream task: built from held-out demo code only, four choices with one right
answer, byte-identical on a rebuild; its shipped YAML validates in every committed experiment."""

from __future__ import annotations

import json
from pathlib import Path

from pipelines.dataprep.clean import clean_text, document_hash, is_held_out
from pipelines.dataprep.demo_eval_task import build_next_line_task
from validation.eval_tasks import read_task_file

REPO = Path(__file__).resolve().parents[2]


def test_demo_task_uses_held_out_code_only_and_is_deterministic(tmp_path: Path):
    from pipelines.dataprep.demo_corpus import build_demo_corpus

    build_demo_corpus(tmp_path / "demo", {"code": 1_500_000, "docs": 1000, "reference": 1000})
    out1, out2 = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    n = build_next_line_task(tmp_path / "demo" / "code.jsonl", out1)
    build_next_line_task(tmp_path / "demo" / "code.jsonl", out2)
    assert n >= 20 and out1.read_bytes() == out2.read_bytes()
    held = [clean_text(json.loads(line)["text"]) for line in open(tmp_path / "demo" / "code.jsonl")]
    held = [t for t in held if is_held_out(document_hash(t), 0.05)]
    for row in map(json.loads, out1.read_text().splitlines()):
        assert len(row["choices"]) == 4 and len(set(row["choices"])) == 4
        right = row["choices"][row["answer"]]
        source = [t for t in held if t.startswith(row["prompt"])]
        assert source and any(right in t.splitlines() for t in source)  # the real next line of held-out code
        indents = {len(c) - len(c.lstrip(" ")) for c in row["choices"]}
        assert len(indents) == 1  # indentation gives nothing away


def test_shipped_task_yaml_points_at_the_generated_data():
    data = read_task_file(REPO / "data" / "tasks" / "demo_next_line.yaml")
    assert data["task"] == "demo_next_line" and data["output_type"] == "multiple_choice"
    assert data["dataset_kwargs"]["data_files"]["test"] == "../demo/demo_next_line.jsonl"
