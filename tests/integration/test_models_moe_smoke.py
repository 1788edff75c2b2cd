"""The shipped mixture of experts (experiments/moe.yaml, models/moe.py) through `pipeline smoke`
(issue 30, parts 2 and 3), in a fresh repository layout with the demo corpus.

Reproduced on the old main: a dropless MoE trained in smoke, then `pipeline smoke` crashed with
an uncaught `DynamicOutputShapeException: aten.nonzero` traceback, exit 1, no smoke.json. Now
the FLOPs are counted on real tiny tensors (smoke.json says so) and equal the file's declared
count of active parameters; the router load reaches the metrics; a plug-in's exception ends the
smoke with one line naming its file and method, exit 5, and smoke.json written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pipelines.dataprep.demo_corpus import build_demo_corpus

    root = tmp_path_factory.mktemp("moe-repo")
    (root / "experiments").mkdir()
    for name in ("base.yaml", "moe.yaml", "schema.json"):
        shutil.copy2(REPO / "experiments" / name, root / "experiments" / name)
    build_demo_corpus(root / "data" / "demo", 120_000)
    return root


def _smoke(repo: Path, run: str) -> tuple[Any, dict[str, Any]]:
    from typer.testing import CliRunner

    from pipelines.cli import app

    out = repo / run / "smoke.json"
    result = CliRunner().invoke(app, ["smoke", str(repo / "experiments" / "moe.yaml"), "--run-dir",
                                      str(repo / run), "--out", str(out)])
    return result, json.loads(out.read_text())


def test_the_shipped_moe_smokes_with_flops_counted_on_real_tensors_and_router_load_logged(repo: Path) -> None:
    result, smoke = _smoke(repo, "run")
    assert result.exit_code == 0, result.output[-3000:]
    assert smoke["status"] == "passed" and all(smoke["checks"].values()), smoke["checks"]
    assert smoke["flops_counted_on"].startswith("real tensors on the CPU (DynamicOutputShapeException: aten.")
    assert smoke["flops_counted"] == smoke["flops_declared"]
    points = [json.loads(line) for line in (repo / "run" / "train" / "metrics.jsonl").read_text().splitlines()]
    last = {p["key"]: p["value"] for p in points if p["step"] == smoke["steps"]}
    shares = [last[f"moe/load/e{i}"] for i in range(smoke["model"]["num_experts"])]
    assert sum(shares) == pytest.approx(1.0) and last["moe/load_max"] >= 1.0 and last["moe/aux_loss"] > 0


def test_a_plugin_exception_ends_the_smoke_with_one_line_and_its_result(repo: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected: norm kernel missing")

    monkeypatch.setattr(torch.nn.functional, "rms_norm", broken)  # called by models/moe.py's RMSNorm
    result, smoke = _smoke(repo, "broken")
    assert result.exit_code == 5, result.output[-3000:]
    assert "Traceback" not in result.output
    error_lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "models/moe.py:" in error_lines[0], result.output[-2000:]
    assert "in RMSNorm.forward: RuntimeError: injected: norm kernel missing" in error_lines[0]
    assert smoke["status"] == "failed" and smoke["error"].startswith("models/moe.py:")
    assert "Traceback" in Path(smoke["traceback"]).read_text()
