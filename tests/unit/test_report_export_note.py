"""The report states how the exported model loads when transformers cannot load it (issue 23,
part 1: "an explicit refusal the report states; never a silently different model")."""

from __future__ import annotations

import json
from pathlib import Path

from reports.records import RunRecord, record_from_run_dir
from reports.report import make_report

HYPOTHESIS = {"statement": "A plain PyTorch GPT trains as well as the Llama baseline on the demo mixture.",
              "metric": "eval/loss", "direction": "decrease", "min_effect": 0.02, "baseline": "base", "seeds": 1}


def _run(tmp: Path, name: str, export: dict[str, object]) -> Path:
    run = tmp / name
    run.mkdir()
    (run / "result.json").write_text(json.dumps({"status": "finished", "experiment": name, "steps": 10,
                                                 "final_metrics": {"eval/loss": 3.0}, "export": export}))
    return run


def test_a_refused_export_is_stated_and_a_loadable_one_is_not_a_warning(tmp_path: Path):
    note = {"loadable": False, "how": "plain PyTorch: transformers cannot load it; models.load_exported(dir)",
            "architecture": "nanogpt"}
    cand = record_from_run_dir(_run(tmp_path, "nanogpt", note))
    assert cand.tags["export_loadable"] == "false" and "models.load_exported" in cand.tags["export"]
    base = record_from_run_dir(_run(tmp_path, "base", {"loadable": True, "how": "transformers", "architecture": "llama"}))
    report = make_report([cand], [base], HYPOTHESIS, experiment="nanogpt", baseline_name="base")
    assert any(w.startswith("Exported model: plain PyTorch") for w in report.warnings)
    report = make_report([base], [base], HYPOTHESIS, experiment="nanogpt", baseline_name="base")
    assert not any(w.startswith("Exported model") for w in report.warnings)
    assert isinstance(cand, RunRecord)
