"""The sbatch script as bash reads it: valid syntax, and the node rank expanded per task."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pipelines.launchers import LaunchJob
from pipelines.launchers.slurm import render_sbatch


def _job(tmp_path: Path, **kw: object) -> LaunchJob:
    base = dict(spec_path=tmp_path / "run/spec.resolved.json", run_dir=tmp_path / "run", data_dir=tmp_path / "cache")
    return LaunchJob(**(base | kw))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- Slurm


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
def test_sbatch_script_is_valid_bash_and_expands_rank_per_task(tmp_path):
    job = _job(tmp_path, nodes=2, procs_per_node=1)
    script = render_sbatch(job, python="/usr/bin/python3")
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    # Evaluate the quoted node word the way the batch shell would, then as a task would.
    node_word = script.splitlines()[-1].split("bash -c ", 1)[1]
    seen = subprocess.run(["bash", "-c", f"printf %s {node_word}"], capture_output=True, text=True,
                          env={"SLURM_NODEID": "WRONG"}).stdout
    assert '"$SLURM_NODEID"' in seen  # the batch shell left it alone
