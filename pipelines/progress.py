"""Progress on the terminal: a line per stage event, a bar per training run fed by metrics.jsonl.

Used by `pipeline run | train | demo` (`pipelines.cmd_run`, `pipelines.cmd_demo`); its own
module so neither command module imports the other.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path


class RichReporter:
    """Progress bars: one line per stage event, a bar per training run fed by metrics.jsonl."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)

    def stage(self, experiment: str, stage: str, event: str, detail: str = "") -> None:
        icon = {"started": "[cyan]>[/]", "finished": "[green]ok[/]", "skipped": "[dim]=[/]", "reused": "[dim]=[/]",
                "failed": "[red]x[/]"}.get(event, "-")
        suffix = f" [dim]{detail}[/]" if detail else ""
        word = {"skipped": "cached", "reused": "reused finished run"}.get(event, event)
        self.console.print(f"{icon} {experiment:<16} {stage:<9} {word}{suffix}")

    def training(self, label: str, run_dir: Path, total_steps: int) -> Callable[[], None]:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        progress = Progress(
            TextColumn("  [bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=self.console, transient=False,
        )
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
