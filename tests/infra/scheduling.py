"""How `make test` spreads the suite over its xdist workers: whole modules, heaviest first.

A module's tests run on one worker, in order, so its module fixtures (trainings, servers) are
built once; every module that uses the one Slurm cluster runs on the same worker (the cluster
has two nodes, and the session that started it stops it). xdist's `--dist loadgroup` was meant
to do this through `xdist_group` markers, but with pytest 9.2 and xdist 3.8 the group never
reaches the scheduler (xdist suffixes `item._nodeid`; pytest 9 reports `item._id`): every test
was scheduled alone, and a module fixture was built on each worker that got one of its tests
(the sharded model trainings of test_models_training twice each, measured in the ledger).

`ModuleScheduling` is xdist's own `LoadScopeScheduling` with our scope: the module, or "slurm".
Scopes go out in collection order; `order_items` sorts the collection by each scope's seconds in
tests/durations.json, heaviest first (longest-processing-time first: the last scope to start is
a short one, so both workers finish close together), instead of xdist's order by test count.
"""

from __future__ import annotations

import json
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
LEDGER = ROOT / "tests" / "durations.json"
UNKNOWN_TEST_SECONDS = 1.0
"""A test not in the ledger yet weighs this much."""


def module_of(nodeid: str) -> str:
    """`tests/unit/test_x.py` of `tests/unit/test_x.py::test_y[p]@group`."""
    return nodeid.split("::", 1)[0].split("@", 1)[0]


@cache
def uses_slurm(module: str) -> bool:
    path = ROOT / module
    return path.is_file() and "slurm_cluster" in path.read_text(encoding="utf-8", errors="replace")


def scope_of(nodeid: str) -> str:
    module = module_of(nodeid)
    return "slurm" if uses_slurm(module) else module


@lru_cache(maxsize=1)
def _ledger() -> dict[str, float]:
    try:
        return {k: float(v) for k, v in json.loads(LEDGER.read_text())["tests"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def ledger_key(nodeid: str) -> str:
    """The ledger's key of a node id (`tests.unit.test_x::test_y[p]`, as the JUnit report names it)."""
    module, _, name = nodeid.partition("::")
    return f"{module.removesuffix('.py').replace('/', '.')}::{name.split('@', 1)[0]}"


def order_items(items: list[pytest.Item]) -> None:
    """Heaviest scope first; a module's tests keep their order (the sort is stable)."""
    ledger = _ledger()
    weight: dict[str, float] = {}
    for item in items:
        scope = scope_of(item.nodeid)
        weight[scope] = weight.get(scope, 0.0) + ledger.get(ledger_key(item.nodeid), UNKNOWN_TEST_SECONDS)
    first_seen = {scope: i for i, scope in reversed(list(enumerate(scope_of(item.nodeid) for item in items)))}
    items.sort(key=lambda item: (-weight[scope_of(item.nodeid)], first_seen[scope_of(item.nodeid)]))


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        """LoadScopeScheduling whose scope is `scope_of` (the module, or "slurm")."""

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    config.option.loadscopereorder = False  # keep `order_items`' order (xdist sorts by test count)
    return ModuleScheduling(config, log)
