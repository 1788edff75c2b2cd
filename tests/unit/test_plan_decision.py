"""`pipeline plan` puts the decision first (issue 37, item 5): layout, memory, the time of every
run the plan trains, cost, the effect the planned seeds can detect (from `reports.verdict`'s own
power), reuse, passes over the data and evaluation points, each warned about where it wastes
the run; the 140 lines of resolved defaults only behind `--resolved`, JSON complete."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import scipy.stats  # noqa: F401 - the verdict's power imports it on first use: paid at collection, once
import typer
from typer.testing import CliRunner

from pipelines import cmd_validate
from reports.verdict import POWER, planning_sd, power
from validation.loader import load_spec
from validation.plan.decision import (
    MAX_PASSES,
    Detectable,
    data_passes,
    decision_warnings,
    eval_points,
    eval_steps,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The repository's experiments, with no finished runs and no prepared data of this checkout."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("PIPELINE_DATA_CACHE", str(tmp_path / "cache"))
    return tmp_path


def _plan(*args: str):
    app = typer.Typer()
    cmd_validate.register(app)
    return CliRunner().invoke(app, ["plan", *args])


def test_the_plan_opens_with_total_time_and_the_detectable_effect(clean: Path):
    result = _plan("experiments/next-line-lr.yaml")
    assert result.exit_code == 0, result.output
    top = result.stdout.split("\n\n")[0].splitlines()
    rows = {line.split()[0]: line for line in top[2:] if not line.startswith("  warning")}
    assert list(rows) == ["layout", "memory", "time", "cost", "detectable", "reuse", "data", "evaluation"]
    plan = json.loads(_plan("experiments/next-line-lr.yaml", "--format", "json").stdout)
    per_run = plan["preflight"]["compute"]["wall_seconds"]
    assert plan["decision"]["total_wall_seconds"] == pytest.approx(6 * per_run)  # 3 seeds + the baseline's 3
    assert "for all 6 run(s) one after another (3 seed(s) + the baseline's 3)" in rows["time"]
    # No runs to measure the noise: the effect as a multiple of it, and at two noise levels.
    assert "min_effect 3 % + " in rows["detectable"] and "x the seed noise (80% power, 3 paired seeds" in rows["detectable"]
    assert plan["decision"]["eval_points"] == 2
    assert any("evaluation gives 2 points per run (steps 50 and 60)" in line for line in top)
    assert "resolved spec:" not in result.stdout
    assert plan["resolved"]["train"]["lr"] == 0.006 and plan["resolution"]  # JSON stays complete


def test_the_detectable_effect_is_where_the_verdicts_power_reaches_80_percent():
    for n, sd, direction in ((3, 0.01, "decrease"), (8, 0.003, "increase"), (2, 0.05, "decrease")):
        effect = cmd_validate._effect_at(n, sd, 0.03, 0.05, direction)
        assert effect is not None and effect > 0.03
        assert power(n, sd, 0.03, 0.05, effect=effect, direction=direction) == pytest.approx(POWER, abs=1e-6)
        assert power(n, sd, 0.03, 0.05, effect=effect * 0.99, direction=direction) < POWER
    # The multiple of the noise: margin + k sd on the log scale is that same effect.
    k = cmd_validate._noise_multiple(3, 0.05)
    assert k is not None
    effect = cmd_validate._effect_at(3, 0.01, 0.03, 0.05, "increase")
    assert math.log1p(effect) == pytest.approx(math.log1p(0.03) + k * 0.01, rel=1e-6)
    assert cmd_validate._effect_at(2, 5.0, 0.03, 0.05, "decrease") is None  # no effect reaches it


def _run(root: Path, experiment: str, spec_hash: str, seed: int, loss: float) -> None:
    seed_dir = root / "20261204" / experiment / "abc" / "train" / f"seed-{seed}"
    seed_dir.mkdir(parents=True)
    (seed_dir / "identity.json").write_text(json.dumps({"experiment": experiment, "seed": seed,
                                                        "spec_hash": spec_hash, "identity": f"{seed}{experiment}"}))
    (seed_dir / "result.json").write_text(json.dumps({"status": "finished", "final_metrics": {"eval/loss": loss}}))


def test_the_seed_noise_is_measured_on_finished_paired_runs_and_sized_like_the_verdict(clean: Path):
    spec, base = load_spec(REPO / "experiments/next-line-lr.yaml"), load_spec(REPO / "experiments/next-line-base.yaml")
    runs = clean / "runs"
    pairs = {1234: (6.35, 6.34), 1235: (6.33, 6.35), 1236: (6.36, 6.34)}
    for seed, (mine, theirs) in pairs.items():
        _run(runs, "next-line-lr", spec.spec_hash(), seed, mine)
        _run(runs, "next-line-base", base.spec_hash(), seed, theirs)
    _run(runs, "next-line-lr", "another-config", 1237, 1.0)  # another configuration: not this spec's noise
    found = cmd_validate._detectable(spec, base, REPO)
    logs = [math.log(m / t) for m, t in pairs.values()]
    sd = math.sqrt(sum((x - sum(logs) / 3) ** 2 for x in logs) / 2)
    assert found.measured_noise == pytest.approx(sd) and found.noise == pytest.approx(planning_sd(sd, 3))
    assert found.effect == pytest.approx(cmd_validate._effect_at(3, planning_sd(sd, 3), 0.03, 0.05, "decrease"))
    assert "3 finished paired seeds under runs/" in found.noise_source


def test_passes_over_the_data_and_evaluation_points_are_warned_about():
    spec = load_spec(REPO / "experiments/published/llama3-8b.yaml")
    assert eval_steps(60, 50) == (50, 60) and eval_steps(500, 500) == (500,) and eval_steps(200, 50)[-1] == 200
    assert eval_points(10**7, 1) == 10**7 and eval_steps(10**7, 1) == (1, 2, 3, 4, 5, 10**7)  # not listed whole
    # The case: 32.77 M tokens per run over a 1.6 M-token corpus (weights 0.4 / 0.4 / 0.2).
    tokens = {"code": 1_065_944, "docs": 345_714, "reference": 136_599}
    passes = data_passes(spec, 32_768_000, tokens, counted=True)
    assert passes.corpus_tokens == sum(tokens.values())
    assert passes.per_source["reference"] == pytest.approx(0.2 * 32_768_000 / 136_599)
    warnings = decision_warnings(spec, eval_steps(500, 500), passes, Detectable(1, POWER, 0.05, None))
    assert warnings[0].startswith("the run passes over the data 21 times (32.77 M tokens over a 1.55 M-token corpus), "
                                  f"over source reference {passes.most:.0f} times") and passes.most > MAX_PASSES
    assert warnings[1].startswith("evaluation gives 1 point per run (step 500)")
    few = data_passes(spec, 32_768, tokens, counted=True)
    assert decision_warnings(spec, eval_steps(500, 50), few, Detectable(1, POWER, 0.05, None)) == ()


def test_the_pr_workflow_still_cuts_the_dry_run_block_out_of_the_plan_text(clean: Path, monkeypatch: pytest.MonkeyPatch):
    """experiment-pr.yml keeps `sed -n '/^dry run/,/^resolved spec:/{/^resolved spec:/d;p}'` of
    `pipeline plan --dry-run --format text` for the comment, and result_bundle.py the text before
    "\\nresolved spec:": the dry run stays the last block, the resolved spec absent by default."""
    block = "dry run: peak 1.0 GiB per device (plan 1.0 GiB, +0 %)\n  weights 1 GiB"
    monkeypatch.setattr(cmd_validate, "_dry_run", lambda spec: ({"peak_bytes": 1}, block, []))
    text = _plan("experiments/next-line-lr.yaml", "--dry-run").stdout
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("dry run"))
    cut = [line for line in lines[start:] if not line.startswith("resolved spec:")]
    assert "\n".join(cut).strip() == block
    assert text.split("\nresolved spec:", 1)[0] == text  # the bundle keeps all of it
