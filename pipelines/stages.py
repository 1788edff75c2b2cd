"""Stages: typed results written last, skipped when already done for the same identity.

A stage is a function that does its work and returns its outputs (paths and figures).
`StageRunner.run` writes `stages/<name>.json` only after the outputs were checked
(exist, non-empty, parse): a stage that "succeeded" with a broken artifact fails loudly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from basics.errors import ArtifactError
from basics.files import atomic_write_json, read_json

STAGES = ("validate", "prepare", "check", "smoke", "train", "evaluate", "report")


class StageResult(BaseModel):
    """The commit marker of a stage: present and `ok` means done for this identity."""

    model_config = ConfigDict(frozen=True)

    stage: str
    identity: str
    status: Literal["ok", "failed", "interrupted"]
    started_at: float
    finished_at: float
    outputs: dict[str, Any] = {}
    message: str = ""

    @property
    def duration_s(self) -> float:
        return self.finished_at - self.started_at


def check_artifact(path: Path, *, kind: str = "file", min_bytes: int = 1) -> None:
    """Raise ArtifactError unless `path` exists, is non-empty and parses as its kind."""
    if kind == "dir":
        if not path.is_dir() or not any(path.iterdir()):
            raise ArtifactError(f"artifact {path} is missing or empty")
        return
    if not path.is_file():
        raise ArtifactError(f"artifact {path} is missing")
    size = path.stat().st_size
    if size < min_bytes:
        raise ArtifactError(f"artifact {path} is {size} bytes (expected at least {min_bytes})")
    if kind == "json":
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ArtifactError(f"artifact {path} is not valid JSON: {exc}") from exc
    elif kind == "jsonl":
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    json.loads(line)
                except ValueError as exc:
                    raise ArtifactError(f"artifact {path}:{n} is not valid JSON Lines: {exc}") from exc


@dataclass
class StageOutcome:
    """What a stage function returns: outputs to record and artifacts to check."""

    outputs: dict[str, Any] = field(default_factory=dict)
    artifacts: list[tuple[Path, str]] = field(default_factory=list)
    message: str = ""


class StageRunner:
    """Runs stages of one run directory, skipping those already done for `identity`."""

    def __init__(self, run_dir: Path, identity: str, on_event: Callable[[str, str, StageResult | None], None] | None = None):
        self.run_dir = run_dir
        self.identity = identity
        self.on_event = on_event or (lambda stage, event, result: None)
        (run_dir / "stages").mkdir(parents=True, exist_ok=True)

    def path(self, stage: str) -> Path:
        return self.run_dir / "stages" / f"{stage}.json"

    def done(self, stage: str) -> StageResult | None:
        data = read_json(self.path(stage))
        if not data:
            return None
        try:
            result = StageResult.model_validate(data)
        except ValueError:
            return None
        if result.status != "ok" or result.identity != self.identity:
            return None
        # The marker only counts while its artifacts are still intact.
        for art in result.outputs.get("_artifacts", []):
            try:
                check_artifact(Path(art[0]), kind=art[1])
            except ArtifactError:
                return None
        return result

    def run(self, stage: str, fn: Callable[[], StageOutcome], *, force: bool = False) -> StageResult:
        assert stage in STAGES, stage
        if not force:
            previous = self.done(stage)
            if previous is not None:
                self.on_event(stage, "skipped", previous)
                return previous
        self.on_event(stage, "started", None)
        started = time.time()
        try:
            outcome = fn()
            for path, kind in outcome.artifacts:
                check_artifact(path, kind=kind)
        except BaseException as exc:
            # Ctrl-C / SIGTERM (raised as KeyboardInterrupt by the CLI) is not a failure: the
            # command says "interrupted ... rerun resumes", and no "failed" line may precede it.
            interrupted = isinstance(exc, KeyboardInterrupt)
            failed = StageResult(
                stage=stage, identity=self.identity, status="interrupted" if interrupted else "failed",
                started_at=started, finished_at=time.time(),
                message=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            atomic_write_json(self.path(stage), failed.model_dump())
            if not interrupted:
                self.on_event(stage, "failed", failed)
            raise
        outputs = dict(outcome.outputs)
        outputs["_artifacts"] = [[str(p), k] for p, k in outcome.artifacts]
        result = StageResult(
            stage=stage, identity=self.identity, status="ok", started_at=started,
            finished_at=time.time(), outputs=outputs, message=outcome.message,
        )
        atomic_write_json(self.path(stage), result.model_dump())
        self.on_event(stage, "finished", result)
        return result
