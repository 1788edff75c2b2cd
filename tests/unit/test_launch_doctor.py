"""The startup checklist (`pipelines.doctor`) and `scoped_environ`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from basics.environment import package_version, scoped_environ
from pipelines.doctor import (
    DEFAULT_CONSTRAINTS,
    DoctorFailed,
    Level,
    check_versions,
    main,
    parse_constraints,
    run_doctor,
)
from pipelines.launchers.local import LocalLauncher
from tests.infra.launch_helpers import make_job, tiny_spec_dict
from validation.spec import ExperimentSpec


def _spec(tmp_path: Path, **kw: object) -> ExperimentSpec:
    (tmp_path / "data").mkdir(exist_ok=True)
    return ExperimentSpec.model_validate(tiny_spec_dict(tmp_path / "data", **kw))


def test_version_mismatch_is_an_error_naming_both_versions():
    installed = package_version("torch")
    checks = check_versions("torch==1.0.0\n", "constraints/constraints.txt")
    torch_check = next(c for c in checks if c.name == "torch")
    assert torch_check.level is Level.ERROR
    assert installed in torch_check.message and "torch==1.0.0" in torch_check.message


def test_python_outside_required_range_is_an_error():
    checks = check_versions("# requires-python: >=3.99\n", "c.txt", python_version="3.11.7")
    assert [c.message for c in checks if c.level is Level.ERROR] == ["Python 3.11.7 installed, c.txt requires >=3.99"]


def test_missing_package_is_an_error():
    checks = check_versions("surely-not-installed-pkg~=1.0\n", "c.txt")
    assert any(c.level is Level.ERROR and "not installed" in c.message for c in checks)


def test_project_constraints_match_this_environment():
    pins, python_spec = parse_constraints(DEFAULT_CONSTRAINTS.read_text())
    assert {"torch", "accelerate", "transformers", "mlflow"} <= set(pins) and python_spec
    errors = [c.message for c in check_versions(DEFAULT_CONSTRAINTS.read_text(), "constraints.txt")
              if c.level is Level.ERROR]
    assert errors == []


def test_ready_machine_passes_every_section(tmp_path):
    spec = _spec(tmp_path, procs=1)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "manifest.json").write_text("{}")
    report = run_doctor(spec, data_dir=cache, expect_world_size=1)
    assert report.ok, report.render_text()
    assert {c.section for c in report.checks} == {"configuration", "environment", "resources", "data", "parallel"}
    assert "ready: 0 error(s)" in report.render_text()


def test_world_size_mismatch_and_missing_data_are_errors(tmp_path):
    spec = _spec(tmp_path, procs=2)
    (tmp_path / "data" / "docs.jsonl").write_text("")
    report = run_doctor(spec, data_dir=tmp_path / "nowhere", expect_world_size=4)
    messages = {(c.section, c.name): c.message for c in report.errors}
    assert messages[("parallel", "world size")] == "the launch starts 4 processes, the spec's resources give 2"
    assert "no manifest.json" in messages[("data", "prepared")]
    assert "all matching files are empty" in messages[("data", "docs")]
    assert not report.ok


def test_more_cpu_processes_than_cores_is_only_a_warning(tmp_path):
    spec = _spec(tmp_path, procs=64)
    report = run_doctor(spec, procs_per_node=64, use_gpu=False)
    cpu = next(c for c in report.checks if c.name == "cpu")
    assert cpu.level is Level.WARNING and "64 process(es)" in cpu.message


def test_module_main_refuses_a_bad_spec_with_exit_11(tmp_path, capsys):
    bad = tmp_path / "spec.resolved.json"
    bad.write_text(json.dumps({"name": "x"}))
    assert main(["--spec", str(bad)]) == DoctorFailed.exit_code == 11
    assert "ERROR" in capsys.readouterr().out


def test_launcher_runs_the_doctor_first_and_launches_nothing_on_error(tmp_path):
    job, _ = make_job(tmp_path, procs=1)
    (job.data_dir / "manifest.json").unlink()
    with pytest.raises(DoctorFailed, match="prepared data missing"):
        LocalLauncher().submit(job)
    assert "NOT ready" in (job.run_dir / "logs" / "doctor.txt").read_text()
    assert not (job.run_dir / "launch.json").exists()


def test_scoped_environ_sets_removes_and_restores_exactly(monkeypatch: pytest.MonkeyPatch):
    import os

    monkeypatch.setenv("SCOPED_A", "before")
    monkeypatch.delenv("SCOPED_B", raising=False)
    monkeypatch.setenv("SCOPED_C", "kept")
    with pytest.raises(RuntimeError), scoped_environ(SCOPED_A="inside", SCOPED_B="new", SCOPED_C=None):
        assert (os.environ["SCOPED_A"], os.environ["SCOPED_B"]) == ("inside", "new")
        assert "SCOPED_C" not in os.environ
        os.environ["SCOPED_A"] = "changed by the block"
        raise RuntimeError("the environment is restored on the way out of an error too")
    assert os.environ["SCOPED_A"] == "before"
    assert "SCOPED_B" not in os.environ
    assert os.environ["SCOPED_C"] == "kept"
