"""Candidate vs baseline reports: records -> comparison -> verdict -> markdown.

Pure core (`compare`, `verdict`, `make_report`, `render_markdown`, `render_status`) and
thin adapters (`record_from_run_dir`, `records_from_mlflow`, `build_report`, plots).
Nothing heavy is imported here: scipy, matplotlib and mlflow load inside the functions.
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
