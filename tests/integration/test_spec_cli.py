"""`pipeline validate` in a real `python -m pipelines` process: a few hostile files of
`tests/bad_specs/` (exit 2, one line each, no traceback, the directory untouched), the 10 MB
file, and the import-weight check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BAD = REPO / "tests" / "bad_specs"
CASES: dict[str, dict] = yaml.safe_load((BAD / "cases.yaml").read_text(encoding="utf-8"))
EXAMPLES = sorted((REPO / "experiments").glob("*.yaml"))
HEAVY = ("torch", "transformers", "accelerate", "mlflow", "great_expectations", "pandas", "matplotlib")


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
    }


def _subprocess(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "HF_HUB_OFFLINE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "pipelines", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# --------------------------------------------------------------------------- real processes


def test_real_process_rejects_hostile_files_without_traceback():
    hostile = [
        "anchor-bomb",
        "tag-python-object",
        "binary-nul",
        "latin1",
        "path-traversal",
        "extends-cycle-a",
    ]
    before = _tree(BAD)
    proc = _subprocess("validate", *[f"tests/bad_specs/{name}.yaml" for name in hostile])
    assert _tree(BAD) == before
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert len(proc.stdout.splitlines()) == len(hostile)
    for name in hostile:
        expected = CASES[f"{name}.yaml"]
        assert f"tests/bad_specs/{name}.yaml:{expected['line']}:" in proc.stdout


def test_ten_megabyte_file_is_refused_before_parsing(tmp_path: Path):
    (tmp_path / "experiments").mkdir()
    big = tmp_path / "experiments" / "huge-file.yaml"
    line = b"description: " + b"x" * 1000 + b"\n"
    big.write_bytes(line * (10 * 1024 * 1024 // len(line) + 1))
    proc = _subprocess("validate", str(big), cwd=tmp_path)
    assert proc.returncode == 2
    assert (
        proc.stdout.strip()
        == "experiments/huge-file.yaml:1:1: <file>: file is 10240 KiB; the limit is 256 KiB"
    )
    assert "Traceback" not in proc.stderr


def test_validate_imports_no_heavy_library():
    code = (
        "import sys, json\n"
        "sys.argv = ['pipeline', 'validate', *sys.argv[1:]]\n"
        "from pipelines.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps({'code': code, 'heavy': heavy}))\n"
    )
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code, *[str(p) for p in EXAMPLES]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result == {"code": 0, "heavy": []}, proc.stdout + proc.stderr
