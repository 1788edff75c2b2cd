"""Distribution checks, what they measure: the Jensen-Shannon divergence and the per-source
rows (mixture, drift) computed on the demo and on a drifted dataset."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from pipelines.dataprep.prepare import prepare_data
from tests.infra.data_helpers import build_small_demo, demo_sources, make_spec
from validation.data.checks import source_rows
from validation.data.profile import js_divergence


@pytest.fixture(scope="module")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    build_small_demo(repo)
    drift = repo / "data" / "drift"
    drift.mkdir()
    # The drifted dataset: same source names, but "docs" now holds Python code.
    shutil.copy(repo / "data/demo/code.jsonl", drift / "code.jsonl")
    shutil.copy(repo / "data/demo/code.jsonl", drift / "docs.jsonl")
    shutil.copy(repo / "data/demo/reference.jsonl", drift / "reference.jsonl")
    return repo


def test_js_divergence_properties() -> None:
    assert js_divergence({"a": 0.5, "b": 0.5}, {"b": 0.5, "a": 0.5}) == 0.0
    assert js_divergence({"a": 1.0}, {"b": 1.0}) == pytest.approx(1.0)
    mid = js_divergence({"a": 0.9, "b": 0.1}, {"a": 0.5, "b": 0.5})
    assert 0 < mid < 1 and mid == pytest.approx(js_divergence({"a": 0.5, "b": 0.5}, {"a": 0.9, "b": 0.1}))


def test_source_rows_measure_mixture_and_drift(demo_repo: Path) -> None:
    spec = make_spec(demo_sources())
    base = prepare_data(spec.data, demo_repo, progress=False)
    rows = {r["source"]: r for r in source_rows(spec, base, base)}
    assert rows["code"]["requested_weight"] == 0.5
    assert all(r["mixture_error"] < 0.02 and r["js_divergence"] == 0.0 and r["length_shift"] == 0.0
               for r in rows.values())
    assert math.isnan(source_rows(spec, base)[0]["js_divergence"])
