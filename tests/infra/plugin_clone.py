"""A throw-away copy of the repository's code for tests that add plug-in files under models/
(the shared checkout's models/ is never touched), and how to run the CLI inside it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODE = ("basics", "models", "validation", "pipelines", "trainer", "reports", "experiments", "pyproject.toml")


def code_copy(dst: Path) -> Path:
    """The tracked and new (not ignored) files of CODE under `dst`; returns `dst`."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *CODE],
                            cwd=REPO, check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    return dst


def pipeline(repo: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m pipelines ARGS` with the copy's own packages first on the path."""
    env = dict(os.environ, PYTHONPATH=str(repo), MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "pipelines", *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=timeout)
