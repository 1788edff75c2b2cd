"""The workflows pass zizmor (default and auditor personas) and the workflow JSON schema.

Runs `.ci/lint-workflows.sh`, the same script CI runs, and proves that it fails on a
workflow with a classic injection and an unpinned action.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / ".ci" / "lint-workflows.sh"

BAD = """
name: bad
on:
  pull_request_target:
permissions: write-all
jobs:
  build:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
        with:
          ref: ${{ github.event.pull_request.head.sha }}
      - run: echo "${{ github.event.pull_request.title }}"
"""


def lint(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *map(str, files)], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_project_workflows_have_no_findings() -> None:
    result = lint()
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("No findings to report") == 2
    assert "ok -- validation done" in result.stdout


def test_a_bad_workflow_fails_the_lint(tmp_path: Path) -> None:
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(BAD, encoding="utf-8")
    result = lint(bad)
    assert result.returncode != 0
    assert "template-injection" in result.stdout
    assert "dangerous-triggers" in result.stdout
