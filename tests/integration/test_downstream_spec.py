"""`eval.tasks` in the spec: `pipeline validate` of a spec with local and shipped tasks imports
neither lm-eval nor torch (checked in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.infra.eval_task_repo import task_repo, write


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return task_repo(tmp_path, monkeypatch)




def test_validate_with_tasks_imports_neither_lm_eval_nor_torch(repo: Path):
    path = write(repo, """\
        eval:
          tasks:
            - path: data/tasks/tiny_choice.yaml
            - name: hellaswag
        """)
    code = ("import sys; from validation.loader import load_spec; load_spec(sys.argv[1]); "
            "bad = [m for m in ('torch', 'lm_eval', 'transformers', 'datasets') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, cwd=repo)
