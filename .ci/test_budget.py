#!/usr/bin/env python3
"""Hold the test suite to its time budget, from the JUnit XML of a run (`make test` writes it).

    python .ci/test_budget.py JUNIT.xml             check; print tiers and the slowest tests
    python .ci/test_budget.py JUNIT.xml --update    record this run as the ledger
    python .ci/test_budget.py JUNIT.xml --merge     add or refresh this run's tests in the ledger

The ledger, `tests/durations.json`, holds every test's measured duration (setup + call +
teardown) and the machine it was measured on. A test that is not in it is *new*: each new test
must fit its tier's budget alone, and all new tests together must fit `NEW_TOTAL_S` (as
torchtitan's `scripts/ci/check_new_test_time_budget.py` holds new tests to a P90 threshold,
here per tier, and without needing the base commit: a fresh clone of main has none). A new
test over budget fails the run; adding it to the ledger (`--update`) is a reviewed change of
`tests/durations.json`. A known test that became much slower than its ledger entry, and a
tier over its total goal, are reported as warnings (a loaded machine makes them noisy).
Only the standard library: it runs before and without the project's environment.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from datetime import date
from pathlib import Path

LEDGER = Path(__file__).resolve().parents[1] / "tests" / "durations.json"
TIERS = ("unit", "integration", "e2e", "gpu")
NEW_TEST_S = {"unit": 1.0, "integration": 45.0, "e2e": 90.0, "gpu": 60.0}
"""The most one new test may take, by tier (seconds, on the 2-core CI machine)."""
NEW_TOTAL_S = 120.0
"""The most all new tests together may add."""
TIER_GOAL_S = {"unit": 180.0}
SUITE_GOAL_S = 25 * 60.0
SLOWER_FACTOR, SLOWER_MARGIN_S = 2.0, 15.0
"""A known test is reported as slower when it takes more than factor x its ledger entry + margin."""


def wall_seconds(path: Path) -> float:
    """The session's wall-clock time (pytest writes it on the test suite element)."""
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return float(suite.attrib.get("time", "0") or 0) if suite is not None else 0.0


def read_junit(path: Path) -> dict[str, float]:
    """`classname::name` -> seconds, for every test that ran (skipped ones are left out)."""
    out: dict[str, float] = {}
    for case in ET.parse(path).iterfind(".//testcase"):
        if case.find("skipped") is not None:
            continue
        key = f"{case.attrib.get('classname', '')}::{case.attrib.get('name', '')}"
        out[key] = out.get(key, 0.0) + float(case.attrib.get("time", "0") or 0)
    return out


def tier(key: str) -> str:
    parts = key.split("::", 1)[0].split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "tests" and parts[1] in TIERS else "other"


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def check(measured: dict[str, float], ledger: dict[str, float]) -> tuple[list[str], list[str], list[str]]:
    """(report lines, failures, warnings)."""
    lines: list[str] = []
    failures: list[str] = []
    warnings: list[str] = []
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for key, seconds in measured.items():
        totals[tier(key)] += seconds
        counts[tier(key)] += 1
    lines.append("tier totals (setup + call + teardown):")
    for name in (*TIERS, "other"):
        if counts[name]:
            goal = TIER_GOAL_S.get(name)
            note = f" (goal <= {goal:.0f} s)" if goal else ""
            lines.append(f"  {name:<12} {counts[name]:>5} tests  {totals[name]:8.1f} s{note}")
            if goal and totals[name] > goal:
                warnings.append(f"tier {name} took {totals[name]:.0f} s, over its goal of {goal:.0f} s")
    lines.append(f"  {'all':<12} {sum(counts.values()):>5} tests  {sum(totals.values()):8.1f} s")

    new = sorted(((s, k) for k, s in measured.items() if k not in ledger), reverse=True)
    lines.append(f"new tests (not in {LEDGER.relative_to(LEDGER.parents[1])}): {len(new)}, "
                 f"{sum(s for s, _ in new):.1f} s together (budget {NEW_TOTAL_S:.0f} s)")
    for seconds, key in new[:25]:
        budget = NEW_TEST_S.get(tier(key), NEW_TEST_S["integration"])
        mark = "  OVER" if seconds > budget else ""
        lines.append(f"  {seconds:7.2f} s  {key}  (budget {budget:.0f} s){mark}")
        if seconds > budget:
            failures.append(f"new test {key} took {seconds:.1f} s, over the {tier(key)} budget of {budget:.0f} s")
    if sum(s for s, _ in new) > NEW_TOTAL_S:
        failures.append(f"new tests add {sum(s for s, _ in new):.0f} s together, over the budget of {NEW_TOTAL_S:.0f} s")

    for key, seconds in measured.items():
        before = ledger.get(key)
        if before is not None and seconds > SLOWER_FACTOR * before + SLOWER_MARGIN_S:
            warnings.append(f"{key} took {seconds:.1f} s, {before:.1f} s in the ledger")
    lines.append("slowest 15:")
    for key, seconds in sorted(measured.items(), key=lambda kv: -kv[1])[:15]:
        lines.append(f"  {seconds:7.2f} s  {key}")
    return lines, failures, warnings


def _test_file_exists(key: str) -> bool:
    """Whether the module a ledger key names (`tests.unit.test_x::name`) is still a file."""
    parts = key.split("::", 1)[0].split(".")
    root = LEDGER.parents[1]
    return any((root / ("/".join(parts[:n]) + ".py")).is_file() for n in range(len(parts), 0, -1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("junit", type=Path, help="JUnit XML written by pytest --junitxml")
    parser.add_argument("--update", action="store_true", help="write this run's durations as the ledger")
    parser.add_argument("--merge", action="store_true",
                        help="like --update, but keep the ledger's other tests (a run of some tests only), "
                             "and drop entries whose test file no longer exists")
    parser.add_argument("--how", default="make test", help="with --update: how the run was made (workers, load)")
    args = parser.parse_args(argv)
    if not args.junit.is_file():
        print(f"test_budget: {args.junit}: no such file (run `make test` first)", file=sys.stderr)
        return 2
    try:
        measured = read_junit(args.junit)
    except ET.ParseError as exc:
        print(f"test_budget: {args.junit}: not a JUnit XML file ({exc})", file=sys.stderr)
        return 2
    if args.update or args.merge:
        tests = {k: round(v, 2) for k, v in measured.items()}
        how = args.how
        if args.merge and LEDGER.is_file():
            old = json.loads(LEDGER.read_text(encoding="utf-8"))
            kept = {k: v for k, v in old["tests"].items() if k not in tests and _test_file_exists(k)}
            tests = {**kept, **tests}
            how = f"{old.get('how', '')}; merged {len(measured)} tests: {args.how}"
        payload = {"machine": machine(), "measured": date.today().isoformat(), "how": how,
                   "tests": dict(sorted(tests.items()))}
        tmp = LEDGER.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
        tmp.replace(LEDGER)
        print(f"test_budget: recorded {len(measured)} tests in {LEDGER} ({len(tests)} in all)")
        return 0
    ledger = json.loads(LEDGER.read_text(encoding="utf-8"))["tests"] if LEDGER.is_file() else {}
    lines, failures, warnings = check(measured, ledger)
    wall = wall_seconds(args.junit)
    lines.insert(0, f"wall clock: {wall:.0f} s (goal <= {SUITE_GOAL_S:.0f} s); the tier sums below add every "
                    "worker's time")
    if wall > SUITE_GOAL_S:
        warnings.append(f"the suite ran {wall:.0f} s, over its goal of {SUITE_GOAL_S:.0f} s")
    print("\n".join(lines))
    for text in warnings:
        print(f"test_budget: warning: {text}")
    for text in failures:
        print(f"test_budget: FAILED: {text}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
