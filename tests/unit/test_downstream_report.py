"""Task metrics in the report: the downstream table (value ± stderr, n per side) and the paired
verdict on a task accuracy, whose stated direction is `increase`."""

from __future__ import annotations

from dataclasses import replace

from reports.compare import HypothesisView
from reports.render import render_markdown
from reports.report import make_report
from tests.infra.github_markdown import to_html
from tests.infra.report_runs import record

TASK = "eval/task/demo_next_line/acc"
HYPOTHESIS = HypothesisView(
    metric=TASK, direction="increase", min_effect=0.02, alpha=0.05, seeds=3, baseline="base",
    statement="A higher learning rate picks the right next line more often on held-out code.",
)


def with_task(rec, acc: float):
    task = {TASK: acc, f"{TASK}_stderr": 0.04, "eval/task/demo_next_line/acc_norm": acc - 0.01,
            "eval/task/demo_next_line/acc_norm_stderr": 0.04, "eval/task/demo_next_line/n": 100.0}
    return replace(rec, final_metrics=rec.final_metrics | task)


def report_of(cand: tuple[float, ...], base: tuple[float, ...]):
    cands = [with_task(record("higher-lr", 1 + i, 3.0), v) for i, v in enumerate(cand)]
    bases = [with_task(record("base", 1 + i, 3.2), v) for i, v in enumerate(base)]
    return make_report(cands, bases, HYPOTHESIS)


def test_task_table_shows_value_stderr_and_n_for_both_sides():
    md = render_markdown(report_of((0.50, 0.52, 0.51), (0.40, 0.41, 0.39)))
    html = to_html(md)
    assert "Downstream tasks (2)" in html
    assert "| `demo_next_line` | **`acc`** | higher | 0.4 ± 0.04 (n 100) | 0.51 ± 0.04 (n 100) |" in md
    assert "| `demo_next_line` | `acc_norm` | higher |" in md
    assert "samples_&lt;task&gt;.jsonl" in html or "samples_<task>.jsonl" in md


def test_paired_verdict_on_a_task_accuracy_goes_the_stated_way():
    up = report_of((0.50, 0.52, 0.51), (0.40, 0.41, 0.39))
    assert up.verdict.outcome == "supported" and up.verdict.metric == TASK
    down = report_of((0.30, 0.31, 0.29), (0.40, 0.41, 0.39))
    assert down.verdict.outcome == "refuted"


def test_no_tasks_no_table():
    cands = [record("higher-lr", 1 + i, 3.0) for i in range(3)]
    bases = [record("base", 1 + i, 3.2) for i in range(3)]
    md = render_markdown(make_report(cands, bases, replace(HYPOTHESIS, metric="eval/loss", direction="decrease")))
    assert "Downstream tasks" not in md
