"""The comment as GitHub would show it.

Markdown goes through `cmarkgfm` (bindings to cmark-gfm, GitHub's own Markdown engine)
with raw HTML allowed (GitHub keeps `<details>`/`<summary>`) and the GFM tag filter on
(`tests/infra/github_markdown.py`).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from reports.compare import HypothesisView
from reports.records import Alert
from reports.render import (
    GITHUB_COMMENT_LIMIT,
    MAX_CHART_POINTS,
    STAGES,
    mermaid_blocks,
    mermaid_number,
    render_markdown,
    render_status,
    write_step_summary,
)
from reports.report import make_report
from tests.infra.github_markdown import to_html
from tests.infra.report_runs import record

HYPOTHESIS = HypothesisView(
    metric="eval/loss", direction="decrease", min_effect=0.02, alpha=0.05, seeds=3, baseline="base",
    statement='Doubling the LR lowers loss by 2 % | <script>alert("x")</script> cc @octocat "quoted"',
)


def report_of(cand_finals=(3.0, 3.02, 2.98), base_finals=(3.2, 3.22, 3.18), **record_changes):
    cands = [record("higher-lr", 1 + i, v, **record_changes) for i, v in enumerate(cand_finals)]
    bases = [record("base", 1 + i, v) for i, v in enumerate(base_finals)]
    return make_report(cands, bases, HYPOTHESIS)


# --------------------------------------------------------------------------- markdown structure


def test_comment_renders_as_github_would_show_it():
    md = render_markdown(report_of(), mlflow_url="https://mlflow.example.internal")
    html = to_html(md)
    headline = re.search(r"<h2>(.*?)</h2>", html).group(1)
    assert headline.startswith("Supported") and "higher-lr" in headline and "❌" not in html.split("<details")[0]
    assert html.index("<h2>") < html.index("<strong><code>eval/loss</code> improved") < html.index("<details")
    assert html.count("<details") == html.count("</details>") >= 6
    assert html.count('<pre lang="mermaid">') == 2  # eval/loss and train/loss
    # user text is escaped: no script, no broken table, no mention
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "@octocat" not in html and "@\u200boctocat" in html
    seed_table = html[html.index("<table>"):html.index("</table>")]
    assert seed_table.count("<tr>") == 1 + 3 + 1  # header, a row per paired seed, the mean
    assert 'href="https://mlflow.example.internal/#/runs/mlflow1"' in html
    assert "Parameters changed (1)" in html and "train.lr" in html and "model.hidden_size" not in html


def test_charts_are_downsampled_and_numeric():
    md = render_markdown(report_of())
    for block in mermaid_blocks(md):
        lines = block.splitlines()
        assert lines[0].startswith("%%{init:") and lines[1] == "xychart-beta"  # colours, then the chart
        steps = json.loads(re.search(r"x-axis \"step\" (\[.*\])", block).group(1))
        assert 2 <= len(steps) <= MAX_CHART_POINTS and steps == sorted(steps)
        for line in (ln for ln in lines if ln.strip().startswith("line ")):
            values = json.loads(line[line.index("["):])
            assert len(values) == len(steps)
    train = next(b for b in mermaid_blocks(md) if "train/loss" in b)
    assert '[1, ' in train and ", 400]" in train  # first and last step kept


def test_numbers_never_use_exponent_notation():
    assert mermaid_number(1.23456e-7) == "0.00000012346"
    assert mermaid_number(-2.5e9) == "-2500000000"
    assert mermaid_number(3.14159) == "3.1416"


def test_a_very_long_report_is_truncated_and_says_so():
    many_params = {f"train.param_{i:05d}": i for i in range(6000)}
    alerts = tuple(Alert("P1", "loss_rise", "loss rose for 50 steps " * 3, i) for i in range(2000))
    report = report_of(params=many_params, alerts=alerts)
    md = render_markdown(report)
    assert len(md) <= GITHUB_COMMENT_LIMIT
    assert len(md) > GITHUB_COMMENT_LIMIT - 2000  # shortened to fit, not emptied
    note = md.split("Report truncated")[1]
    assert "shortened: Parameters changed (first " in note and "of 6,002 rows)" in note  # + train.lr and model.hidden_size, absent on one side
    assert "Alerts (first " in note and "left out" not in note  # both long tables share the room
    assert "<summary>Data (" in md and "<summary>Runs" in md  # small sections are kept whole
    assert "more rows left out to fit the comment limit" in md
    html = to_html(md)
    assert "train.param_00000" in html and "train.param_05999" not in html  # the first rows are kept
    assert "<h2>Supported" in html and "improved" in html  # the first screen is kept
    assert html.count("<details") == html.count("</details>")
    small = render_markdown(report, max_chars=3000)  # even tighter: still the headline, still says so
    assert len(small) <= 3000 and "Supported" in small and "truncated" in small


def test_single_seed_report_says_inconclusive():
    report = report_of(cand_finals=(3.0,), base_finals=(3.2,))
    html = to_html(render_markdown(report))
    assert "<h2>Inconclusive" in html and "one seed" in html and "needs ≥ 2 seeds" in html


def test_warnings_for_stale_baseline_and_different_environment():
    report = report_of(tags={"trainer_version": "t2"}, env={"torch": "2.14.0", "python": "3.11.2", "gpu": "H100"})
    md = render_markdown(report)
    assert "Stale baseline" in md and "Different environments (candidate vs baseline): torch: 2.14.0 vs 2.13.0." in md
    assert "[!WARNING]" in md


@pytest.mark.parametrize("stage", [key for key, _, _ in STAGES])
def test_status_snippets_render(stage):
    md = render_status(stage, experiment="higher-lr", step=120, total_steps=400, eta_s=330, loss=3.25,
                       detail="plan: 0.1 GPU-hours <b>", url="https://ci.example.internal/run/1")
    html = to_html(md)
    assert "<h2>" in html and "higher-lr" in html and "<b>" not in html
    if stage == "training":
        assert "Step 120 / 400 (30 %), ETA 6 min, loss 3.25" in html
    failed = to_html(render_status(stage, experiment="higher-lr", failed=True, body="| a | b |\n|---|---|\n| 1 | 2 |"))
    assert "❌" in failed and "failed</h2>" in failed and "<details>" in failed and "<td>1</td>" in failed


def test_step_summary_is_appended_only_when_the_variable_is_set(tmp_path):
    target = tmp_path / "summary.md"
    assert write_step_summary("# a", env={}) is None
    write_step_summary("# a", env={"GITHUB_STEP_SUMMARY": str(target)})
    write_step_summary("# b\n", env={"GITHUB_STEP_SUMMARY": str(target)})
    assert target.read_text() == "# a\n# b\n"


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(statement=st.text(min_size=1, max_size=2000), max_chars=st.integers(min_value=2500, max_value=GITHUB_COMMENT_LIMIT),
       n_params=st.integers(min_value=0, max_value=3000))
def test_any_statement_and_size_stays_under_the_limit_with_the_verdict_first(statement, max_chars, n_params):
    report = report_of(params={f"train.p{i}": i for i in range(n_params)})
    report = replace(report, comparison=replace(report.comparison, hypothesis=replace(HYPOTHESIS, statement=statement)))
    md = render_markdown(report, max_chars=max_chars)
    assert len(md) <= max_chars
    assert md.startswith("## Supported")
    html = to_html(md)
    assert html.count("<details") == html.count("</details>")
    assert "<script" not in html.replace("&lt;script", "")
