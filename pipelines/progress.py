"""Progress on the terminal: a line per stage event, a bar per training run fed by metrics.jsonl.

Used by `pipeline run | train | demo` (`pipelines.cmd_run`, `pipelines.cmd_demo`); its own
module so neither command module imports the other. Every figure on a line says what it is
("in 12.3 s", "elapsed 0:00:41", "about 0:01:10 left"): a bare time is not a reading.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

WORDS = {"skipped": "cached", "reused": "reused finished run"}
"""How a stage event reads on the terminal."""
STAGE_NOTES = {
    ("evaluate", "finished"): "collected every seed's final metrics (each training evaluated as it ran)",
    ("validate", "finished"): "spec valid",
}


def _detail(stage: str, event: str, detail: str) -> str:
    """`12.3s` (a stage's duration) as `in 12.3 s`; the evaluate stage says what it did instead."""
    if re.fullmatch(r"\d+(\.\d+)?s", detail):
        seconds = detail[:-1]
        note = STAGE_NOTES.get((stage, event))
        return f"{note}, in {seconds} s" if note else f"in {seconds} s"
    note = STAGE_NOTES.get((stage, event))
    return f"{note}: {detail}" if note and detail and stage != "validate" else detail


class RichReporter:
    """Progress bars: one line per stage event, a bar per training run fed by metrics.jsonl.

    `console` is where it draws (default: stderr); `trainings` the number of trainings the plan
    expects, shown as "training 2 of 6" (a reused run is not trained, so the count may stop short)."""

    def __init__(self, console: Any = None, *, trainings: int | None = None) -> None:
        from rich.console import Console

        self.console = console if console is not None else Console(stderr=True)
        # With a console of its own (the demo's terminal, the rest captured to a log), a bar does not
        # take over sys.stdout/sys.stderr: what a library prints stays in the log, not above the bar.
        self.redirect = console is None
        self.trainings = trainings
        self.started = 0

    def stage(self, experiment: str, stage: str, event: str, detail: str = "") -> None:
        icon = {"started": "[cyan]>[/]", "finished": "[green]ok[/]", "skipped": "[dim]=[/]", "reused": "[dim]=[/]",
                "failed": "[red]x[/]"}.get(event, "-")
        text = _detail(stage, event, detail)
        suffix = f" [dim]{text}[/]" if text else ""
        self.console.print(f"{icon} {experiment:<16} {stage:<9} {WORDS.get(event, event)}{suffix}", highlight=False)

    def bar(self, count: str) -> Any:
        """A Rich progress whose line fits an 80-column terminal: `2/6 next-line-base s1234 ━━━━
        12/60 steps  loss 6.901  0:01:10 left` (every figure labelled; the stage line after it
        says how long the training took)."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        return Progress(
            TextColumn(f"  [dim]{count}[/] [bold]{{task.description}}"), BarColumn(bar_width=None),
            MofNCompleteColumn(), TextColumn("steps  loss {task.fields[loss]}"), TimeRemainingColumn(),
            TextColumn("left"), console=self.console, transient=False,
            redirect_stdout=self.redirect, redirect_stderr=self.redirect,
        )

    def training(self, label: str, run_dir: Path, total_steps: int) -> Callable[[], None]:
        self.started += 1
        progress = self.bar(f"{self.started}/{self.trainings}" if self.trainings else f"#{self.started}")
        label = label.replace(" seed ", " s")
        task = progress.add_task(label, total=total_steps, loss="-")
        stop = threading.Event()

        def follow() -> None:
            metrics = run_dir / "metrics.jsonl"
            offset = 0
            while not stop.is_set():
                if metrics.exists():
                    with metrics.open("r", encoding="utf-8") as fh:
                        fh.seek(offset)
                        chunk = fh.read()
                        # Only consume complete lines; a half-written line is read next time.
                        cut = chunk.rfind("\n") + 1
                        offset += len(chunk[:cut].encode("utf-8"))
                    for line in chunk[:cut].splitlines():
                        try:
                            point = json.loads(line)
                        except ValueError:
                            continue
                        if point.get("key") == "train/loss":
                            progress.update(task, completed=int(point["step"]), loss=f"{point['value']:.3f}")
                stop.wait(0.5)

        progress.start()
        thread = threading.Thread(target=follow, daemon=True)
        thread.start()

        def done() -> None:
            stop.set()
            thread.join(timeout=2)
            progress.stop()

        return done
