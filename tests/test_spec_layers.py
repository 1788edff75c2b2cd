"""Layers and registries that keep the code base honest.

- `validation/` (configuration and data layer) never imports `trainer` (execution layer);
- the packages have no import cycle (module-level and lazy imports alike; `TYPE_CHECKING`
  blocks excluded, they never run);
- every `PipelineError` subclass is declared in `validation.errors`, and every exit code
  has one meaning there (the launchers' retry rules read the same table).
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipelines", "trainer", "validation", "reports")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Our modules that `path` imports anywhere (functions included), outside TYPE_CHECKING."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(sub) for sub in ast.walk(node))
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in modules else node.module)
    return {name for name in out if name in modules}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_validation_never_imports_the_trainer():
    graph = _graph()
    offending = sorted(
        (name, target) for name, targets in graph.items() if name.split(".")[0] == "validation"
        for target in targets if target.split(".")[0] == "trainer"
    )
    assert offending == [], "validation/ must not import trainer (move the code below both)"


def test_no_import_cycle_in_the_packages():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_pipeline_error_is_declared_in_the_registry_with_a_registered_code():
    from validation import errors

    for package in PACKAGES:  # import everything, so every subclass exists
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)

    def subclasses(cls: type) -> list[type]:
        return [cls, *(s for sub in cls.__subclasses__() for s in subclasses(sub))]

    registered = {e.code for e in errors.EXIT_CODES}
    assert len(registered) == len(errors.EXIT_CODES), "an exit code has two meanings"
    for cls in subclasses(errors.PipelineError):
        if cls.__module__.startswith(("tests", "test_")):
            continue
        assert cls.__module__ == "validation.errors", f"{cls.__qualname__} is declared in {cls.__module__}"
        assert cls.exit_code in registered, cls


def test_retry_rules_read_the_registry():
    from pipelines.launchers.retry import NO_RETRY_EXIT_CODES, Verdict, classify
    from validation.errors import DataError, DoctorFailed, SpecError, no_retry_exit_codes

    assert NO_RETRY_EXIT_CODES == no_retry_exit_codes()
    for cls in (SpecError, DataError, DoctorFailed):
        assert classify(cls.exit_code, None).verdict is Verdict.GIVE_UP
    assert classify(1, None).verdict is Verdict.RETRY
