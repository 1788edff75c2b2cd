"""The resolve step (`validation.resolved`): one spec file -> one frozen `ResolvedExperiment`,
written as `spec.resolved.json` and read back by orchestration, smoke, sweeps and the trainer.

Regressions guarded here (each failed on the code before the resolve step):
- a baseline file `experiments/<name>.yml` passed `pipeline validate`, then `pipeline run`
  said "not found" (it looked for `.yaml` only, next to the candidate);
- `parallel: {tp: 2}` on GPUs passed validate, plan and smoke, and failed after `/train`
  (the trainer's capability is now declared once and read by every check; the test uses
  `pp: 2` with `tp: 2`, which the trainer does not run yet).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from basics.errors import DataError, SpecError, UsageError
from pipelines.cli import app
from validation.capability import AXES, TRAINER
from validation.resolved import RESOLVED_FILE, ResolvedExperiment, load_resolved, resolve, spec_section
from validation.spec import ExperimentSpec

SPEC = """\
name: {name}
owner: octocat
hypothesis:
  statement: A higher learning rate should lower the held-out loss of the tiny model.
  metric: eval/loss
  direction: decrease
  min_effect: 0.01
  baseline: {baseline}
  seeds: 2
model: {{model_type: llama, hidden_size: 32, num_layers: 2, num_heads: 2, vocab_size: 512}}
data:
  sources: [{{name: code, path: data/missing/code.jsonl, weight: 1.0}}]
  seq_len: 32
  tokenizer: {{vocab_size: 512}}
train: {{max_steps: 40, lr: {lr}}}
{extra}"""


def _repo(tmp_path: Path, **files: str) -> Path:
    (tmp_path / "experiments").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    for name, text in files.items():
        (tmp_path / "experiments" / name).write_text(text)
    return tmp_path


def _spec(name: str, baseline: str = "champion", lr: float = 0.003, extra: str = "") -> str:
    return SPEC.format(name=name, baseline=baseline, lr=lr, extra=extra)


def test_baseline_yml_is_found_by_validate_and_by_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _repo(tmp_path, **{"cand.yaml": _spec("cand", baseline="basey", lr=0.006), "basey.yml": _spec("basey")})
    monkeypatch.chdir(repo)
    runner = CliRunner()
    validated = runner.invoke(app, ["validate", "experiments"])
    assert validated.exit_code == 0, validated.output
    assert "ok experiments/basey.yml" in validated.output  # a directory means *.yaml and *.yml

    resolved = resolve(repo / "experiments" / "cand.yaml")
    assert resolved.baseline.kind == "experiment"
    assert resolved.baseline.file == str((repo / "experiments" / "basey.yml").resolve())

    # `pipeline run` gets past the baseline (the old code stopped here: "experiment 'basey' not
    # found") and stops at the first real problem of this repository: its data does not exist.
    ran = runner.invoke(app, ["run", "experiments/cand.yaml", "--no-smoke"])
    assert "not found" not in ran.output, ran.output
    assert ran.exit_code == DataError.exit_code, ran.output
    assert "data source 'code'" in ran.output


def test_a_missing_baseline_is_one_located_issue(tmp_path: Path) -> None:
    repo = _repo(tmp_path, **{"cand.yaml": _spec("cand", baseline="nobody"), "nobodx.yml": _spec("nobodx")})
    with pytest.raises(SpecError) as info:
        resolve(repo / "experiments" / "cand.yaml")
    (issue,) = info.value.issues
    assert (issue.field, issue.line) == ("hypothesis.baseline", 8)
    assert "no experiment 'nobody'" in issue.message and "did you mean 'nobodx'" in issue.message


def test_a_layout_the_trainer_cannot_run_is_refused_by_validate_plan_and_smoke_before_train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = "parallel: {dp: 1, tp: 2, pp: 2}\nresource: {gpus_per_node: 4, gpu_type: h100, gpu_memory_gb: 80}\n"
    repo = _repo(tmp_path, **{"tp-run.yaml": _spec("tp-run", extra=extra)})
    monkeypatch.chdir(repo)
    runner = CliRunner()
    for command in (["validate"], ["plan"], ["smoke"], ["data", "prepare"]):
        result = runner.invoke(app, [*command, "experiments/tp-run.yaml"])
        assert result.exit_code == SpecError.exit_code, (command, result.output)
        # 1F1B over 2 stages (TP 2 inside each) with one micro-batch per step: the schedule cannot run.
        assert "experiments/tp-run.yaml:15:" in result.output and "train.grad_accum_steps" in result.output, \
            result.output
        assert "pp_schedule 1f1b with pp=2 needs at least 2 micro-batches" in result.output
        assert "Traceback" not in result.output


def test_resolved_experiment_holds_every_derived_fact_and_round_trips(tmp_path: Path) -> None:
    repo = _repo(tmp_path, **{"cand.yaml": _spec("cand", lr=0.006)})
    resolved = resolve(repo / "experiments" / "cand.yaml")
    spec = resolved.spec
    assert resolved.spec_hash == spec.spec_hash() == resolved.identity.spec_hash
    assert resolved.seeds == [1234, 1235] and resolved.identity.seeds == (1234, 1235)
    assert (resolved.layout.dp, resolved.layout.chosen_by) == (1, "auto")
    assert resolved.layout.capability == tuple(a for a in AXES if a in TRAINER.cpu)  # what it was checked against
    # Per-seed specs: built through validation, seed set, layout explicit (the trainer decides nothing).
    for run in resolved.runs:
        assert run.spec.train.seed == run.seed and run.spec.parallel == resolved.layout.parallel()
        assert ExperimentSpec.model_validate(run.spec.model_dump(mode="json", by_alias=True)) == run.spec
    assert resolved.compute.parameters == spec.model.parameter_count()
    assert resolved.compute.tokens == 40 * 8 * 32
    assert resolved.compute.peak.per == "thread" and resolved.compute.peak.source == "cpu:per-thread"
    assert resolved.data.sources == {"code": str(repo.resolve() / "data/missing/code.jsonl")}
    with pytest.raises(ValueError):  # frozen
        resolved.spec_hash = "x"  # type: ignore[misc]

    seed_file = resolved.for_seed(1235).write(tmp_path / "seed" / RESOLVED_FILE)
    back = load_resolved(seed_file)
    assert isinstance(back, ResolvedExperiment)
    assert back.spec == resolved.run_for(1235).spec and back.seeds == [1235]
    assert spec_section(json.loads(seed_file.read_text()))["train"]["seed"] == 1235


def test_load_resolved_accepts_a_bare_spec_and_refuses_garbage(tmp_path: Path) -> None:
    repo = _repo(tmp_path, **{"cand.yaml": _spec("cand")})
    spec = resolve(repo / "experiments" / "cand.yaml").spec
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(spec.resolved_dict()))
    back = load_resolved(bare, repo)
    assert back.spec.parallel == back.layout.parallel() and back.seeds == [spec.train.seed]
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": 1, "spec": {}}')
    with pytest.raises(UsageError, match="not a resolved experiment"):
        load_resolved(bad)


def test_smoke_spec_is_built_through_validation_and_resolved(tmp_path: Path) -> None:
    from trainer.smoke import resolve_smoke

    extra = "resource: {gpus_per_node: 2, gpu_type: h100, peak_tflops: 900}\n"
    repo = _repo(tmp_path, **{"cand.yaml": _spec("cand", extra=extra)})
    small = resolve_smoke(resolve(repo / "experiments" / "cand.yaml"), tokenizer_vocab=300)
    assert (small.spec.model.hidden_size, small.spec.model.vocab_size, small.spec.resource.world_size) == (64, 320, 1)
    assert small.layout.dp == 1 and small.seeds == [small.spec.train.seed]
    # One CPU process: the GPU's peak_tflops does not leak into the smoke run's MFU.
    assert small.spec.resource.peak_tflops is None and small.compute.peak.per == "thread"
    assert ExperimentSpec.model_validate(small.spec.model_dump(mode="json", by_alias=True)) == small.spec


def test_validate_and_run_find_the_same_repository_from_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rule for the repository root (`basics.paths`). The old `pipeline run` asked for
    `pyproject.toml` beside `experiments/` and otherwise took the working directory, so a spec
    repository without one validated from anywhere and then failed `run` on its baseline."""
    repo = _repo(tmp_path / "specs", **{"cand.yaml": _spec("cand", baseline="base", lr=0.006), "base.yaml": _spec("base")})
    (repo / "pyproject.toml").unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    spec = str(repo / "experiments" / "cand.yaml")
    runner = CliRunner()
    validated = runner.invoke(app, ["validate", spec])
    assert validated.exit_code == 0, validated.output
    ran = runner.invoke(app, ["run", spec, "--no-smoke"])
    assert "no experiment 'base'" not in ran.output, ran.output
    assert ran.exit_code == DataError.exit_code, ran.output  # past the baseline: stops at the missing data
    assert "data source 'code'" in ran.output


def test_repo_root_is_found_from_a_file_or_a_directory_with_one_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from basics.paths import find_repo_root, repo_root_from_cwd

    repo = _repo(tmp_path / "repo", **{"base.yaml": _spec("base")})
    (repo / "runs" / "deep").mkdir(parents=True)
    assert find_repo_root(repo / "experiments" / "base.yaml") == repo.resolve()
    assert find_repo_root(repo) == repo.resolve()  # a directory is its own first candidate
    assert find_repo_root(repo / "runs" / "deep") == repo.resolve()
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "x.yaml").write_text("")
    assert find_repo_root(lone / "x.yaml") == lone.resolve()  # outside any repository: beside the file
    assert find_repo_root(lone) == lone.resolve()
    monkeypatch.chdir(repo / "runs" / "deep")
    assert repo_root_from_cwd() == repo.resolve()
    monkeypatch.chdir(lone)
    assert repo_root_from_cwd() == lone.resolve()


def test_run_summary_names_the_verdict_once(tmp_path: Path) -> None:
    from pipelines.orchestrate import ExperimentResult, summary_lines

    repo = _repo(tmp_path, **{"cand.yaml": _spec("cand")})
    candidate = ExperimentResult(resolve(repo / "experiments" / "cand.yaml"), tmp_path / "runs" / "cand", "", [], [],
                                 verdict="inconclusive", verdict_reason="Inconclusive: one seed. `eval/loss` fell 2 %.")
    (line,) = [line for line in summary_lines(candidate, None, "sqlite:///x.db") if line.startswith("verdict")]
    assert line == "verdict      INCONCLUSIVE: one seed. `eval/loss` fell 2 %."
