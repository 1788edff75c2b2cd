"""One runtime seam (issue 39): `trainer.parallel.ParallelDims` builds the one device mesh and every
process group, for every layout, on a fake process group of the layout's world size; no other
trainer module makes a mesh or a group, and the loop does not branch on the layout."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _dims(layout: dict[str, Any], world: int, rank: int, nodes: int = 1) -> Any:
    from trainer.parallel import ParallelDims
    from validation.spec import ParallelLayout

    return ParallelDims.from_layout(ParallelLayout(**layout), world, rank, nodes)


def _ranks(group: Any) -> list[int]:
    import torch.distributed as dist

    return sorted(dist.get_process_group_ranks(group))


@pytest.mark.parametrize(("layout", "world", "rank", "nodes", "mesh"), [
    ({"dp": 4, "fsdp": True}, 4, 1, 1, {"dp": 4, "tp": 1}),
    ({"dp": 2, "tp": 2}, 4, 3, 1, {"dp": 2, "tp": 2}),
    ({"dp": 4, "fsdp": True}, 4, 2, 2, {"replicate": 2, "shard": 2}),
    ({"dp": 2, "tp": 2, "pp": 2}, 8, 5, 1, {"pp": 2, "dp": 2, "tp": 2}),
    ({"dp": 1, "pp": 4}, 4, 2, 1, {"pp": 4, "dp": 1, "tp": 1}),
], ids=["fsdp", "dp-x-tp", "hsdp", "pp-x-dp-x-tp", "pp4"])
def test_one_object_builds_the_mesh_and_every_group_of_each_layout(
        layout: dict[str, Any], world: int, rank: int, nodes: int, mesh: dict[str, int]) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        dims = _dims(layout, world, rank, nodes).build("cpu")
        assert dict(zip(dims.mesh.mesh_dim_names, dims.mesh.shape, strict=True)) == mesh
        # A CPU run's host values go through the default group; the async checkpointer's gloo
        # group exists only when asked for (a real gloo group: tests/integration/test_trainer_parallel.py).
        assert dims.host_group is None and dims.checkpoint_group is None
        assert dims.build("cpu") is dims and dims.mesh is dims.mesh  # built once
        if dims.pp == 1:
            assert dims.pp_group is None and dims.ends_group is None
            return
        # This rank's pipeline: every stage of its replica and TP rank; its replicas: every dp index.
        assert _ranks(dims.pp_group) == [dims.global_rank(p) for p in range(dims.pp)]
        assert _ranks(dims.dp_group) == sorted(dims.global_rank(dims.pp_rank, d) for d in range(dims.dp))
        assert _ranks(dims.ends_group) == [dims.global_rank(0), dims.global_rank(dims.pp - 1)]
    finally:
        dist.destroy_process_group()


def test_only_parallel_dims_makes_a_mesh_or_a_process_group() -> None:
    makers = re.compile(r"\b(new_group|init_device_mesh|new_subgroups\w*)\(")
    offenders = [f"{path.relative_to(REPO)}:{n}" for path in sorted((REPO / "trainer").rglob("*.py"))
                 if path != REPO / "trainer" / "parallel.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1) if makers.search(line)]
    assert offenders == []


def test_the_loop_does_not_branch_on_the_layout() -> None:
    """`grep -n pipeline trainer/loop.py` finds MLflow tag names and docs, no branch on stages."""
    text = (REPO / "trainer" / "loop.py").read_text()
    branch = r"\.pp\s*[<>=!]|\.pp\)|pipeline_parallel|PipelineEngine|self\.pipeline\b|type: ignore\[assignment"
    assert not re.search(branch, text)
