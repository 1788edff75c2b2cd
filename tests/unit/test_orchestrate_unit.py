"""Stages and run directories: the pieces `pipeline run` is built from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.rundir import atomic_write_json, finished_training_runs, new_run_dir, resolve_run
from pipelines.stages import ArtifactError, StageOutcome, StageRunner, check_artifact


def test_stage_runs_once_then_is_skipped_for_the_same_identity(tmp_path: Path) -> None:
    calls = []

    def work() -> StageOutcome:
        calls.append(1)
        out = tmp_path / "out.json"
        out.write_text(json.dumps({"ok": True}))
        return StageOutcome(outputs={"n": len(calls)}, artifacts=[(out, "json")])

    events: list[tuple[str, str]] = []
    runner = StageRunner(tmp_path, "id-1", on_event=lambda s, e, r: events.append((s, e)))
    first = runner.run("check", work)
    second = runner.run("check", work)
    assert calls == [1] and first.outputs["n"] == 1 and second.outputs["n"] == 1
    assert events == [("check", "started"), ("check", "finished"), ("check", "skipped")]

    # Another identity (new code, spec or data) runs it again.
    StageRunner(tmp_path, "id-2").run("check", work)
    assert calls == [1, 1]

    # A marker whose artifact was damaged later no longer counts.
    (tmp_path / "out.json").write_text("{broken")
    StageRunner(tmp_path, "id-2").run("check", work)
    assert len(calls) == 3


def test_stage_with_broken_artifact_fails_loudly_and_records_failure(tmp_path: Path) -> None:
    def bad() -> StageOutcome:
        empty = tmp_path / "report.md"
        empty.write_text("")
        return StageOutcome(artifacts=[(empty, "file")])

    runner = StageRunner(tmp_path, "id")
    with pytest.raises(ArtifactError, match="report.md is 0 bytes"):
        runner.run("report", bad)
    marker = json.loads((tmp_path / "stages" / "report.json").read_text())
    assert marker["status"] == "failed" and "0 bytes" in marker["message"]
    assert runner.done("report") is None


@pytest.mark.parametrize(
    ("content", "kind", "message"),
    [(None, "json", "missing"), ("", "file", "0 bytes"), ("{", "json", "not valid JSON"),
     ('{"a": 1}\nnope\n', "jsonl", ":2 is not valid JSON Lines")],
)
def test_check_artifact_rejects(tmp_path: Path, content: str | None, kind: str, message: str) -> None:
    path = tmp_path / "a"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ArtifactError, match=message):
        check_artifact(path, kind=kind)


def test_run_dirs_are_reused_and_resolvable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(tmp_path / "runs"))
    run = new_run_dir(tmp_path, "exp", "abc123")
    assert run.is_absolute() and run.parent.name == "exp"
    assert new_run_dir(tmp_path, "exp", "abc123") == run  # resume, not a second directory
    assert resolve_run(tmp_path, "exp/abc123") == run
    assert resolve_run(tmp_path, "abc123") == run
    assert resolve_run(tmp_path, "nope") is None

    seed = run / "train" / "seed-1"
    atomic_write_json(seed / "identity.json", {"identity": "k1"})
    assert finished_training_runs(tmp_path) == {}  # no result.json: not finished
    atomic_write_json(seed / "result.json", {"status": "failed"})
    assert finished_training_runs(tmp_path) == {}
    atomic_write_json(seed / "result.json", {"status": "finished"})
    assert finished_training_runs(tmp_path) == {"k1": seed}
