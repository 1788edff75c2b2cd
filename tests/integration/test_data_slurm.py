"""Data preparation as Slurm array jobs on the real two-node test cluster (`tests/infra/slurm.sh`):
the same data version and the same bytes as a local preparation."""

from __future__ import annotations

import json
from pathlib import Path

from pipelines.dataprep.executors import SlurmOptions
from pipelines.dataprep.prepare import prepare_data
from tests.infra.data_helpers import build_small_demo, demo_sources, make_spec


def test_slurm_preparation_is_byte_identical_to_local(tmp_path: Path, slurm_cluster) -> None:
    build_small_demo(tmp_path)
    # Two sources of 58 kB, two tasks each: 4 array tasks per stage, and every source's shards
    # come from more than one task (8 token files, > 6 below). Three sources in 16 kB tasks made
    # 12 array tasks per stage: three times the Slurm tasks for the same claim.
    spec = make_spec(demo_sources({"code": 0.5, "docs": 0.5}), task_bytes=32768)
    local = prepare_data(spec.data, tmp_path, cache_root=tmp_path / "local", progress=False, workers=1)
    on_slurm = prepare_data(spec.data, tmp_path, cache_root=tmp_path / "slurm", progress=False, launcher="slurm",
                            slurm=SlurmOptions(time="0:10:00", mem_per_task="400M", poll_s=0.3))
    assert on_slurm.version == local.version
    ours = json.loads((on_slurm.path / "manifest.json").read_text())["files"]
    assert ours == json.loads((local.path / "manifest.json").read_text())["files"]
    assert len([f for f in ours if f.endswith(".tokens.bin")]) > 6
    timings = json.loads((tmp_path / "slurm/.logs" / local.version / "timings.json").read_text())
    assert timings["launcher"] == "slurm"
