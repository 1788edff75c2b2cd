"""PNG plots of the curves (matplotlib, Agg backend), saved next to report.md and
optionally logged to MLflow: per side the mean over seeds and a shaded band from the lowest
to the highest seed, every logged point. The comment shows the same curves as Mermaid charts
(GitHub renders those inline; an image would need a host); these travel with the report's
files (the workflow's report artifact, `pipelines.pr_comment.publish_report`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reports.report import Report

PLOT_METRICS = ("train/loss", "eval/loss")


def plot_file_name(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", metric).strip("_") + ".png"


def save_plots(report: Report, out_dir: str | Path, metrics: Sequence[str] | None = None) -> list[Path]:
    """One PNG per metric that either side logged a history for; returns the written paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    wanted = list(dict.fromkeys([*(metrics or ()), report.hypothesis.metric, *PLOT_METRICS]))
    written = []
    for metric in wanted:
        sides = (("candidate", report.experiment, report.candidates, "tab:blue"),
                 ("baseline", report.baseline_name, report.baselines, "tab:orange"))
        if not any(len(r.history.get(metric, [])) >= 2 for _, _, runs, _ in sides for r in runs):
            continue
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        for side, name, runs, color in sides:
            by_step: dict[int, list[float]] = {}
            for run in runs:
                for step, value in run.history.get(metric, []):
                    by_step.setdefault(step, []).append(value)
            if not by_step:
                continue
            steps = sorted(by_step)
            means = [sum(by_step[s]) / len(by_step[s]) for s in steps]
            seeds = len([r for r in runs if r.history.get(metric)])
            label = f"{side}: {name}" + (f" (mean of {seeds} seeds, band: min-max)" if seeds > 1 else "")
            if seeds > 1:
                ax.fill_between(steps, [min(by_step[s]) for s in steps], [max(by_step[s]) for s in steps],
                                color=color, alpha=0.2, linewidth=0)
            ax.plot(steps, means, color=color, linewidth=1.6, label=label, marker="o" if len(steps) < 5 else None)
        ax.set_xlabel("step")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric}: mean over seeds, band from lowest to highest seed", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / plot_file_name(metric)
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def log_to_mlflow(client: Any, run_id: str, paths: Sequence[Path], artifact_path: str = "report") -> None:
    """Logs report files to an MLflow run (`client` is an `MlflowClient`)."""
    from mlflow.exceptions import MlflowException

    from basics.errors import TrackingError

    try:
        for path in paths:
            client.log_artifact(run_id, str(path), artifact_path=artifact_path)
    except MlflowException as exc:
        raise TrackingError(f"MLflow: cannot log report artifacts to run {run_id}: {exc.message}") from exc
