"""`pipeline data demo | prepare | check` as a user runs them (subprocesses, real files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.infra.data_helpers import demo_sources, make_spec

REPO = Path(__file__).resolve().parents[2]
ENV = os.environ | {"MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}


def pipeline(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines", *args], capture_output=True, text=True, env=ENV, cwd=cwd)


def _experiment(repo: Path, name: str, sources: list[dict], baseline: str = "champion") -> Path:
    spec = make_spec(sources, name=name).resolved_dict()
    spec["hypothesis"]["baseline"] = baseline
    (repo / "experiments").mkdir(exist_ok=True)
    path = repo / "experiments" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_demo_prepare_twice_then_check(tmp_path: Path) -> None:
    made = pipeline("data", "demo", "--out", str(tmp_path / "data/demo"), "--max-mb", "0.05", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    # The three sources, and the demo downstream task's examples (pipelines/dataprep/demo_eval_task.py).
    assert {p.name for p in (tmp_path / "data/demo").iterdir()} == {"code.jsonl", "docs.jsonl", "reference.jsonl",
                                                                  "demo_next_line.jsonl"}
    spec = _experiment(tmp_path, "small-demo", demo_sources())

    first = pipeline("data", "prepare", str(spec), "--no-progress", "--json", cwd=REPO)
    assert first.returncode == 0, first.stderr
    second = pipeline("data", "prepare", str(spec), "--no-progress", "--json", cwd=REPO)
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert not a["cache_hit"] and b["cache_hit"] and a["version"] == b["version"]
    assert Path(a["path"]) == tmp_path / "data/cache" / a["version"]
    assert set(a["sources"]) == {"code", "docs", "reference"}
    human = pipeline("data", "prepare", str(spec), cwd=REPO)
    assert f"data version {a['version']} (cache hit" in human.stdout

    checked = pipeline("data", "check", str(spec), "--baseline", str(spec), "--out", str(tmp_path / "check"),
                       cwd=REPO)
    assert checked.returncode == 0, checked.stderr
    assert "expectations met" in checked.stdout and "❌" not in checked.stdout


def test_user_mistakes_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data/bin.jsonl").write_bytes(b"\x00\x01binary")
    missing = _experiment(tmp_path, "missing-data", [{"name": "gone", "path": "data/gone.jsonl", "weight": 1.0}])
    binary = _experiment(tmp_path, "binary-data", [{"name": "bin", "path": "data/bin.jsonl", "weight": 1.0}])
    for path, needle in ((missing, "data source 'gone': no file matches 'data/gone.jsonl'"),
                         (binary, "data source 'bin': ")):
        run = pipeline("data", "prepare", str(path), "--no-progress", cwd=REPO)
        assert run.returncode == 3
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in run.stderr
    assert pipeline("data", "prepare", str(tmp_path / "nope.yaml"), cwd=REPO).returncode == 2
