"""The trainer scores `eval.tasks` after export (rank 0, from RUN/model): task metrics land in
result.json's final metrics and in the metric sink (metrics.jsonl; MLflow through the same
sink), per-example records in RUN/downstream/, and a task that fails leaves the run finished."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.infra.lm_eval_tasks import choice_task
from tests.infra.trainer_runs import data_dir, spec_dict  # noqa: F401 - fixture


def test_trainer_scores_tasks_and_keeps_the_result_when_one_fails(tmp_path: Path, data_dir: Path) -> None:  # noqa: F811
    pytest.importorskip("lm_eval")
    from trainer.loop import Trainer
    from validation.spec import ExperimentSpec

    root = tmp_path / "repo" / "data" / "tasks"
    choice_task(root)
    (root / "utils.py").write_text("def process_docs(dataset):\n    raise RuntimeError('broken hook')\n")
    choice_task(root, "broken", extra="process_docs: !function utils.process_docs\n")
    raw = spec_dict(max_steps=4)
    raw["hypothesis"] |= {"metric": "eval/task/tiny_choice/acc", "direction": "increase"}
    raw["eval"] = {"tasks": [{"path": "data/tasks/tiny_choice.yaml", "limit": 8},
                             {"path": "data/tasks/broken.yaml", "limit": 8}]}
    spec = ExperimentSpec.model_validate(raw)
    run = tmp_path / "run"
    result, code = Trainer(spec, run, data_dir, tracking_uri="none", repo_root=tmp_path / "repo").run()
    assert code == 0 and result["status"] == "finished"
    saved = json.loads((run / "result.json").read_text())
    assert saved["final_metrics"]["eval/task/tiny_choice/n"] == 8
    assert 0 <= saved["final_metrics"]["eval/task/tiny_choice/acc"] <= 1
    assert "eval/loss" in saved["final_metrics"]
    assert "broken hook" in saved["downstream"]["tasks"]["broken"]["error"]
    assert len((run / "downstream" / "samples_tiny_choice.jsonl").read_text().splitlines()) == 8
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/task/tiny_choice/acc" in str(row) for row in logged)
