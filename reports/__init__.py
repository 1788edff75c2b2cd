"""Candidate vs baseline reports: records -> comparison -> verdict -> markdown.

Pure core (`compare`, `verdict`, `make_report`, `render_markdown`, `render_status`) and
thin adapters (`record_from_run_dir`, `records_from_mlflow`, `build_report`, plots).
Nothing heavy is imported here: scipy, matplotlib and mlflow load inside the functions.

  records    `RunRecord`, from a run directory or from MLflow: all the report reads about a run
  compare    candidate vs baseline paired by seed: per-seed log ratios, t-intervals (`Comparison`)
  verdict    supported, refuted or inconclusive, with its reason (one-sided paired t-test)
  prereg     preregistration: the hypothesis frozen into a run's record when its training starts
  identical  a candidate identical to its baseline (A/A): no training, no verdict, no tags
  report     `Report`: comparison, verdict, diffs, cost, alerts of both sides and fairness warnings (pure)
  headline   the comment's first screen: verdict in words, effect and bound in one sentence, cost
             against the plan recorded at launch, what merging does, commit and links (pure)
  evidence   every effect as an improvement (+ = better), which metrics are outcomes, the interval chart (pure)
  markup     user text escaped for the comment's markdown (pure)
  render     markdown for the sticky PR comment and the step summary (pure)
  plots      PNG plots of the curves (matplotlib, Agg), saved next to report.md
  publish    `build_report`: runs in, `report/{report.md, summary.txt, result.json, *.png}` out (the adapter)
"""

from reports.compare import Comparison, MetricComparison, compare
from reports.publish import BuiltReport, build_report
from reports.records import RunRecord, record_from_run_dir, records_from_mlflow
from reports.render import render_markdown, render_status, write_step_summary
from reports.report import Report, make_report
from reports.verdict import Verdict, seeds_needed, verdict

__all__ = [
    "BuiltReport", "Comparison", "MetricComparison", "Report", "RunRecord", "Verdict", "build_report", "compare",
    "make_report", "record_from_run_dir", "records_from_mlflow", "render_markdown", "render_status", "seeds_needed",
    "verdict", "write_step_summary",
]
