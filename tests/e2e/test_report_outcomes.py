"""Outcomes beyond the t-test through the orchestrator: a NaN metric never aborts it, the A/A
(identical candidate) flow, and a learning rate 333x the baseline's refuted as diverged.

Run directories are written in the trainer's format by `tests/infra/report_runs.write_run`.
"""

from __future__ import annotations

import json
import math

from tests.infra.report_runs import SPEC, write_run
from tests.infra.tiny_experiments import BASE, CANDIDATE

# --------------------------------------------------------------------------- divergence and NaN


def test_a_nan_metric_never_aborts_orchestration(tmp_path):
    from pipelines.orchestrate import ExperimentFlow, RunOptions

    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    (tmp_path / "experiments").mkdir()
    seed_dir = write_run(tmp_path / "runs", "higher-lr", 1, final_loss=3.0, lr=6e-3, check_ok=None)
    result = json.loads((seed_dir / "result.json").read_text())
    result.update(status="diverged", diverged_at_step=12, final_metrics={"eval/loss": math.nan, "train/loss": math.inf})
    (seed_dir / "result.json").write_text(json.dumps(result))
    from validation.spec import ExperimentSpec

    flow = ExperimentFlow(tmp_path, RunOptions(tracking_uri="file:///nonexistent"))
    outcome = flow._evaluate(ExperimentSpec.model_validate(SPEC), [seed_dir], tmp_path / "runs")
    assert outcome.outputs["values"] == {"seed-1": None}


# --------------------------------------------------------------------------- A/A


def test_an_identical_candidate_is_not_trained_judged_tagged_or_charged(tmp_path, monkeypatch):
    from pipelines.orchestrate import ExperimentFlow, RunOptions
    from tests.infra.corpus import demo_corpus

    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "tiny-base.yaml").write_text(BASE)
    (tmp_path / "experiments" / "tiny-aa.yaml").write_text(
        "name: tiny-aa\nowner: someone-else\nextends: tiny-base.yaml\nhypothesis:\n"
        "  statement: The same configuration under another name gives the same held-out loss.\n"
        "  metric: eval/loss\n  direction: decrease\n  min_effect: 0.01\n  baseline: tiny-base\n")
    demo_corpus(tmp_path / "data" / "demo", 150_000)
    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(tmp_path / "runs"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    candidate, baseline = ExperimentFlow(tmp_path, RunOptions(tracking_uri=uri)).run(tmp_path / "experiments" / "tiny-aa.yaml")

    assert baseline is None and candidate.verdict == "identical" and candidate.seed_dirs == []
    assert not list((tmp_path / "runs").glob("*/*/*/train"))  # nothing trained, for either side
    comment = (candidate.report_dir / "comment.md").read_text()
    assert "Identical to `tiny-base` (same code, spec and data): nothing to compare" in comment
    assert "## ⚪ Identical: `tiny-aa` vs `tiny-base`" in comment
    assert "`name`" in comment and "`owner`" in comment and "`hypothesis.statement`" in comment
    result = json.loads((candidate.report_dir / "result.json").read_text())
    assert result["experiment"] == "tiny-aa" and result["verdict"]["outcome"] == "identical"
    assert result["cost"]["candidate"]["device_hours"] == 0.0
    assert not (tmp_path / "mlflow.db").exists() or not _verdict_tags(uri)
    # `--no-baseline` does not turn it into a comparison either
    again, _ = ExperimentFlow(tmp_path, RunOptions(tracking_uri=uri, run_baseline=False)).run(
        tmp_path / "experiments" / "tiny-aa.yaml")
    assert again.verdict == "identical" and not list((tmp_path / "runs").glob("*/*/*/train"))


def _verdict_tags(uri: str) -> list[str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return [r.data.tags["pipeline.verdict"] for r in runs if "pipeline.verdict" in r.data.tags]


# --------------------------------------------------------------------------- limits and defaults in the spec and plan


def test_lr_times_333_through_the_flow_is_refuted_as_diverged_with_the_alert_on_top(tmp_path, monkeypatch):
    """`pipeline run` of a learning rate 333x the baseline's (the review's case): the trainer
    stops the run as diverged, orchestration carries on, and the verdict says so. The baseline
    is not trained (`run_baseline=False`, `pipeline run --no-baseline`): a diverged candidate is
    refuted before any baseline value is compared (reports.verdict), so its training (one
    trainer process, ~10 s) would show nothing more."""
    import time

    from pipelines.orchestrate import ExperimentFlow, RunOptions
    from tests.infra.corpus import demo_corpus

    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "tiny-base.yaml").write_text(BASE)
    (tmp_path / "experiments" / "tiny-lr333.yaml").write_text(CANDIDATE.format(name="tiny-lr333", lr=1.0))
    demo_corpus(tmp_path / "data" / "demo", 150_000)
    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(tmp_path / "runs"))
    started = time.time()
    flow = ExperimentFlow(tmp_path, RunOptions(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", smoke=False,
                                               run_baseline=False))
    candidate, baseline = flow.run(tmp_path / "experiments" / "tiny-lr333.yaml")
    assert baseline is None and not list((tmp_path / "runs").glob("*/tiny-base/*/train"))
    print(f"lr x 333 flow: {time.time() - started:.0f} s")
    assert candidate.verdict == "refuted", candidate.verdict_reason
    assert candidate.verdict_reason.startswith("Refuted: candidate diverged at step")
    result = json.loads((candidate.seed_dirs[0] / "result.json").read_text())
    assert result["status"] == "diverged" and f"at step {result['diverged_at_step']}" in candidate.verdict_reason
    md = (candidate.report_dir / "report.md").read_text()
    assert md.index("divergence") < md.index("**Why:**")  # the alert above the verdict
