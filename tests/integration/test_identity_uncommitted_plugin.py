"""The same trainer code has the same version, clean or with an uncommitted plug-in (issue 30,
item 5). Reproduced on the old main: a clean tree versioned trainer/ by its git tree hash, a
dirty one by a content hash, so every report of an uncommitted plug-in (the docs' "try it
locally" path) warned "Stale baseline" against its own trainer."""

from __future__ import annotations

import subprocess
from pathlib import Path

from pipelines.identity import code_version


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=a", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_an_uncommitted_plugin_keeps_the_trainer_version_and_trainer_edits_match_their_commit(tmp_path: Path):
    for rel, text in {"trainer/loop.py": "STEP = 1\n", "trainer/sub/x.py": "X = 1\n", "validation/spec.py": "S = 1\n",
                      "models/__init__.py": "", "models/llama.py": "# llama\n", "pyproject.toml": "[project]\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "trainer" / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "trainer" / "run.sh").chmod(0o755)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "main")
    clean = code_version(tmp_path, "llama")
    assert clean.trainer == _git(tmp_path, "rev-parse", "HEAD:trainer")[:16]

    # The docs' path: a new architecture file, not committed yet.
    (tmp_path / "models" / "my_attention.py").write_text("# new\n")
    with_plugin = code_version(tmp_path, "my_attention")
    assert with_plugin.dirty and with_plugin.trainer == clean.trainer

    # An uncommitted trainer edit gets the version its commit will have.
    (tmp_path / "trainer" / "sub" / "x.py").write_text("X = 2\n")
    (tmp_path / "trainer" / "new.py").write_text("N = 1\n")
    edited = code_version(tmp_path, "llama")
    assert edited.dirty and edited.trainer != clean.trainer
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "trainer edit")
    assert code_version(tmp_path, "llama").trainer == edited.trainer
