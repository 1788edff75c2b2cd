"""`pipeline demo` as a newcomer meets it (issue 37, item 4), without running it: the default is
the Makefile's, library output goes to the log and the demo's own lines to the terminal, the
expected time comes from the plan (baseline priced), progress lines say what each figure is,
and the demo ends with next steps. `make demo` itself is measured in the README."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from pipelines.cmd_demo import DEFAULT_EXPERIMENT, OVERHEAD_S, captured, expected_time, next_steps
from pipelines.progress import RichReporter

REPO = Path(__file__).resolve().parents[2]


def test_the_default_experiment_is_the_one_make_demo_runs():
    from typer.testing import CliRunner

    from pipelines.cli import app

    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^EXPERIMENT \?= (\S+)$", makefile, re.M).group(1) == DEFAULT_EXPERIMENT == "next-line-lr"
    shown = CliRunner().invoke(app, ["demo", "--help"], env={"COLUMNS": "200"}).output
    assert "[default: next-line-lr]" in shown and "higher-lr" not in shown


def test_library_output_goes_to_the_log_and_the_demo_lines_to_the_terminal(tmp_path, capfd):
    log = tmp_path / "logs" / "demo.log"
    with captured(log) as terminal:
        os.write(2, b"2026/12/04 INFO mlflow.store.db.utils: Creating initial MLflow database tables...\n")
        print("Overwriting default num_fewshot of demo_next_line from None to 0", file=sys.stderr)
        print("100%|##########| 100/100 [00:01<00:00]", flush=True)
        terminal.write("ok next-line-base train finished in 12.3 s\n")
    shown = capfd.readouterr()
    assert "ok next-line-base train finished" in shown.err
    assert "MLflow" not in shown.err + shown.out and "num_fewshot" not in shown.err and "100%" not in shown.out
    text = log.read_text()
    assert "Creating initial MLflow database tables" in text and "num_fewshot" in text and "100/100" in text
    print("after")  # the descriptors are back
    assert "after" in capfd.readouterr().out


def test_the_expected_time_is_the_plans_for_every_training_baseline_included():
    from validation.loader import load_spec
    from validation.plan import make_plan

    spec = load_spec(REPO / "experiments" / "next-line-lr.yaml")
    base = load_spec(REPO / "experiments" / "next-line-base.yaml")
    plan = make_plan(spec, baseline=base)
    assert plan.cost.baseline_runs == 3  # priced, as `pipeline plan` prices it (was "not priced")
    seconds, how = expected_time(plan, make_plan(base))
    assert seconds == 3 * plan.compute.wall_seconds + 3 * make_plan(base).compute.wall_seconds + OVERHEAD_S
    assert how.startswith("3 trainings x 2.6 min + baseline 3 x 2.6 min (the plan, at 0.037 of the peak")


def test_stage_lines_say_what_each_figure_is():
    from rich.console import Console

    console = Console(record=True, width=160)
    reporter = RichReporter(console, trainings=6)
    reporter.stage("next-line-lr", "evaluate", "finished", "0.0s")
    reporter.stage("next-line-lr", "check", "finished", "2.4s")
    reporter.stage("next-line-base", "train", "reused", "seed 1234: runs/x")
    text = console.export_text()
    assert "evaluate  finished collected every seed's final metrics (each training evaluated as it ran), in 0.0 s" in text
    assert "check     finished in 2.4 s" in text and "0.0s" not in text
    assert "reused finished run seed 1234" in text
    assert not reporter.redirect  # the demo's bars leave sys.stdout/sys.stderr to the log


def test_the_demo_ends_with_next_steps(tmp_path):
    report = tmp_path / "report"
    report.mkdir()
    (report / "comment.md").write_text("x")
    (report / "result.json").write_text('{"context": {"compare_url": "http://127.0.0.1:5000/#/compare-runs?runs=x"}}')
    lines = next_steps(tmp_path, "next-line-lr", report, tmp_path / "runs/logs/demo.log", "sqlite:///tmp/m.db")
    text = "\n".join(lines)
    assert "read the comment" in text and "comment.md" in text
    assert "mlflow ui --backend-store-uri sqlite:///tmp/m.db" in text and "http://127.0.0.1:5000/#/compare-runs" in text
    assert "pipeline plan experiments/mine.yaml" in text and "make demo EXPERIMENT=more-code" in text


def test_a_training_bar_fits_an_80_column_terminal_with_every_figure_labelled():
    from rich.console import Console

    console = Console(width=80, force_terminal=True, record=True)
    progress = RichReporter(console, trainings=6).bar("2/6")
    task = progress.add_task("next-line-base s1234", total=60, loss="6.901")
    progress.update(task, completed=12)
    console.print(progress.get_renderable())
    (line,) = console.export_text().splitlines()
    assert len(line) <= 80 and "…" not in line  # was cut: "elapsed … left …"
    assert line.startswith("  2/6 next-line-base s1234 ") and "12/60 steps  loss 6.901" in line and line.endswith(" left")
