"""Continuing a run on another layout (`pipeline train FILE --continue-from RUN_DIR`), the hint
when a run would ignore such checkpoints, and the small defects found on the way: the
checkpoint_corrupt alert's step, the SIGTERM console line, the artifact location of a sqlite
store, the TP layout log line.

The tests resolve real YAML files (no torch) and fake seed directories.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipelines import continuation
from tests.infra.layout_specs import FSDP2, ONE, TP2, scratch_repo, write_spec
from validation.resolved import ResolvedExperiment, resolve


def seeded(repo: Path, layout: dict[str, Any], **kw: Any) -> ResolvedExperiment:
    resolved = resolve(write_spec(repo, layout, **kw), repo)
    return resolved.for_seed(resolved.seeds[0])


IDENT = {"seed": 1234, "code_version": "c0de", "data_version": "da7a"}


def test_only_layout_and_batch_split_may_change_with_the_same_global_batch(tmp_path: Path) -> None:
    repo = scratch_repo(tmp_path)
    old = seeded(repo, FSDP2)
    for layout in (ONE, TP2):
        assert continuation.refusal(old, IDENT, seeded(repo, layout), "c0de", "da7a", 1234) is None

    other_lr = continuation.refusal(old, IDENT, seeded(repo, ONE, lr=0.006), "c0de", "da7a", 1234)
    assert other_lr is not None and other_lr.startswith("train.lr differs (0.003 -> 0.006)")
    batch = continuation.refusal(old, IDENT, seeded(repo, ONE | {"accum": 1}), "c0de", "da7a", 1234)
    assert batch is not None and "global batch changes" in batch and "grad_accum_steps to 2" in batch
    code = continuation.refusal(old, IDENT, seeded(repo, ONE), "beef", "da7a", 1234)
    assert code is not None and "other code" in code
    data = continuation.refusal(old, IDENT, seeded(repo, ONE), "c0de", "0ther", 1234)
    assert data is not None and "other data" in data
    for reason in (other_lr, batch, code, data):
        assert "\n" not in reason


def _fake_seed_dir(root: Path, resolved: ResolvedExperiment, steps: tuple[int, ...]) -> Path:
    from trainer.checkpoint import format as ckpt

    seed_dir = root / "20260101" / resolved.spec.name / "abc" / "train" / f"seed-{resolved.seeds[0]}"
    seed_dir.mkdir(parents=True)
    resolved.write(seed_dir / "spec.resolved.json")
    (seed_dir / "identity.json").write_text(json.dumps(IDENT | {"experiment": resolved.spec.name}))
    for step in steps:
        d = seed_dir / "checkpoints" / ckpt.checkpoint_name(step)
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"w" * step)
        (d / ckpt.TRAIN_STATE).write_text(json.dumps({"step": step}))
        ckpt.write_manifest(d, step)
    (seed_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "key": "train/loss", "value": 5.0}) + "\n" for s in range(1, max(steps) + 3)))
    return seed_dir


def test_a_run_at_step_0_is_told_how_to_continue_the_other_layout(tmp_path: Path) -> None:
    repo = scratch_repo(tmp_path / "repo")
    runs = tmp_path / "runs"
    old = _fake_seed_dir(runs, seeded(repo, FSDP2), (4, 8))
    new = seeded(repo, ONE)
    here = runs / "20260102" / "cont" / "def" / "train" / "seed-1234"
    hint = continuation.other_layout_hint(runs, new, seed=1234, code_version="c0de", data_version="da7a",
                                          spec_file="experiments/cont.yaml", exclude=here)
    assert hint == (f"{old} has a checkpoint at step 8 under another layout (2 processes (dp 2, fsdp)); this run "
                    f"starts at step 0. To continue that run instead: pipeline train experiments/cont.yaml "
                    f"--continue-from {old}")
    # Not for other work: another learning rate, other code, or a run that finished.
    assert continuation.other_layout_hint(runs, seeded(repo, ONE, lr=0.006), seed=1234, code_version="c0de",
                                          data_version="da7a", spec_file=None, exclude=here) is None
    assert continuation.other_layout_hint(runs, new, seed=1234, code_version="beef", data_version="da7a",
                                          spec_file=None, exclude=here) is None
    (old / "result.json").write_text(json.dumps({"status": "finished", "steps": 12}))
    assert continuation.other_layout_hint(runs, new, seed=1234, code_version="c0de", data_version="da7a",
                                          spec_file=None, exclude=here) is None


def test_continuing_seeds_the_new_run_with_the_checkpoint_and_the_history(tmp_path: Path) -> None:
    from basics.errors import UsageError
    from trainer.checkpoint import format as ckpt

    repo = scratch_repo(tmp_path / "repo")
    old = _fake_seed_dir(tmp_path / "runs", seeded(repo, FSDP2), (4, 8))
    (old / "mlflow_run.json").write_text(json.dumps({"run_id": "r1", "tracking_uri": "sqlite:///x.db"}))
    new = seeded(repo, ONE)
    with pytest.raises(UsageError, match="its MLflow run is in sqlite:///x.db; pass --tracking-uri"):
        continuation.plan(old, new, code_version="c0de", data_version="da7a", seed=1234, tracking_uri="sqlite:///y.db")
    with pytest.raises(UsageError, match=r"^cannot continue .*: train.lr differs"):
        continuation.plan(old, seeded(repo, ONE, lr=0.006), code_version="c0de", data_version="da7a", seed=1234,
                          tracking_uri="sqlite:///x.db")
    cont = continuation.plan(old, new, code_version="c0de", data_version="da7a", seed=1234, tracking_uri="sqlite:///x.db")
    assert cont.step == 8 and cont.before["processes"] == 2 and cont.after["processes"] == 1
    assert cont.record()["layouts"] == [{"processes": 2, "dp": 2, "tp": 1, "fsdp": True},
                                        {"processes": 1, "dp": 1, "tp": 1, "fsdp": False}]
    target = tmp_path / "new" / "seed-1234"
    target.mkdir(parents=True)
    assert continuation.seed_run(cont, target)
    assert [s for s, _ in ckpt.list_checkpoints(target / "checkpoints")] == [8]
    assert ckpt.verify_checkpoint(target / "checkpoints" / "step_000008") is None
    assert (target / "metrics.jsonl").read_text() == (old / "metrics.jsonl").read_text()
    assert json.loads((target / "mlflow_run.json").read_text())["run_id"] == "r1"
    assert not continuation.seed_run(cont, target)  # a second time: the continued run's own checkpoints stand


def test_checkpoint_corrupt_alert_carries_the_step_of_the_checkpoint(tmp_path: Path) -> None:
    from trainer.checkpoint import format as ckpt
    from trainer.monitor import Alert

    for step in (4, 8):
        d = tmp_path / ckpt.checkpoint_name(step)
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"w")
        (d / ckpt.TRAIN_STATE).write_text("{}")
        ckpt.write_manifest(d, step)
    (tmp_path / "step_000008" / "model.safetensors").write_bytes(b"x")  # corrupt the newest
    alerts: list[Alert] = []

    def on_event(level: str, kind: str, message: str, step: int | None = None) -> None:  # Trainer._on_event's shape
        alerts.append(Alert(level, kind, message, 0 if step is None else step))  # a fresh process is at step 0

    assert ckpt.find_resume_checkpoint(tmp_path, on_event) == tmp_path / "step_000004"
    assert [(a.kind, a.step) for a in alerts] == [("checkpoint_corrupt", 8)]


def test_an_interrupted_stage_prints_no_failed_line(tmp_path: Path) -> None:
    from basics.files import read_json
    from pipelines.stages import StageRunner

    events: list[tuple[str, str]] = []
    runner = StageRunner(tmp_path, "id", on_event=lambda stage, event, result: events.append((stage, event)))

    def sigterm() -> Any:
        raise KeyboardInterrupt("signal 15")  # what `pipeline run|train` turns SIGTERM into

    with pytest.raises(KeyboardInterrupt):
        runner.run("train", sigterm)
    assert events == [("train", "started")]  # no "train failed signal 15" before "interrupted ... resumes"
    assert (read_json(tmp_path / "stages" / "train.json") or {})["status"] == "interrupted"
    assert runner.done("train") is None


def test_artifact_location_follows_the_store_kind(tmp_path: Path) -> None:
    from trainer.mlflow_endpoint import artifact_location

    assert artifact_location(f"sqlite:///{tmp_path}/a/m.db") == (tmp_path / "a" / "mlruns").as_uri()
    assert artifact_location("http://127.0.0.1:5000") is None  # the server's --default-artifact-root
    assert artifact_location("sqlite:///:memory:") is None


def test_layout_words_say_fsdp_only_where_parameters_are_sharded() -> None:
    from trainer.checkpoint.format import describe_layout, layout_record, reshard_message

    tp_only = layout_record(world=2, dp=1, tp=2, shard=1)  # ParallelDims.from_layout: fsdp=True, shard 1
    assert describe_layout(tp_only) == "dp 1 x tp 2"
    fsdp = layout_record(world=2, dp=2, tp=1, shard=2)
    assert describe_layout(fsdp) == "dp 2, fsdp"
    one = layout_record(world=1, dp=1, tp=1, shard=1)
    assert reshard_message(8, fsdp, one) == "resharded at step 8: 2 -> 1 processes (dp 2, fsdp -> dp 1)"
    assert reshard_message(8, one, dict(one)) is None
    # Pipeline stages are part of the layout: one process -> pp 2 is a reshard; a checkpoint
    # written before `pp` was recorded reads as pp 1.
    staged = layout_record(world=2, dp=1, tp=1, shard=1, pp=2)
    assert reshard_message(3, one, staged) == "resharded at step 3: 1 -> 2 processes (dp 1 -> dp 1 x pp 2)"
    assert reshard_message(3, {k: v for k, v in one.items() if k != "pp"}, one) is None


def test_the_cli_refuses_a_missing_run_directory_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pipelines.cli import app

    spec = write_spec(scratch_repo(tmp_path), ONE)
    for command in ("train", "run"):
        out = CliRunner().invoke(app, [command, str(spec), "--continue-from", str(tmp_path / "nope")])
        assert out.exit_code != 0
        lines = [line for line in out.output.splitlines() if line.strip()]
        assert lines == [f"error: --continue-from {tmp_path / 'nope'}: no such run directory"], out.output
