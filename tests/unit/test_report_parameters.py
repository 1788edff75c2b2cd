"""Total and active parameters in the report (issue 29, item 6: "total and active parameters both
in the plan and the report"). Reproduced on main before: the cost section had tokens/s, MFU and
peak memory, and no parameter count at all, so a mixture of experts' MFU (from active FLOPs)
stood next to nothing that said which N it used."""

from __future__ import annotations

import json
from pathlib import Path

from reports.records import record_from_run_dir
from reports.render import cost_section
from reports.report import make_report
from trainer import record as trainer_record
from validation.loader import load_spec

REPO = Path(__file__).resolve().parents[2]
HYPOTHESIS = {"statement": "A mixture of experts lowers the held-out loss of the dense Llama baseline.",
              "metric": "eval/loss", "direction": "decrease", "min_effect": 0.02, "baseline": "base", "seeds": 1}


def _run(tmp: Path, experiment: str) -> Path:
    """A finished run whose result.json the trainer's own `record.result` fields would give."""
    spec = load_spec(REPO / "experiments" / f"{experiment}.yaml")
    params = trainer_record.params(spec, world=1, n_params=spec.model.parameter_count(), total_steps=10)
    run = tmp / experiment
    run.mkdir()
    (run / "result.json").write_text(json.dumps({
        "status": "finished", "experiment": experiment, "steps": 10, "final_metrics": {"eval/loss": 3.0},
        "n_params": params["n_params"], "n_active_params": params["n_active_params"]}))
    return run


def test_the_cost_section_states_total_and_active_parameters_of_each_side(tmp_path: Path):
    moe, base = load_spec(REPO / "experiments" / "moe.yaml"), load_spec(REPO / "experiments" / "base.yaml")
    assert moe.model.active_parameter_count() < moe.model.parameter_count()  # the point of the row
    cand, ref = record_from_run_dir(_run(tmp_path, "moe")), record_from_run_dir(_run(tmp_path, "base"))
    assert (cand.perf.parameters, cand.perf.active_parameters) == (moe.model.parameter_count(),
                                                                    moe.model.active_parameter_count())
    assert ref.perf.parameters == ref.perf.active_parameters == base.model.parameter_count()
    report = make_report([cand], [ref], HYPOTHESIS, experiment="moe", baseline_name="base")
    (row,) = [line for line in cost_section(report).splitlines() if line.startswith("| parameters")]
    from validation.plan.common import format_count

    assert row == (f"| parameters: total / active per token | {format_count(base.model.parameter_count())} / "
                   f"{format_count(base.model.parameter_count())} | {format_count(moe.model.parameter_count())} / "
                   f"{format_count(moe.model.active_parameter_count())} |")


def test_a_run_recorded_before_the_counts_shows_a_dash_not_a_zero(tmp_path: Path):
    run = tmp_path / "old"
    run.mkdir()
    (run / "result.json").write_text(json.dumps({"status": "finished", "experiment": "old", "steps": 10,
                                                 "final_metrics": {"eval/loss": 3.0}}))
    old = record_from_run_dir(run)
    report = make_report([old], [old], HYPOTHESIS, experiment="old", baseline_name="base")
    assert "| parameters: total / active per token | — | — |" in cost_section(report)
