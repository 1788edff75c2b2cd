"""Shared pieces of the planner: units, the spec locator, layout names, number formats."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from basics.errors import Issue, SpecError
from validation.spec import ResourceSpec

GIB = 2**30
MIB = 2**20

Locator = Callable[[str], tuple[str, int, int]]
"""Maps a dotted spec field (e.g. `resource.gpu_memory_gb`) to (file, line, col) of its YAML node."""


def no_location(field_path: str) -> tuple[str, int, int]:
    """Default locator for specs built in code: no file to point at."""
    return ("<spec>", 1, 1)


def _raise(locate: Locator, field_path: str, message: str) -> NoReturn:
    file, line, col = locate(field_path)
    raise SpecError([Issue(file=file, line=line, col=col, field=field_path, message=message)])


def _devices_per_node(resource: ResourceSpec) -> int:
    return resource.gpus_per_node if resource.gpus_per_node else resource.cpu_processes


def _describe_layout(dp: int, tp: int, pp: int, fsdp: bool) -> str:
    return f"dp={dp} tp={tp} pp={pp}" + (" fsdp" if fsdp else "")


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_count(n: float) -> str:
    """6.74 B, 123.2 K: counts of parameters and tokens."""
    for threshold, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= threshold:
            return f"{n / threshold:.2f} {suffix}"
    return f"{n:.0f}"


def format_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _fmt_gb(gb: float) -> str:
    return f"{gb:g} GiB"
