"""The comment a reviewer acts on (issue 37, items 1-3), rendered from the demo's recorded runs.

`demo_runs` rebuilds the six runs of `make demo` (next-line-lr vs next-line-base, 3 paired seeds)
with the figures the issue measured: per-seed improvements +0.25 %, -0.32 %, +0.29 % of
`eval/loss` at 6.32-6.36, 0.1068 device-hours used against the 0.129 the approved plan said,
the same P1 gradient spike on both sides, `train/lr` logged at its decayed end, throughput 50 %
apart from machine load, lm-eval's accuracy equal on both sides with its stderr and count,
bits per byte beside every loss, 27/27 data expectations met. Each test checks one promise of
the first screen (the text before the first `<details>`) or of the evidence under it.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import scipy.stats  # noqa: F401 - imported at collection, like every report test module's first use pays it

from reports import build_report
from reports.records import Alert, Cost, DataInfo, Perf, RunRecord

SEEDS = (1234, 1235, 1236)
BASE = {1234: 6.3400, 1235: 6.3200, 1236: 6.3600}
BETTER = {1234: 0.0025, 1235: -0.0032, 1236: 0.0029}  # improvement = 1 - candidate / baseline
HYPOTHESIS = {
    "statement": "Doubling the peak learning rate from 3e-3 to 6e-3 lowers the held-out loss after 60 steps by at "
                 "least 3 percent.",
    "metric": "eval/loss", "direction": "decrease", "min_effect": 0.03, "baseline": "next-line-base", "seeds": 3,
}
SHA = "0123456789abcdef0123456789abcdef01234567"
ROWS = ({"source": "code", "documents": 1204, "tokens": 812345, "duplicate_rate": 0.0, "empty_rate": 0.0,
         "requested_weight": 0.4, "realised_weight": 0.41, "js_divergence": 0.0},
        {"source": "docs", "documents": 3310, "tokens": 540210, "duplicate_rate": 0.01, "empty_rate": 0.0,
         "requested_weight": 0.4, "realised_weight": 0.39, "js_divergence": 0.0})


def _run(name: str, seed: int, loss: float, *, lr: float, tokens_per_s: float) -> RunRecord:
    steps = range(10, 61, 10)
    curve = [(s, loss + 0.1 + 2.0 * math.exp(-s / 15) + 0.01 * (seed - 1235)) for s in steps]
    final = {
        "eval/loss": loss, "eval/bpb": loss * 0.4127, "eval/code/loss": loss * 0.93, "eval/code/bpb": loss * 0.93 * 0.41,
        "train/loss": curve[-1][1], "train/lr": lr / 10, "perf/tokens_per_s": tokens_per_s, "perf/mfu": tokens_per_s / 1e5,
        "perf/peak_mem_gb": 0.61,
        "eval/task/demo_next_line/acc": 0.34, "eval/task/demo_next_line/acc_stderr": 0.0476,
        "eval/task/demo_next_line/n": 100.0,
    }
    alerts = (Alert("P1", "grad_norm_spike", "grad norm 12x its running mean", 40),) if seed == 1235 else ()
    return RunRecord(
        run_id=f"{name}-s{seed}", experiment=name, seed=seed, status="finished", final_metrics=final,
        history={"train/loss": curve, "eval/loss": [(50, loss + 0.02), (60, loss)]},
        params={"train.lr": lr, "model.hidden_size": 128, "train.max_steps": 60},
        tags={"trainer_version": "t1", "git_sha": SHA, "head_sha": SHA, "dirty": "False"},
        data=DataInfo(version="data-1", mixture_requested={"code": 0.4, "docs": 0.4},
                      mixture_realised={"code": 0.41, "docs": 0.39}, checks_passed=True, checks_total=27,
                      checks_met=27, check_rows=ROWS, checks_against="next-line-base" if name != "next-line-base" else None),
        alerts=alerts, cost=Cost(device_hours=0.0356, estimate_device_hours=0.0431, wall_s=128.2, estimate_wall_s=155.1),
        perf=Perf(tokens_per_s=tokens_per_s, mfu=tokens_per_s / 1e5, peak_mem_gb=0.61, parameters=1_115_264,
                  active_parameters=1_115_264),
        env={"torch": "2.13.0", "python": "3.11.7"}, mlflow_run_id=f"{'c' if name == 'next-line-lr' else 'b'}{seed:031d}",
        hypothesis=dict(HYPOTHESIS),
    )


def demo_runs() -> tuple[list[RunRecord], list[RunRecord]]:
    candidates = [_run("next-line-lr", s, BASE[s] * (1 - BETTER[s]), lr=6e-3, tokens_per_s=1504.0) for s in SEEDS]
    baselines = [_run("next-line-base", s, BASE[s], lr=3e-3, tokens_per_s=1000.0) for s in SEEDS]
    return candidates, baselines


class FakeMlflow:
    """What `build_report` asks of an MlflowClient for the compare link: each run's experiment."""

    def __init__(self, uri: str) -> None:
        self._tracking_client = SimpleNamespace(tracking_uri=uri)

    def get_run(self, run_id: str) -> SimpleNamespace:
        return SimpleNamespace(info=SimpleNamespace(experiment_id="1" if run_id.startswith("c") else "2"))


GITHUB = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "octo/train", "GITHUB_RUN_ID": "4242"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    candidates, baselines = demo_runs()
    out = tmp_path_factory.mktemp("report")
    with pytest.MonkeyPatch.context() as patch:  # logging the files to MLflow is not what this checks (and imports mlflow)
        patch.setattr("reports.plots.log_to_mlflow", lambda *args, **kwargs: None)
        return build_report(candidates, baselines, out_dir=out, experiment="next-line-lr",
                            baseline_name="next-line-base", mlflow_url="https://mlflow.example.org",
                            mlflow_client=FakeMlflow("https://mlflow.example.org"), env=dict(GITHUB),
                            pngs=False)  # the PNGs: tests/unit/test_report_records.py


def first_screen(markdown: str) -> str:
    """What a reviewer sees before opening anything: the text before the first `<details`."""
    return markdown.split("<details", 1)[0]


def test_the_first_screen_states_the_verdict_in_words_without_the_failure_icon(built):
    top = first_screen(built.markdown)
    assert built.verdict.outcome == "refuted"
    assert top.startswith("## Refuted: `next-line-lr` vs `next-line-base`")
    assert "❌" not in top  # a refuted hypothesis is a result, not a failure


def test_effect_and_bound_in_one_sentence_and_one_sign_convention(built):
    top = first_screen(built.markdown)
    v = built.verdict
    assert v.effect == pytest.approx(0.00073, abs=2e-5) and v.effect_ci[1] == pytest.approx(0.0065, abs=2e-4)
    sentence = "**`eval/loss` improved 0.07 %, at most 0.65 % at 95 % confidence, 3 % required.**"
    assert sentence in top
    # The evidence uses the same convention: + is better, the test's mean is the sentence's effect,
    # and the per-seed rows are the issue's +0.25 %, -0.32 %, +0.29 %.
    test = built.markdown.split("🔬", 1)[1].split("</details>", 1)[0]
    assert "improvement (lower is better)" in test
    assert re.findall(r"\| (1234|1235|1236) \| [\d.]+ \| [\d.]+ \| ([+-]\d\.\d\d %) \|", test) == [
        ("1234", "+0.25 %"), ("1235", "-0.32 %"), ("1236", "+0.29 %")]
    assert "**+0.07 %** (one-sided 95 % bounds -0.50 % … +0.65 %)" in test
    assert "-0.07 %" not in built.markdown and "[-0.65 %" not in built.markdown  # the other sign is gone


def test_cost_is_against_the_plan_approved_at_launch(built):
    top = first_screen(built.markdown)
    assert ("0.1068 device-hours for the candidate's 3 runs, 83 % of the 0.1293 the approved plan estimated "
            "(recorded at launch)") in top
    assert "over the plan" not in top


def test_the_first_screen_says_what_merging_does_and_who_can_override(built):
    from pipelines.trusted.promote import OVERRIDE_LABEL
    from reports.headline import OVERRIDE_LABEL as SHOWN

    top = first_screen(built.markdown)
    assert SHOWN == OVERRIDE_LABEL
    assert "Merging does **not** promote the model (a refuted verdict does not)" in top
    assert f"`{OVERRIDE_LABEL}`" in top and "write access other than the author" in top


def test_commit_time_and_links_are_on_the_first_screen(built):
    top = first_screen(built.markdown)
    assert f"commit `{SHA[:12]}`" in top
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", top)
    assert "[workflow run](https://github.com/octo/train/actions/runs/4242)" in top
    link = re.search(r"\[MLflow: compare the 6 runs\]\((\S+)\)", top)
    assert link, top
    from urllib.parse import unquote

    url = unquote(link.group(1))
    assert url.startswith("https://mlflow.example.org/#/compare-runs?runs=[")
    assert all(f"c{s:031d}" in url and f"b{s:031d}" in url for s in SEEDS) and 'experiments=["1","2"]' in url
    from reports.render import render_markdown

    with_pngs = render_markdown(replace(built.report, plots=("train_loss.png",)))
    assert "`train_loss.png`, in the `report-next-line-lr` artifact of the workflow run" in with_pngs  # where they are


def test_the_evidence_shows_the_interval_against_the_margin_and_curves_with_their_spread(built):
    md = built.markdown
    chart = md.split("```text\n", 1)[1].split("```", 1)[0]
    assert "▲ 3 %" in chart and "●" in chart and "[" in chart and "95 % bounds" in chart
    assert chart.index("]") < chart.index("▲") or chart.splitlines()[2].index("]") < chart.splitlines()[-1].index("▲")
    from reports.render import mermaid_blocks

    (train,) = [b for b in mermaid_blocks(md) if "train/loss" in b]
    assert train.count('    line "') == 6 and "min" in train and "max" in train  # mean and band per side
    assert "**Blue**: candidate" in md and "**orange**: baseline" in md  # the legend xychart lacks
    assert "`eval/loss` was logged at 2 steps (50, 60): too few points for a curve" in md


def test_alerts_of_both_sides_say_when_the_baseline_had_the_same(built):
    section = built.markdown.split("⚠️ Alerts", 1)[1].split("</details>", 1)[0]
    assert "(candidate 1, baseline 1, worst P1)" in section
    assert re.search(r"\| candidate \| 1235 \|.*grad_norm_spike.*\| yes \|", section)
    assert re.search(r"\| baseline \| 1235 \|.*grad_norm_spike.*\| yes \|", section)
    assert "also fired in the baseline on the same seed" in section


def test_exploratory_metrics_are_filtered_and_honest(built):
    md = built.markdown
    other = md.split("<summary>Other metrics", 1)[1].split("</details>", 1)[0]
    everything = md.split("<summary>All metrics", 1)[1].split("</details>", 1)[0]
    for row in ("| `eval/bpb`", "| `eval/code/bpb`", "acc_stderr` |", "/n` |", "| `train/lr`"):
        assert row not in other and row not in everything, row  # duplicates, statistics of statistics, decayed lr
    assert "`eval/bpb` (restates `eval/loss`" in everything and "`train/lr` (the schedule's value" in everything
    assert "perf/tokens_per_s" not in other  # machine load is not an effect of the change
    assert "`perf/tokens_per_s` (machine-dependent)" in everything
    assert "e-1" not in md and "e-0" not in md  # nothing like -1.85e-17: equal values are 0
    acc = re.search(r"\| `eval/task/demo_next_line/acc` \| higher \| 0\.34 \| 0\.34 \| ([^|]+) \|", everything)
    assert acc and acc.group(1).strip() == "0.00 %"
    params = md.split("Parameters changed", 1)[1].split("</details>", 1)[0]
    assert "| `train.lr` | 0.003 | 0.006 |" in params  # as configured


def test_the_data_checks_summary_and_per_source_table(built):
    md = built.markdown
    assert "<summary>Data (27/27 expectations met)</summary>" in md
    assert "Data checks: candidate ✅ 27/27 expectations met (drift against `next-line-base`)" in md
    assert "| `code` | 1,204 | 812,345 | 0.0% | 0.0% | 0.40 / 0.41 | 0.000 |" in md


def test_the_terminal_summary_is_the_same_first_screen_in_plain_text(built):
    text = (built.out_dir / "summary.txt").read_text()
    lines = text.splitlines()
    assert lines[0] == "REFUTED: next-line-lr vs next-line-base"
    assert lines[1] == "eval/loss improved 0.07 %, at most 0.65 % at 95 % confidence, 3 % required."
    assert any(line.startswith("cost ") and "83 % of the 0.1293" in line for line in lines)
    assert any(line.startswith("if merged ") and "promote-override" in line for line in lines)
    assert "https://github.com/octo/train/actions/runs/4242" in text and "compare-runs" in text
    assert "**" not in text and "](" not in text  # no raw markdown on a terminal
    assert "▲ 3 %" in text and "seed 1235: baseline 6.32" in text


def test_a_local_store_links_the_compare_view_with_how_to_start_the_ui(tmp_path, monkeypatch):
    monkeypatch.setattr("reports.plots.log_to_mlflow", lambda *args, **kwargs: None)
    candidates, baselines = demo_runs()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    built = build_report(candidates, baselines, out_dir=tmp_path / "r", mlflow_client=FakeMlflow(uri), env={},
                         pngs=False)
    top = first_screen(built.markdown)
    assert "[MLflow: compare the 6 runs](http://127.0.0.1:5000/#/compare-runs?" in top
    assert f"start its UI first: `mlflow ui --backend-store-uri {uri}`" in top
    assert "workflow run" not in top


def test_over_the_plan_and_no_recorded_plan_are_said(tmp_path):
    candidates, baselines = demo_runs()
    over = [replace(r, cost=replace(r.cost, device_hours=0.06)) for r in candidates]
    top = first_screen(build_report(over, baselines, out_dir=tmp_path / "a", env={}, pngs=False).markdown)
    assert "139 % of the 0.1293 the approved plan estimated (recorded at launch): **over the plan**" in top
    unplanned = [replace(r, cost=replace(r.cost, estimate_device_hours=None)) for r in candidates]
    top = first_screen(build_report(unplanned, baselines, out_dir=tmp_path / "b", env={}, pngs=False).markdown)
    assert "these runs recorded no plan at launch, so there is no estimate to compare with" in top


def test_a_supported_verdict_says_merging_promotes_and_states_the_lower_bound(tmp_path):
    candidates, baselines = demo_runs()
    better = {1234: 0.051, 1235: 0.048, 1236: 0.055}
    strong = [replace(r, final_metrics={**r.final_metrics, "eval/loss": BASE[r.seed] * (1 - better[r.seed])})
              for r in candidates]
    built = build_report(strong, baselines, out_dir=tmp_path, env={}, pngs=False)
    top = first_screen(built.markdown)
    assert built.verdict.outcome == "supported" and top.startswith("## Supported:")
    assert re.search(r"\*\*`eval/loss` improved 5\.\d\d %, at least 4\.\d\d % at 95 % confidence, 3 % required\.\*\*", top)
    assert "Merging promotes this model to `champion`" in top


def test_launch_estimate_is_the_plan_of_the_file_not_of_the_dumped_spec():
    """The demo's plan priced a run at 0.0431 device-hours (measured CPU MFU 0.037); re-planning the
    run's spec.resolved.json gave 0.35 MFU and a 782 % alarm. What is recorded is the file's plan."""
    from reports.records import launch_estimate
    from validation.loader import load_spec
    from validation.plan import make_plan
    from validation.spec import ExperimentSpec

    spec = load_spec(Path(__file__).resolve().parents[2] / "experiments" / "next-line-lr.yaml")
    recorded = launch_estimate(spec)
    assert recorded["estimate_device_hours"] == pytest.approx(make_plan(spec).compute.device_hours, rel=1e-4)
    assert recorded["estimate_mfu"] == pytest.approx(0.037)
    dumped = ExperimentSpec.model_validate(spec.model_dump(mode="json"))
    assert make_plan(dumped).compute.assumed_mfu == pytest.approx(0.35)  # why the report must not re-plan
