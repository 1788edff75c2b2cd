"""Layers and registries that keep the code base honest.

- no module imports a higher layer (`LAYER_RANK`: `basics` (errors and exit codes, atomic files,
  paths, environment), then `models`, then `validation`, then `trainer` and `reports`, then
  `pipelines`), module-level and lazy imports alike (`TYPE_CHECKING`
  blocks excluded, they never run);
- the packages have no import cycle (same imports);
- every `PipelineError` subclass is declared in `basics.errors`, and every exit code
  has one meaning there (the launchers' retry rules read the same table);
- the checkpoint format pipelines read (`trainer.checkpoint.format`) never imports torch.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("basics", "pipelines", "trainer", "validation", "reports")
# What may import what, from the import graph: a module imports only its own layer or lower ones.
# basics/ imports none of ours; models/ (architecture and optimizer plug-ins) only basics/; validation/ reads the models'
# torch-free configs; the trainer and the reports both stand on validation/ (and not on each other
# today, though the rank allows it); pipelines/ orchestrates everything.
LAYER_RANK = {"basics": 0, "models": 1, "validation": 2, "trainer": 3, "reports": 3, "pipelines": 4}


def _modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in packages:
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


def _graph(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    modules = _modules(packages)
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for every import of a higher layer than the importer's."""
    def rank(module: str) -> int:
        return LAYER_RANK[module.split(".")[0]]

    return sorted((name, target) for name, targets in graph.items() for target in targets
                  if rank(target) > rank(name))


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


TORCH_LIBRARIES = {"torch", "safetensors"}


def _libraries(path: Path) -> set[str]:
    """Top-level names of every absolute import in `path`, functions included, outside TYPE_CHECKING."""
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
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def _torch_importers(module: str, graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """What importing `module` may load (its packages' `__init__` and everything they import,
    transitively, lazy imports included) -> the torch libraries each imports; {} when torch-free."""
    modules = _modules()
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            parts = name.split(".")
            todo += [".".join(parts[:i]) for i in range(1, len(parts))] + sorted(graph[name])
    return {name: found for name in sorted(seen) if (found := _libraries(modules[name]) & TORCH_LIBRARIES)}


def test_the_checkpoint_format_never_imports_torch():
    """Pipelines list, verify and copy checkpoints without loading a tensor library."""
    assert _torch_importers("trainer.checkpoint.format", _graph()) == {}


def test_pipelines_read_checkpoints_only_through_torch_free_modules():
    graph = _graph()
    used = sorted({target for name, targets in graph.items() if name.split(".")[0] == "pipelines"
                   for target in targets if target.startswith("trainer.checkpoint")})
    assert used, "pipelines read checkpoints (continuation, sweeps): through trainer.checkpoint.format"
    assert {m: _torch_importers(m, graph) for m in used} == {m: {} for m in used}


def test_no_module_imports_a_higher_layer():
    layers = tuple(LAYER_RANK)
    modules = _modules(layers)
    offending = [
        f"{modules[name].relative_to(REPO)} imports {target} "
        f"({name.split('.')[0]}, rank {LAYER_RANK[name.split('.')[0]]}, may not import "
        f"{target.split('.')[0]}, rank {LAYER_RANK[target.split('.')[0]]})"
        for name, target in _upward_imports(_graph(layers))
    ]
    assert offending == [], "imports of a higher layer (move the code down, or the import up):\n" + "\n".join(
        offending)


def test_every_installed_package_has_a_layer():
    import tomllib

    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {pattern.rstrip("*") for pattern in include} == set(LAYER_RANK)


def test_the_layer_check_finds_an_upward_import():
    graph = {"validation.spec": {"models.llama"}, "validation.data.x": {"pipelines.dataprep.prepare"},
             "trainer.loop": {"reports.records", "validation.spec"}, "pipelines.cli": {"trainer.loop"}}
    assert _upward_imports(graph) == [("validation.data.x", "pipelines.dataprep.prepare")]


def test_no_import_cycle_in_the_packages():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_pipeline_error_is_declared_in_the_registry_with_a_registered_code():
    from basics import errors

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
        assert cls.__module__ == "basics.errors", f"{cls.__qualname__} is declared in {cls.__module__}"
        assert cls.exit_code in registered, cls


def test_retry_rules_read_the_registry():
    from basics.errors import DataError, DoctorFailed, SpecError, no_retry_exit_codes
    from pipelines.launchers.retry import NO_RETRY_EXIT_CODES, Verdict, classify

    assert NO_RETRY_EXIT_CODES == no_retry_exit_codes()
    for cls in (SpecError, DataError, DoctorFailed):
        assert classify(cls.exit_code, None).verdict is Verdict.GIVE_UP
    assert classify(1, None).verdict is Verdict.RETRY
