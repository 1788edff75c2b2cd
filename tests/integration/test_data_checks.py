"""Distribution checks (great-expectations): the demo passes against itself, a drifted
dataset fails with messages a person understands, and the CLI exits non-zero."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.dataprep.prepare import prepare_data
from tests.infra.data_helpers import build_small_demo, demo_sources, make_spec
from validation.data.checks import run_data_checks

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    build_small_demo(repo)
    drift = repo / "data" / "drift"
    drift.mkdir()
    # The drifted dataset: same source names, but "docs" now holds Python code.
    shutil.copy(repo / "data/demo/code.jsonl", drift / "code.jsonl")
    shutil.copy(repo / "data/demo/code.jsonl", drift / "docs.jsonl")
    shutil.copy(repo / "data/demo/reference.jsonl", drift / "reference.jsonl")
    return repo


def test_demo_passes_against_itself_and_drifted_data_fails(demo_repo: Path, tmp_path: Path) -> None:
    spec = make_spec(demo_sources())
    base = prepare_data(spec.data, demo_repo, progress=False)
    ok = run_data_checks(spec, base, baseline=base, out_dir=tmp_path / "ok", baseline_name="base")
    assert ok.success and ok.failed == 0 and ok.total >= 3 * 9
    assert "9/9" not in ok.markdown and f"{ok.total}/{ok.total} expectations met" in ok.markdown

    # The drifted preparation trains its own BPE (on other text): the check re-tokenizes the
    # baseline with it, so unchanged sources show no drift at all and only `docs` fails.
    drifted_spec = make_spec(demo_sources(root="data/drift"), name="drifted",
                             checks={"min_documents": 5, "min_tokens": 500, "max_js_divergence": 0.08})
    drifted = prepare_data(drifted_spec.data, demo_repo, progress=False)
    bad = run_data_checks(drifted_spec, drifted, baseline=base, out_dir=tmp_path / "bad", baseline_name="base")
    assert not bad.success
    failing = {(o.source, o.check) for o in bad.outcomes if not o.passed}
    assert failing == {("docs", "length_drift"), ("docs", "token_drift")}
    js = {r["source"]: r["js_divergence"] for r in bad.rows}
    assert js["code"] < 0.01 and js["reference"] < 0.01 and js["docs"] > 0.08
    token = next(o for o in bad.outcomes if (o.source, o.check) == ("docs", "token_drift"))
    assert "docs: token distribution differs from baseline 'base'" in token.message
    assert "docs: median document length moved from" in bad.markdown
    assert "| docs | token_drift |" in bad.markdown and "at most 0.08" in bad.markdown
    assert "re-tokenized" in bad.markdown
    saved = json.loads((tmp_path / "bad/data_check.json").read_text())
    assert saved["success"] is False and saved["failed"] == bad.failed
    assert "FAIL" in (tmp_path / "bad/data_check.html").read_text()
    assert (tmp_path / "bad/data_check.md").read_text() == bad.markdown


def test_absolute_rules_use_spec_thresholds(demo_repo: Path, tmp_path: Path) -> None:
    spec = make_spec(demo_sources(), checks={"min_documents": 10_000, "min_tokens": 10, "max_duplicate_rate": 0.0})
    prepared = prepare_data(spec.data, demo_repo, progress=False)
    result = run_data_checks(spec, prepared)
    failing = {(o.source, o.check) for o in result.outcomes if not o.passed}
    assert {("code", "min_documents"), ("docs", "min_documents"), ("reference", "min_documents")} <= failing
    assert not any(check == "min_tokens" for _, check in failing)
    assert "no baseline data given" in result.markdown
    message = next(o.message for o in result.outcomes if (o.source, o.check) == ("docs", "min_documents"))
    assert message.startswith("docs: documents after cleaning and de-duplication is ") and "at least 10,000" in message


def _write_experiment(repo: Path, name: str, root: str, baseline: str) -> Path:
    import yaml

    spec = make_spec(demo_sources(root=root), name=name).resolved_dict()
    spec["hypothesis"]["baseline"] = baseline
    (repo / "experiments").mkdir(exist_ok=True)
    path = repo / "experiments" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_cli_check_exit_codes(demo_repo: Path, tmp_path: Path) -> None:
    _write_experiment(demo_repo, "base", "data/demo", "champion")
    drifted = _write_experiment(demo_repo, "drifted", "data/drift", "base")
    env = os.environ | {"MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-m", "pipelines", "data", "check", str(drifted), "--out", str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=REPO)
    assert run.returncode == 4, run.stderr
    assert "error: data checks failed for drifted" in run.stderr and "Traceback" not in run.stderr
    assert "docs: median document length moved from" in run.stdout
    assert (tmp_path / "data_check.html").is_file()


def test_a_new_source_is_not_drift_checked(demo_repo: Path) -> None:
    base_spec = make_spec(demo_sources({"code": 0.5, "docs": 0.5}))
    base = prepare_data(base_spec.data, demo_repo, progress=False)
    spec = make_spec(demo_sources())  # adds `reference`
    result = run_data_checks(spec, prepare_data(spec.data, demo_repo, progress=False), baseline=base,
                             baseline_name="base")
    assert result.success, result.markdown
    assert not [o for o in result.outcomes if o.source == "reference" and o.check.endswith("_drift")]
    assert {o.check for o in result.outcomes if o.source == "code"} >= {"token_drift", "length_drift"}
    assert "no baseline profile for reference (new sources)" in result.markdown
