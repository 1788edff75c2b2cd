"""Downstream scoring after a sharded run: two gloo ranks under FSDP and under tensor parallelism
(`accelerate launch`, as tests/integration/test_trainer_parallel.py runs them); rank 0 scores
the export once while rank 1 waits, and the per-example records reach the run's MLflow run as
artifacts (the session's MLflow server keeps them under its artifacts folder: read as files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.infra.lm_eval_tasks import choice_task
from tests.infra.trainer_runs import data_dir, run_trainer  # noqa: F401 - fixture

LAYOUTS = {"fsdp": ({"dp": 2, "fsdp": True}, 2), "tp": ({"dp": 1, "tp": 2}, 4)}
"""name -> (parallel section, micro batch): the same global batch of 4 rows."""


def test_tasks_are_scored_once_on_rank_0_under_fsdp_and_tp(
        tmp_path: Path, data_dir: Path, mlflow_server: Any) -> None:  # noqa: F811
    pytest.importorskip("lm_eval")
    task = choice_task(tmp_path / "tasks")
    sections = {"name": "downstream-parallel", "eval": {"tasks": [{"path": str(task), "limit": 6}]}}
    for name, (parallel, micro) in LAYOUTS.items():
        uri = mlflow_server.uri if name == "fsdp" else "none"  # the upload does not depend on the layout
        code, run_dir = run_trainer(tmp_path, data_dir, name, ranks=2, parallel=parallel, uri=uri,
                                    sections=sections, model={"tie_word_embeddings": False},
                                    max_steps=2, micro_batch_size=micro, eval_interval=1000, checkpoint_interval=100)
        assert code == 0, sorted(run_dir.glob("stdout-*.log"))[-1].read_text()[-3000:]
        result = json.loads((run_dir / "result.json").read_text())
        assert result["layout"]["sharded"], name
        metrics = {k: v for k, v in result["final_metrics"].items() if k.startswith("eval/task/")}
        assert metrics["eval/task/tiny_choice/n"] == 6 and 0 <= metrics["eval/task/tiny_choice/acc"] <= 1
        logs = {rank: (run_dir / "logs" / f"rank{rank}.log").read_text() for rank in (0, 1)}
        assert "downstream tasks scored" in logs[0] and "downstream tasks scored" not in logs[1]
        local = (run_dir / "downstream" / "samples_tiny_choice.jsonl").read_bytes()
        assert len(local.splitlines()) == 6
        if uri == "none":
            assert result["downstream"]["mlflow_artifacts"] == "not uploaded: no MLflow run"
            continue
        assert result["downstream"]["mlflow_artifacts"] == "downstream"
        uploaded = {p.name: p for p in Path(mlflow_server.artifacts).rglob("*")
                    if result["mlflow_run_id"] in p.parts and p.parent.name == "downstream"}
        assert set(uploaded) == {"results.json", "samples_tiny_choice.jsonl"}
        assert uploaded["samples_tiny_choice.jsonl"].read_bytes() == local
