"""Outcomes beyond the t-test: preregistered hypotheses, seeds added later, diverged
candidates (marked by the trainer or seen in the loss curve), alpha limits, and what the
seeds can decide.

Run directories are written in the trainer's format by `tests/infra/report_runs.write_run`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reports import build_report
from reports.prereg import REGISTRATION_FILE, read_registrations, register_hypothesis
from tests.infra.report_runs import SPEC, write_run

SEEDS = (1234, 1235, 1236)


def _pair(tmp_path: Path, cand_losses, base_losses, seeds=SEEDS):
    cands = [write_run(tmp_path / "c", "higher-lr", s, final_loss=v, lr=6e-3, check_ok=None) for s, v in zip(seeds, cand_losses, strict=True)]
    bases = [write_run(tmp_path / "b", "base", s, final_loss=v, lr=3e-3, check_ok=None) for s, v in zip(seeds, base_losses, strict=True)]
    return cands, bases


# --------------------------------------------------------------------------- preregistration


def test_registration_is_frozen_first_wins(tmp_path):
    first = register_hypothesis(tmp_path, "higher-lr", SPEC["hypothesis"], [1, 2, 3])
    again = register_hypothesis(tmp_path, "higher-lr", {**SPEC["hypothesis"], "direction": "increase"}, [1, 2, 3, 4])
    assert again == first and first["hypothesis"]["direction"] == "decrease" and first["seed_list"] == [1, 2, 3]
    other = register_hypothesis(tmp_path, "other", SPEC["hypothesis"], [1], results_existed=True)
    assert set(read_registrations(tmp_path)) == {"higher-lr", "other"} and other["results_existed"] is True


def test_the_verdict_uses_the_registered_hypothesis_and_shows_the_change(tmp_path):
    # The candidate is ~4 % *lower*: refuted for "increase", supported for the registered "decrease".
    cands, bases = _pair(tmp_path, (3.00, 3.01, 2.99), (3.13, 3.135, 3.115))
    for d in cands:
        register_hypothesis(d, "higher-lr", SPEC["hypothesis"], list(SEEDS))
    edited = {**SPEC["hypothesis"], "direction": "increase"}
    built = build_report(cands, bases, hypothesis=edited, out_dir=tmp_path / "out", env={})
    assert built.verdict.outcome == "supported", built.verdict.reason
    assert built.report.hypothesis.direction == "decrease"
    assert "Hypothesis changed after results:** direction decrease -&gt; increase" in built.markdown
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["hypothesis_changes"] == ["direction decrease -> increase"]
    assert result["current_hypothesis"]["direction"] == "increase"
    # Without a registration file the spec frozen into the run directory at training start
    # stands in for it; only runs with neither let the edited hypothesis decide.
    for d in cands:
        (d / REGISTRATION_FILE).unlink()
    fallback = build_report(cands, bases, hypothesis=edited, out_dir=tmp_path / "out2", env={})
    assert fallback.verdict.outcome == "supported" and fallback.report.hypothesis_changes
    for d in cands:
        (d / "spec.resolved.json").unlink()
    assert build_report(cands, bases, hypothesis=edited, out_dir=tmp_path / "out3", env={}).verdict.outcome == "refuted"


def test_seeds_added_after_registration_are_an_exploratory_look(tmp_path):
    seeds = (1, 2, 3, 4, 5)
    # Registered seeds 1-3 are inconclusive (noisy); with 4 and 5 added the interval would clear 2 %.
    cands, bases = _pair(tmp_path, (3.00, 2.80, 3.04, 2.90, 2.905), (3.1, 3.1, 3.1, 3.1, 3.1), seeds)
    for d in cands:
        register_hypothesis(d, "higher-lr", SPEC["hypothesis"], [1, 2, 3])
    built = build_report(cands, bases, hypothesis={**SPEC["hypothesis"], "seeds": 5}, out_dir=tmp_path / "out", env={})
    v = built.verdict
    assert v.n_pairs == 3 and v.outcome == "inconclusive", v.reason
    assert built.report.added_seeds == (4, 5)
    assert built.report.exploratory is not None and built.report.exploratory.n_pairs == 5
    assert "Seeds added after registration** (4, 5)" in built.markdown and "decides nothing" in built.markdown
    assert "seeds 3 -&gt; 5" in built.markdown


# --------------------------------------------------------------------------- divergence and NaN


def test_a_diverged_candidate_is_refuted_with_the_step_the_alert_on_top_and_the_curve(tmp_path):
    cands, bases = _pair(tmp_path, (3.0, 3.0, 3.0), (3.1, 3.12, 3.08))
    broken = cands[1]
    result = json.loads((broken / "result.json").read_text())
    result.update(status="diverged", diverged_at_step=40, final_metrics={"eval/loss": float("nan"), "train/loss": 34.0})
    (broken / "result.json").write_text(json.dumps(result))  # NaN is what json writes for float('nan')
    (broken / "alerts.jsonl").write_text(json.dumps(
        {"level": "P0", "kind": "divergence", "message": "loss 34.0 above ln(vocab) + 1", "step": 40}) + "\n")
    built = build_report(cands, bases, out_dir=tmp_path / "out", env={})
    assert built.verdict.outcome == "refuted"
    assert built.verdict.reason.startswith("Refuted: candidate diverged at step 40")
    md = built.markdown
    assert md.index("P0 divergence") < md.index("**Why:**")  # the alert is at the top
    assert "```mermaid" in md and "train/loss, diverged seed 1235" in md  # its own curve, not a mean
    assert "Unpaired seeds" not in md  # its baseline seed is explained by "Not finished"
    assert json.loads((tmp_path / "out" / "result.json").read_text())["verdict"]["diverged_at_step"] == 40


# --------------------------------------------------------------------------- limits shown


def test_alpha_above_the_limit_is_shown_with_its_override_and_the_table_level_matches(tmp_path):
    cands, bases = _pair(tmp_path, (3.00, 3.01, 2.99), (3.13, 3.135, 3.115))
    h = {**SPEC["hypothesis"], "alpha": 0.2, "alpha_override": "exploratory screen, confirmed later"}
    for d in cands:
        register_hypothesis(d, "higher-lr", h, list(SEEDS))
    md = build_report(cands, bases, hypothesis=h, out_dir=tmp_path / "out", env={}).markdown
    assert "alpha 0.2 (**above the 0.1 limit**, override: exploratory screen, confirmed later)" in md
    # 1 - 2 alpha: every interval is the verdict's one-sided 80 % bounds, named so
    assert "one-sided 80 % bounds" in md and "at 80 % confidence" in md and "95 %" not in md
    assert "exploratory" in md and "decide nothing" in md
    assert "**Rule:** one-sided paired t-test on per-seed log ratios, n = 3, alpha = 0.2, margin 2 %" in md


# --------------------------------------------------------------------------- limits and defaults in the spec and plan


def test_alpha_above_the_limit_needs_an_override_named_at_its_line(tmp_path):
    from basics.errors import SpecError
    from validation.loader import load_spec

    text = (Path(__file__).resolve().parents[2] / "experiments" / "base.yaml").read_text()
    assert "  alpha: 0.05\n" in text
    bad = tmp_path / "base.yaml"
    bad.write_text(text.replace("  alpha: 0.05\n", "  alpha: 0.3\n"))
    with pytest.raises(SpecError) as caught:
        load_spec(bad)
    line = text.splitlines().index("  alpha: 0.05") + 1
    assert f"base.yaml:{line}:" in str(caught.value) and "hypothesis.alpha" in str(caught.value)
    assert "alpha_override" in str(caught.value)
    ok = tmp_path / "ok" / "base.yaml"
    ok.parent.mkdir()
    ok.write_text(text.replace("  alpha: 0.05\n", "  alpha: 0.3\n  alpha_override: a cheap screen; anything it supports is re-run\n"))
    assert load_spec(ok).hypothesis.alpha == 0.3


@pytest.mark.parametrize(("seeds", "needle"), [(1, "cannot decide the hypothesis"), (2, "little power"), (3, "3 paired seeds")])
def test_the_plan_says_what_the_seeds_can_decide(seeds, needle):
    from validation.plan import make_plan, render_plan_markdown
    from validation.spec import ExperimentSpec

    data = json.loads(json.dumps(SPEC))
    data["hypothesis"]["seeds"] = seeds
    markdown = render_plan_markdown(make_plan(ExperimentSpec.model_validate(data)))
    assert "| verdict |" in markdown and needle in markdown


def test_a_run_the_trainer_did_not_mark_is_still_seen_diverging_from_its_loss_curve(tmp_path):
    from reports import record_from_run_dir

    cands, bases = _pair(tmp_path, (3.0, 3.0, 3.0), (3.1, 3.12, 3.08))
    # vocab 256: uniform guessing is ln 256 = 5.55; the loss climbs to 34 from step 30 on (lr x 100).
    rows = [{"step": s, "key": "train/loss", "value": 5.0 if s < 30 else 34.0} for s in range(10, 101, 10)]
    (cands[0] / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    record = record_from_run_dir(cands[0])
    assert record.status == "diverged" and record.diverged_at_step == 30
    # a NaN loss: the first non-finite step
    (cands[1] / "metrics.jsonl").write_text('{"step": 10, "key": "train/loss", "value": 5.0}\n'
                                           '{"step": 20, "key": "train/loss", "value": NaN}\n')
    assert record_from_run_dir(cands[1]).diverged_at_step == 20
    # a spike it recovered from is not divergence
    rows[5]["value"] = rows[6]["value"] = 2.0
    rows = rows[:7]
    (cands[2] / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert record_from_run_dir(cands[2]).status == "finished"
    built = build_report(cands, bases, out_dir=tmp_path / "out", env={})
    assert built.verdict.reason.startswith("Refuted: candidate diverged at step 20")
