"""An experiment's comment on its pull request: training progress while it trains, the report at the end.

One sticky comment per PR and experiment (`pipelines.github.comment`), written on GitHub when
a PR number, `GITHUB_TOKEN` and `GITHUB_REPOSITORY` are known:

- `live_progress`: while a seed trains, every `PIPELINE_COMMENT_INTERVAL_S` (60 s) the
  comment shows its step, ETA and latest loss (best effort: the report is what must land);
- `publish_report`: the report replaces it. In the train workflow (`PIPELINE_REPORT_EXPORT`)
  the report is exported for a later job to post instead; without GitHub it goes to a local
  file through the dry-run code host.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from basics.errors import PipelineError
from basics.files import atomic_write_text

if TYPE_CHECKING:
    from pipelines.github.comment import StickyComment


def _on_github(pr: int | None) -> bool:
    return bool(pr and os.environ.get("GITHUB_TOKEN") and os.environ.get("GITHUB_REPOSITORY"))


def _github_comment(pr: int, experiment: str) -> StickyComment:
    from pipelines.github.client import GitHubConfig, PyGithubHost
    from pipelines.github.comment import StickyComment

    config = GitHubConfig.from_env(os.environ["GITHUB_REPOSITORY"])
    return StickyComment.for_experiment(PyGithubHost(config), pr, experiment, author=config.bot_login)


def live_progress(pr: int | None, experiment: str, seed_dir: Path, total: int) -> Callable[[], None]:
    """While a seed trains for a PR, update its sticky comment with step, ETA and live loss;
    returns the function that stops it."""
    if not _on_github(pr):
        return lambda: None
    assert pr is not None
    from reports.render import render_status

    comment = _github_comment(pr, experiment)
    stop = threading.Event()
    interval = float(os.environ.get("PIPELINE_COMMENT_INTERVAL_S", "60"))
    started = time.time()

    def follow() -> None:
        while not stop.wait(interval):
            step, loss = latest_loss(seed_dir / "metrics.jsonl")
            if step is None:
                continue
            elapsed = time.time() - started
            eta = elapsed / step * (total - step) if step else None
            try:
                comment.upsert(render_status("training", experiment=experiment, step=step, total_steps=total,
                                             eta_s=eta, loss=loss), {"stage": "training"})
            except PipelineError:
                pass  # progress is best effort; the final report is what must land

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()

    def finish() -> None:
        stop.set()
        thread.join(timeout=5)

    return finish


def publish_report(experiment: str, report_dir: Path, *, pr: int | None, sha: str | None) -> Path | None:
    """Update the sticky comment: on GitHub when a PR and a token are known, else a local file."""
    from pipelines.github.client import DryRunCodeHost
    from pipelines.github.comment import StickyComment

    body = (report_dir / "report.md").read_text(encoding="utf-8")
    export = os.environ.get("PIPELINE_REPORT_EXPORT")
    if export:
        # In the train workflow: a short job after training posts this with a fresh token
        # (the training job's GITHUB_TOKEN lives at most 24 h; a training may take 72).
        Path(export).mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(export) / "report.md", body)
        if (report_dir / "result.json").is_file():  # the candidate runs and verdict, for the attest job
            atomic_write_text(Path(export) / "result.json", (report_dir / "result.json").read_text(encoding="utf-8"))
        # The curves as images (mean and seed band) travel in the same artifact: the comment shows
        # them as Mermaid charts and names these files (GitHub shows no image without a host).
        for png in sorted(report_dir.glob("*.png")):
            if png.is_file() and not png.is_symlink():
                (Path(export) / png.name).write_bytes(png.read_bytes())
        return Path(export) / "report.md"
    state = {"stage": "report"} | ({"validated_sha": sha} if sha else {})
    if _on_github(pr):
        assert pr is not None
        _github_comment(pr, experiment).upsert(body, state)
        return None
    host = DryRunCodeHost(report_dir / "comments")
    posted = StickyComment.for_experiment(host, pr or 0, experiment, author=host.bot_login).upsert(body, state)
    path = Path(host.path_of(posted))
    atomic_write_text(report_dir / "comment.md", path.read_text(encoding="utf-8"))
    return report_dir / "comment.md"


def latest_loss(metrics: Path) -> tuple[int | None, float | None]:
    """The last (step, train/loss) in a metrics.jsonl (a torn last line is ignored)."""
    step: int | None = None
    loss: float | None = None
    try:
        lines = metrics.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None, None
    for line in lines:
        try:
            point = json.loads(line)
        except ValueError:
            continue
        if point.get("key") == "train/loss":
            step, loss = int(point["step"]), float(point["value"])
    return step, loss
