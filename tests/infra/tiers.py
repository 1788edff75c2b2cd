"""Test tiers by directory, and the guard that keeps `tests/unit` free of processes and servers.

A unit test that starts a process (subprocess, `os.fork`/`exec*`/`posix_spawn`/`system`,
multiprocessing) or listens on a socket fails with the call it made and where, even when the
code under test catches the error: the attempt is recorded and the test's report is turned into
a failure. Such a test belongs in `tests/integration/` (or the code should take a fake).
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import platform
import socket
import subprocess
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The standard library caches what it learns by running a command once: `platform.uname()`'s
# processor runs `uname -p`, which mlflow's import asks for. Asked here, at collection, it is
# cached before any unit test, whose import of such a library then starts nothing.
_ = platform.uname().processor

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "integration", "e2e", "gpu")
"""Directories under tests/, each a marker of the same name."""

_ESCAPES = pytest.StashKey[list[str]]()

# (owner, attribute): every way Python code here starts a process or serves a socket.
_GUARDED: tuple[tuple[Any, str], ...] = (
    (subprocess.Popen, "_execute_child"),  # run, check_output, Popen, os.popen, asyncio
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
    (os, "execv"),
    (os, "execve"),
    (os, "execvp"),
    (os, "execvpe"),
    (os, "spawnv"),
    (os, "spawnve"),
    (multiprocessing.process.BaseProcess, "start"),
    (socket.socket, "listen"),
)


def tier_of(path: Path) -> str | None:
    """The tier a test file lives in: the directory right below the nearest `tests/` (None outside
    the tiers)."""
    parts = Path(path).resolve().parts
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == TESTS.name:
            return parts[i + 1] if parts[i + 1] in TIERS else None
    return None


def mark_by_directory(items: list[pytest.Item]) -> None:
    """Give every test its tier's marker; a tier marker that contradicts the directory is an error."""
    for item in items:
        tier = tier_of(item.path)
        if tier is None:
            continue
        wrong = [m.name for m in item.iter_markers() if m.name in TIERS and m.name not in (tier, "gpu")]
        if wrong:
            raise pytest.UsageError(f"{item.nodeid}: marked {wrong[0]!r} but lives in tests/{tier}/; move the file")
        item.add_marker(tier)


def _refuser(item: pytest.Item, name: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        where = "".join(traceback.format_stack(limit=6)[:-1])
        message = (f"unit tests start no process and no server: {name} was called "
                   f"(move the test to tests/integration/ or give the code a fake)\n{where}")
        item.stash.setdefault(_ESCAPES, []).append(message)
        pytest.fail(message, pytrace=False)  # BaseException: `except Exception` cannot swallow it
    return refuse


@contextlib.contextmanager
def guard(item: pytest.Item, phase: str, *, active: bool = True) -> Iterator[None]:
    """While a unit test's `phase` runs (a test in tests/unit, which carries the `unit` marker),
    every process-starting call fails the test."""
    if not active or item.get_closest_marker("unit") is None:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        for owner, attribute in _GUARDED:
            if hasattr(owner, attribute):
                qualified = f"{getattr(owner, '__name__', owner)}.{attribute}"
                patch.setattr(owner, attribute, _refuser(item, qualified))
        yield


def fail_report_on_escape(item: pytest.Item, report: pytest.TestReport) -> None:
    """A refused call that the code under test caught still fails the test, once."""
    escapes = item.stash.get(_ESCAPES, [])
    if escapes and report.passed:
        report.outcome = "failed"
        report.longrepr = escapes[0]
    if escapes:
        item.stash[_ESCAPES] = []
