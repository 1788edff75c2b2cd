"""The default corpus, built offline from the running interpreter's standard library.

Three sources with clearly different distributions and no download:

- `code`: module source split into top-level definitions (functions, classes) with `ast`;
- `docs`: docstrings (modules, classes, functions, methods) as English prose;
- `reference`: the language reference topics of `pydoc_data.topics`.

Modules are visited in sorted path order, so the same interpreter always produces
byte-identical files (and therefore the same data version). Sizes are capped so the
build takes a few seconds (a record is never cut; one that would overshoot a
source's budget is skipped): by default 4 MB of code and 1.5 MB of docstrings (the
standard library holds ~13 MB and ~1.8 MB); the reference topics (~0.5 MB) are small
enough to keep whole unless a smaller cap is asked for.
"""

from __future__ import annotations

import ast
import json
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from basics.files import atomic_write_text

DEMO_SOURCES = ("code", "docs", "reference")
DEFAULT_MAX_BYTES = {"code": 4_000_000, "docs": 1_500_000, "reference": 1_000_000}
# Test suites, generated tables and vendored packages are not typical code or prose.
# A source counts as full this close to its budget (records are whole; no more need scanning).
_FULL_SLACK = 2_000
_SKIPPED_PARTS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings"}


@dataclass(frozen=True)
class DemoCorpus:
    """Where `build_demo_corpus` wrote each source, with document and byte counts."""

    paths: dict[str, Path]
    documents: dict[str, int]
    bytes: dict[str, int]


def _stdlib_modules() -> Iterator[tuple[str, Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        if _SKIPPED_PARTS & set(rel_dir.parts):
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_PARTS)
        for name in filenames:
            if name.endswith(".py") and not name.startswith("test_"):
                rel = rel_dir / name
                found.append((rel.with_suffix("").as_posix().replace("/", "."), root / rel))
    yield from sorted(found)


def _definitions_and_docstrings(module: str, path: Path) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return [], []  # a few files are deliberately broken (grammar fixtures): not our corpus
    lines = source.splitlines(keepends=True)
    code: list[dict[str, str]] = []
    docs: list[dict[str, str]] = []
    module_doc = ast.get_docstring(tree, clean=True)
    if module_doc:
        docs.append({"id": module, "text": module_doc})
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
        assert node.end_lineno is not None
        code.append({"id": f"{module}:{node.name}", "text": "".join(lines[start : node.end_lineno])})
        for inner in ast.walk(node):
            if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                text = ast.get_docstring(inner, clean=True)
                if text:
                    docs.append({"id": f"{module}:{node.name}.{inner.name}", "text": text})
    return code, docs


def _reference_topics() -> list[dict[str, str]]:
    from pydoc_data import topics  # shipped with CPython; plain dict of str

    return [{"id": key, "text": topics.topics[key]} for key in sorted(topics.topics)]


class _CappedJsonl:
    """Collects records until a byte budget is spent; written atomically when closed."""

    def __init__(self, path: Path, max_bytes: int):
        self.path, self.max_bytes = path, max_bytes
        self.lines: list[str] = []
        self.bytes = self.documents = 0

    @property
    def full(self) -> bool:
        return self.bytes >= self.max_bytes - _FULL_SLACK

    def add(self, record: dict[str, str]) -> None:
        """Append unless the record would overshoot the budget (a smaller one may still fit)."""
        line = json.dumps(record, ensure_ascii=False) + "\n"
        size = len(line.encode("utf-8"))
        if self.full or (self.documents and self.bytes + size > self.max_bytes):
            return
        self.lines.append(line)
        self.bytes += size
        self.documents += 1

    def close(self) -> None:
        atomic_write_text(self.path, "".join(self.lines))


def build_demo_corpus(out_dir: Path, max_bytes: dict[str, int] | int | None = None) -> DemoCorpus:
    """Write `code.jsonl`, `docs.jsonl` and `reference.jsonl` (field `text`) into `out_dir`.

    `max_bytes` caps each source (one number for all, or per source); tests pass a small
    cap so a corpus builds in well under a second. Each file is written to a temporary
    name and renamed, so a reader never sees half a corpus file.
    """
    caps = dict(DEFAULT_MAX_BYTES)
    if isinstance(max_bytes, int):
        caps = dict.fromkeys(DEMO_SOURCES, max_bytes)
    elif max_bytes:
        caps.update(max_bytes)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    writers = {name: _CappedJsonl(out_dir / f"{name}.jsonl", caps[name]) for name in DEMO_SOURCES}
    try:
        for module, path in _stdlib_modules():
            if writers["code"].full and writers["docs"].full:
                break
            code, docs = _definitions_and_docstrings(module, path)
            for record in code:
                writers["code"].add(record)
            for record in docs:
                writers["docs"].add(record)
        for record in _reference_topics():
            writers["reference"].add(record)
    finally:
        for writer in writers.values():
            writer.close()
    return DemoCorpus(
        paths={n: w.path for n, w in writers.items()},
        documents={n: w.documents for n, w in writers.items()},
        bytes={n: w.bytes for n, w in writers.items()},
    )
