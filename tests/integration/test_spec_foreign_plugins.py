"""The trusted re-validation of a pull request (default-branch code, no PR Python) imports no
Python of the PR: the PR's files arrive as data (issue 23, parts 2 and 6)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _pr_experiment(tmp: Path) -> Path:
    (tmp / "experiments").mkdir()
    (tmp / "experiments" / "base.yaml").write_text((REPO / "experiments" / "base.yaml").read_text())
    (tmp / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    path = tmp / "experiments" / "my-attention.yaml"
    path.write_text(
        "$schema: ./schema.json\nname: my-attention\nowner: octocat\nextends: base.yaml\n"
        "hypothesis:\n  statement: A sliding window of 64 tokens keeps the held-out loss within one percent.\n"
        "  metric: eval/loss\n  direction: decrease\n  min_effect: 0.01\n  baseline: base\n"
        "model:\n  model_type: my_attention\n  window: 64\n"
        "train:\n  optimizer:\n    name: my_optimizer\n    rho: 0.5\n")
    return path


def test_revalidation_imports_no_python_of_the_pr(tmp_path: Path):
    """The PR's files arrive as data: even a models/ file placed beside its experiment is
    never imported (it would write a marker)."""
    path = _pr_experiment(tmp_path)
    (tmp_path / "models").mkdir()
    marker = tmp_path / "imported.marker"
    (tmp_path / "models" / "my_attention.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    code = ("from validation.loader import check_spec; from validation.spec import foreign_plugins_allowed\n"
            f"with foreign_plugins_allowed():\n    s, i = check_spec({str(path)!r}, repo_root={str(tmp_path)!r})\n"
            "assert not i, i\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-800:]
    assert not marker.exists()
