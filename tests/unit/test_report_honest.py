"""Honest values and a symmetric rule (issue 20, items 2 and 3): each test reproduces a
defect of the earlier report code.

- A non-finite final metric is never replaced by an older history point.
- A non-finite eval metric is divergence (the `diverged` outcome and a P0 alert).
- Spread is judged relative to the metric: near-copies (float jitter) and A/A are not samples.
- A seed diverged on both sides is left out, and the verdict says so.
- `min_effect` is bounded where it can be reached and printed with every digit.
"""

from __future__ import annotations

import json
import math

import pytest

from reports import build_report, record_from_run_dir
from reports.compare import HypothesisView, compare
from reports.records import RunRecord
from tests.infra.report_runs import SPEC, write_run

SEEDS = (1234, 1235, 1236)


def run(seed, value, *, experiment="cand", status="finished", step=None, metric="eval/loss"):
    return RunRecord(f"{experiment}-{seed}", experiment, seed, status, {metric: value}, diverged_at_step=step)


def hyp(**kw):
    return HypothesisView(**{"metric": "eval/loss", "direction": "decrease", "min_effect": 0.02, "alpha": 0.05,
                             "seeds": 3, **kw})


def _set_final(seed_dir, **final):
    result = json.loads((seed_dir / "result.json").read_text())
    result["final_metrics"].update(final)
    (seed_dir / "result.json").write_text(json.dumps(result))


# --------------------------------------------------------------------------- non-finite values


def test_a_nan_final_eval_loss_is_not_replaced_by_an_older_history_point(tmp_path):
    d = write_run(tmp_path, "higher-lr", 1, final_loss=3.0, lr=6e-3, check_ok=None)
    _set_final(d, **{"eval/loss": float("nan")})
    record = record_from_run_dir(d)
    assert "eval/loss" not in record.final_metrics  # was: the step-50 history value
    assert "eval/loss" in record.non_finite


def test_a_nan_final_non_eval_metric_stays_missing_and_is_named(tmp_path):
    d = write_run(tmp_path, "higher-lr", 1, final_loss=3.0, lr=6e-3, check_ok=None)
    _set_final(d, **{"perf/peak_mem_gb": float("inf")})
    record = record_from_run_dir(d)
    assert record.status == "finished" and "perf/peak_mem_gb" not in record.final_metrics
    assert record.non_finite == ("perf/peak_mem_gb",)


def test_a_nan_eval_loss_is_divergence_with_a_p0_alert_and_the_diverged_outcome(tmp_path):
    cands = [write_run(tmp_path / "c", "higher-lr", s, final_loss=v, lr=6e-3, check_ok=None)
             for s, v in zip(SEEDS, (3.0, 3.01, 2.99), strict=True)]
    bases = [write_run(tmp_path / "b", "base", s, final_loss=v, lr=3e-3, check_ok=None)
             for s, v in zip(SEEDS, (3.2, 3.22, 3.18), strict=True)]
    # The trainer said "finished"; the eval loss at the end was NaN (a broken model).
    _set_final(cands[1], **{"eval/loss": float("nan")})
    record = record_from_run_dir(cands[1])
    assert record.status == "diverged", record.status
    assert any(a.level == "P0" and a.kind == "divergence" for a in record.alerts)
    built = build_report(cands, bases, out_dir=tmp_path / "out", env={})
    assert built.verdict.outcome == "refuted", built.verdict.reason
    assert "candidate diverged" in built.verdict.reason
    assert built.markdown.index("P0 divergence") < built.markdown.index("**Why:**")


def test_a_nan_eval_loss_in_the_history_is_divergence_too(tmp_path):
    d = write_run(tmp_path, "higher-lr", 1, final_loss=3.0, lr=6e-3, check_ok=None)
    text = (d / "metrics.jsonl").read_text()
    (d / "metrics.jsonl").write_text('{"step": 60, "key": "eval/loss", "value": NaN}\n' + text)
    record = record_from_run_dir(d)
    assert record.status == "diverged" and record.diverged_at_step == 60


# --------------------------------------------------------------------------- spread relative to the metric


def test_near_copies_differing_by_float_jitter_are_not_supported():
    # The review's case: the candidate is the baseline scaled by 0.97 plus 2e-9 of jitter.
    # An absolute 1e-12 guard let it through as "supported" at p = 1.6e-14.
    base = [run(s, v, experiment="base") for s, v in ((1, 3.50), (2, 3.55), (3, 3.45))]
    cands = [run(s, b.final_metrics["eval/loss"] * 0.97 + j) for s, b, j in zip((1, 2, 3), base, (2e-9, -1e-9, 0.0),
                                                                               strict=True)]
    v = verdict_of(cands, base)
    assert v.outcome == "inconclusive", v.reason
    assert "no noise estimate" in v.reason and v.p_value is None


def test_an_a_a_comparison_fed_to_the_report_is_inconclusive_with_the_right_advice():
    base = [run(s, v, experiment="base") for s, v in ((1, 3.50), (2, 3.55), (3, 3.45))]
    cands = [run(b.seed, b.final_metrics["eval/loss"] + 1e-9 * i) for i, b in enumerate(base)]
    v = verdict_of(cands, base)
    assert v.outcome == "inconclusive" and "A/A" in v.reason, v.reason


def test_a_side_whose_seeds_do_not_change_the_run_has_no_noise_estimate():
    base = [run(s, 3.5 + 1e-9 * s, experiment="base") for s in (1, 2, 3)]  # the seed changes nothing
    cands = [run(s, v) for s, v in ((1, 3.30), (2, 3.35), (3, 3.25))]
    v = verdict_of(cands, base)
    assert v.outcome == "inconclusive" and "the seed does not change the run" in v.reason, v.reason


def verdict_of(cands, bases, **kw):
    from reports.verdict import verdict

    return verdict(compare(cands, bases, hyp(**kw)), candidates=cands, baselines=bases)


# --------------------------------------------------------------------------- divergence on both sides


def test_a_seed_diverged_on_both_sides_is_left_out_and_said_so():
    cands = [run(1, 3.30), run(2, 3.40), run(3, 3.20), run(4, math.nan, status="diverged", step=40)]
    bases = [run(1, 3.50, experiment="base"), run(2, 3.60, experiment="base"), run(3, 3.40, experiment="base"),
             run(4, math.nan, experiment="base", status="diverged", step=35)]
    v = verdict_of(cands, bases)
    assert v.outcome != "refuted" and v.excluded_seeds == (4,), v.reason
    assert "Seed 4 diverged on both sides and is left out" in v.reason


def test_a_candidate_diverging_alone_is_refuted_and_the_reason_says_why():
    cands = [run(s, 3.5 * 0.94) for s in (1, 2, 3, 4)] + [run(5, math.nan, status="diverged", step=12)]
    bases = [run(s, 3.5 + 0.01 * s, experiment="base") for s in (1, 2, 3, 4, 5)]
    v = verdict_of(cands, bases)
    assert v.outcome == "refuted" and "1 of 5" in v.reason
    assert "refuted whatever its other seeds show" in v.reason


# --------------------------------------------------------------------------- min_effect


def test_min_effect_of_a_decrease_must_be_below_one_at_its_line(tmp_path):
    from basics.errors import SpecError
    from validation.spec import ExperimentSpec

    data = json.loads(json.dumps(SPEC))
    data["hypothesis"]["min_effect"] = 1.0  # "lower the loss by 100 %": unreachable, and log(0)
    with pytest.raises((SpecError, ValueError)) as caught:
        ExperimentSpec.model_validate(data)
    assert "min_effect" in str(caught.value) and "below 1" in str(caught.value)
    data["hypothesis"].update(direction="increase", metric="perf/tokens_per_s")
    assert ExperimentSpec.model_validate(data).hypothesis.min_effect == 1.0  # doubling throughput is reachable


def test_min_effect_is_printed_with_every_digit(tmp_path):
    from reports.render import render_markdown

    cands = [write_run(tmp_path / "c", "higher-lr", s, final_loss=v, lr=6e-3, check_ok=None)
             for s, v in zip(SEEDS, (3.0, 3.01, 2.99), strict=True)]
    bases = [write_run(tmp_path / "b", "base", s, final_loss=v, lr=3e-3, check_ok=None)
             for s, v in zip(SEEDS, (3.2, 3.22, 3.18), strict=True)]
    h = {**SPEC["hypothesis"], "min_effect": 0.0025}
    for d in cands:  # registered at training start with that margin
        spec = json.loads((d / "spec.resolved.json").read_text())
        spec["hypothesis"]["min_effect"] = 0.0025
        (d / "spec.resolved.json").write_text(json.dumps(spec))
    built = build_report(cands, bases, hypothesis=h, out_dir=tmp_path / "out", env={})
    md = render_markdown(built.report)
    assert "by at least 0.25 %" in md and "0.2%" not in md
    assert "margin 0.25 %" in built.verdict.rule


def test_a_nan_eval_loss_logged_to_mlflow_is_divergence_too():
    from types import SimpleNamespace as NS

    from reports.records import records_from_mlflow

    run = NS(info=NS(run_id="r1", status="FINISHED", start_time=0, end_time=36_000),
             data=NS(tags={"pipeline.seed": "1"}, params={}, metrics={"eval/loss": math.nan, "train/loss": 3.1}))

    class Client:
        def get_experiment_by_name(self, name):
            return NS(experiment_id="1")

        def search_runs(self, ids, filter_string="", max_results=1000):
            return [run]

        def get_metric_history(self, run_id, key):
            return [NS(step=10, value=3.1)]

    (record,) = records_from_mlflow(Client(), "higher-lr")
    assert record.status == "diverged" and "eval/loss" in record.non_finite
    assert "eval/loss" not in record.final_metrics
    assert any(a.level == "P0" and a.kind == "divergence" for a in record.alerts)
