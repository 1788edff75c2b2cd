"""Per-block `torch.compile` under FSDP2 and TP on 2 gloo processes (tests/infra/compiled_layouts.py):
blocks compiled in place before `fully_shard`, one graph without breaks, the eager losses.

The backend is `aot_eager` (dynamo + AOTAutograd, the graphs inductor would receive, run by
eager kernels): it checks the wrapping order, graph breaks and numerics in ~30 s, where inductor
compiles for about a minute per layout on this 2-core machine (cold cache). Inductor itself under
FSDP is measured, losses included, by bench/bench_compile.py (bench/RESULTS.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.infra.compiled_layouts import run_layouts


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pairs = [(layout, backend) for layout in ("fsdp", "tp") for backend in (None, "aot_eager")]
    return run_layouts(Path(tmp_path_factory.mktemp("compile")), pairs)


@pytest.mark.parametrize("layout", ["fsdp", "tp"])
def test_compiled_blocks_under_sharding_train_as_eager(runs: dict[str, Any], layout: str) -> None:
    eager, compiled = runs[f"{layout}/eager"], runs[f"{layout}/aot_eager"]
    assert compiled["blocks_compiled"] == [True, True] and eager["blocks_compiled"] == [False, False]
    assert compiled["blocks_fsdp"] == [True, True]  # fully_shard applied after compile, on the same modules
    assert compiled["state_dict"] == eager["state_dict"]  # no `_orig_mod.`: checkpoints unchanged
    assert (compiled["graphs"], compiled["graph_breaks"]) == (1, 0)  # both blocks share one graph
    assert eager["graphs"] == 0
    assert compiled["losses"] == pytest.approx(eager["losses"], rel=1e-5)
    assert compiled["losses"][-1] < compiled["losses"][0]
