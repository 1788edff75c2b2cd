"""Maps that cannot drift (issue 39 item 7): every package's docstring names each of its modules.

The package docstrings are the tree's map for a newcomer (`pipelines/__init__.py` lists
`cli`, `cmd_*`, `orchestrate`, ...). They drifted by 14 modules within a day of being
rewritten, so a module added without its line now fails here, and a line naming a module
that is gone fails too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.parent.relative_to(ROOT).as_posix() for top in ("basics", "pipelines", "trainer", "reports", "validation",
                                                                     "models")
                  for p in (ROOT / top).rglob("__init__.py") if "__pycache__" not in p.parts)
# A map line: two-space indent, then a module name (a trailing `/` for a subpackage), then at
# least two spaces before its description (or `- name:` bullets; see `_listed`).
LINE = re.compile(r"^ {2}(?P<name>[A-Za-z_][\w]*)/?\s{2,}\S", re.M)
BULLET = re.compile(r"^- `(?P<name>[A-Za-z_]\w*)`", re.M)


def _members(package: Path) -> set[str]:
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    subpackages = {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    return modules | subpackages


def _doc(package: Path) -> str:
    return ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""


def _mentioned(doc: str, name: str) -> bool:
    return re.search(rf"(?<![\w/.]){re.escape(name)}(?![\w])", doc) is not None


def _listed(doc: str) -> set[str]:
    return {m.group("name") for m in LINE.finditer(doc)} | {m.group("name") for m in BULLET.finditer(doc)}


@pytest.mark.parametrize("package", PACKAGES)
def test_the_package_docstring_names_every_module(package: str) -> None:
    path = ROOT / package
    doc = _doc(path)
    members = _members(path)
    if len(members) < 3:  # a two-file package needs no map
        return
    assert [name for name in sorted(members) if not _mentioned(doc, name)] == [], (
        f"{package}/__init__.py: add a line for each module to its docstring map")


@pytest.mark.parametrize("package", PACKAGES)
def test_the_package_docstring_lists_no_module_that_is_gone(package: str) -> None:
    path = ROOT / package
    members = _members(path) | {"__main__"}
    gone = sorted(name for name in _listed(_doc(path))
                  if name not in members and name.islower() and name not in _NOT_MODULES)
    assert gone == [], f"{package}/__init__.py lists modules that do not exist"


_NOT_MODULES = frozenset({
    # Words that start an indented docstring line but name a command, a field or a concept.
    "pipeline", "python", "make", "runs", "data", "experiments", "spec", "checkpoints", "model", "train",
})
