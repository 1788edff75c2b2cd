"""`.ci/test_budget.py`: new tests are held to their tier's budget; the ledger grandfathers the rest."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "test_budget.py"


def _budget():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("test_budget", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _junit(path: Path, cases: dict[str, float], skipped: tuple[str, ...] = ()) -> Path:
    rows = []
    for key, seconds in cases.items():
        classname, name = key.split("::")
        inner = "<skipped/>" if key in skipped else ""
        rows.append(f'<testcase classname="{classname}" name="{name}" time="{seconds}">{inner}</testcase>')
    path.write_text(f'<testsuites><testsuite name="pytest">{"".join(rows)}</testsuite></testsuites>')
    return path


def test_a_new_test_over_its_tier_budget_fails_and_a_ledgered_one_does_not(tmp_path: Path) -> None:
    budget = _budget()
    measured = budget.read_junit(_junit(tmp_path / "j.xml", {
        "tests.unit.test_a::test_fast": 0.1,
        "tests.unit.test_a::test_slow_new": 3.0,
        "tests.e2e.test_flow::test_old_slow": 200.0,
        "tests.integration.test_b::test_new[x]": 40.0,
        "tests.integration.test_b::test_skipped": 99.0,
    }, skipped=("tests.integration.test_b::test_skipped",)))
    assert "tests.integration.test_b::test_skipped" not in measured
    lines, failures, warnings = budget.check(measured, {"tests.unit.test_a::test_fast": 0.1,
                                                       "tests.e2e.test_flow::test_old_slow": 190.0})
    assert failures == ["new test tests.unit.test_a::test_slow_new took 3.0 s, over the unit budget of 1 s"]
    assert any("integration" in line and "1 tests" in line for line in lines)
    assert warnings == []


def test_new_tests_together_over_budget_fail_and_a_slowed_known_test_warns(tmp_path: Path) -> None:
    budget = _budget()
    measured = {f"tests.integration.test_c::test_{i}": 40.0 for i in range(4)} | {"tests.unit.test_a::test_x": 5.0}
    _, failures, warnings = budget.check(measured, {"tests.unit.test_a::test_x": 0.5})
    assert failures == ["new tests add 160 s together, over the budget of 120 s"]
    assert warnings == []  # 5.0 s is under 2 x 0.5 + 15
    _, _, warnings = budget.check({"tests.unit.test_a::test_x": 20.0}, {"tests.unit.test_a::test_x": 0.5})
    assert warnings == ["tests.unit.test_a::test_x took 20.0 s, 0.5 s in the ledger"]


def test_update_writes_the_ledger_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    budget = _budget()
    monkeypatch.setattr(budget, "LEDGER", tmp_path / "tests" / "durations.json")
    (tmp_path / "tests").mkdir()
    junit = _junit(tmp_path / "j.xml", {"tests.unit.test_a::test_x": 0.25})
    assert budget.main([str(junit), "--update"]) == 0
    ledger = json.loads((tmp_path / "tests" / "durations.json").read_text())
    assert ledger["tests"] == {"tests.unit.test_a::test_x": 0.25} and "CPUs" in ledger["machine"]
    assert budget.main([str(junit)]) == 0
    assert budget.main([str(tmp_path / "missing.xml")]) == 2
    (tmp_path / "cut.xml").write_text("<testsuites><testsuite")  # a run killed while writing it
    assert budget.main([str(tmp_path / "cut.xml")]) == 2
