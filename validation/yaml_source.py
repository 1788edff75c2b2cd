"""One untrusted YAML file -> plain data plus the line/column of every key and value.

The file comes from a pull request, so reading it is defensive end to end:

* bytes first: size cap, no NUL bytes, strict UTF-8 (a bad byte is reported with its line);
* YAML is *composed* into nodes by a `SafeLoader` subclass and turned into plain data by
  our own walker, which records the line/column of every key and value, rejects duplicate
  keys, any tag that is not a core type (`!!python/object` and friends), merge keys, and
  caps aliases, expanded nodes and nesting (an anchor bomb fails in milliseconds).

`parse_file` reports each problem through the caller's `Report` and returns a `LocatedDoc`,
or None when the file is unusable.
"""

from __future__ import annotations

import math
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 256 * 1024
"""An experiment is a few hundred lines; anything bigger is a mistake or an attack."""
MAX_ALIASES = 100
"""Alias nodes (`*name`) per file; legitimate specs use a handful at most."""
MAX_NODES = 20_000
"""Nodes after alias expansion: what a billion-laughs document would blow up."""
MAX_NESTING = 48
"""Nesting depth of mappings/sequences (the spec itself needs 4)."""
MAX_INT_DIGITS = 30
"""Integers longer than this are rejected before any bound check (no 10**4000 parsing)."""

FILE_FIELD = "<file>"
YAML_FIELD = "<yaml>"

CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""What a double-quoted escape can smuggle into a value: never shown raw, never in a path."""

_CORE = "tag:yaml.org,2002:"
_ALLOWED_TAGS = {_CORE + t for t in ("str", "int", "float", "bool", "null", "map", "seq")}
_MERGE_TAG = _CORE + "merge"
_SURROGATE = re.compile("[\ud800-\udfff]")

PathKey = tuple[str | int, ...]

Report = typing.Callable[[str, int, int, str, str], None]
"""Where problems go: `(file, line, col, field, message)`."""


@dataclass(frozen=True)
class Loc:
    """Where a key or value sits: display path of its file, 1-based line and column."""

    file: str
    line: int
    col: int


@dataclass
class LocatedDoc:
    """One parsed (and possibly merged) document: plain data plus where each path came from."""

    data: dict[str, Any]
    locs: dict[PathKey, Loc]
    key_locs: dict[PathKey, Loc] = field(default_factory=dict)
    poisoned: set[PathKey] = field(default_factory=set)
    chain: list[Path] = field(default_factory=list)


class _Abort(Exception):
    """Stops parsing one file; carries the single issue that explains why."""

    def __init__(self, line: int, col: int, field_name: str, message: str):
        super().__init__(message)
        self.line, self.col, self.field_name, self.message = line, col, field_name, message


def parse_dotted(text: str) -> PathKey:
    """Inverse of `dotted`: `data.sources[1].weight` -> `('data', 'sources', 1, 'weight')`."""
    parts: list[str | int] = []
    for piece in text.split("."):
        match = re.fullmatch(r"([^\[]*)((?:\[\d+\])*)", piece)
        if not match:
            parts.append(piece)
            continue
        if match.group(1):
            parts.append(match.group(1))
        parts.extend(int(i) for i in re.findall(r"\[(\d+)\]", match.group(2)))
    return tuple(parts)


def display_path(path: Path) -> str:
    """Path as shown in messages: relative to the working directory when inside it."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def dotted(path: PathKey) -> str:
    """`('data', 'sources', 1, 'weight')` -> `data.sources[1].weight`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or YAML_FIELD


def short(value: Any, limit: int = 60) -> str:
    """`repr(value)`, cut to one readable piece of a message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- YAML parsing


class _CappedComposer(yaml.composer.Composer):
    """PyYAML's composer, counting aliases and depth as it goes (aliases are never expanded here)."""

    alias_count = 0
    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # PyYAML hook
        events: Any = self  # the parser half of the loader this class is mixed into
        if events.check_event(yaml.AliasEvent):
            self.alias_count += 1
            if self.alias_count > MAX_ALIASES:
                mark = events.peek_event().start_mark
                raise _Abort(
                    mark.line + 1,
                    mark.column + 1,
                    YAML_FIELD,
                    f"more than {MAX_ALIASES} aliases (*name); alias expansion is capped to stop anchor bombs",
                )
        self.depth += 1
        if self.depth > MAX_NESTING:
            mark = events.peek_event().start_mark
            raise _Abort(
                mark.line + 1, mark.column + 1, YAML_FIELD, f"nested deeper than {MAX_NESTING} levels"
            )
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _CoreResolver(yaml.resolver.Resolver):
    """YAML 1.1 implicit types minus timestamps: dates stay strings (the spec has no date
    fields, and a `datetime` in the resolved JSON would only surprise)."""


_CoreResolver.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _CORE + "timestamp"]
    for first, resolvers in yaml.resolver.Resolver.yaml_implicit_resolvers.items()
}


class _LocatingLoader(
    yaml.reader.Reader,
    yaml.scanner.Scanner,
    yaml.parser.Parser,
    _CappedComposer,
    yaml.constructor.SafeConstructor,
    _CoreResolver,
):
    """Pure-Python safe loader that composes nodes; the reference for every error message."""

    def __init__(self, stream: str):
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        _CappedComposer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        _CoreResolver.__init__(self)


try:  # libyaml's C parser produces the same events about 7x faster; composing stays ours.
    from yaml._yaml import CParser as _CParser

    class _FastLocatingLoader(_CappedComposer, _CParser, yaml.constructor.SafeConstructor, _CoreResolver):
        def __init__(self, stream: str):
            _CParser.__init__(self, stream)
            _CappedComposer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            _CoreResolver.__init__(self)

except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _FastLocatingLoader = None  # type: ignore[assignment, misc]


def _compose(text: str) -> tuple[Any, Any]:
    """(loader, root node). The C parser first; on any error the pure-Python parser again,
    so messages and positions do not depend on whether libyaml is installed."""
    if _FastLocatingLoader is not None:
        fast = _FastLocatingLoader(text)
        try:
            return fast, fast.get_single_node()
        except _Abort:
            fast.dispose()
            raise
        except Exception:  # noqa: BLE001 - re-parsed below for the reference error
            fast.dispose()
    loader = _LocatingLoader(text)
    try:
        return loader, loader.get_single_node()
    except BaseException:
        loader.dispose()
        raise


def _show_tag(tag: str) -> str:
    return "!!" + tag[len(_CORE) :] if tag.startswith(_CORE) else tag


class _NodeWalker:
    """Turns a composed node graph into plain data plus a location for every path."""

    def __init__(self, loader: Any, display: str, report: Report):
        self.loader = loader
        self.display = display
        self.report = report
        self.locs: dict[PathKey, Loc] = {}
        self.key_locs: dict[PathKey, Loc] = {}
        self.poisoned: set[PathKey] = set()
        self.nodes = 0
        self.active: set[int] = set()

    def loc(self, node: yaml.Node) -> Loc:
        return Loc(self.display, node.start_mark.line + 1, node.start_mark.column + 1)

    def issue(self, node: yaml.Node, path: PathKey, message: str, *, poison: bool = True) -> None:
        """Report at `node`; a poisoned path gets no further (follow-on) errors from the models."""
        where = self.loc(node)
        self.report(where.file, where.line, where.col, dotted(path), message)
        if poison:
            self.poisoned.add(path)

    def build(self, node: yaml.Node, path: PathKey, key_loc: Loc, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            # Report at the top-level key being expanded, not deep inside the anchored node.
            where = self.key_locs.get(path[:1]) or self.loc(node)
            raise _Abort(
                where.line,
                where.col,
                YAML_FIELD,
                f"document expands to more than {MAX_NODES} nodes (alias/anchor expansion is capped)",
            )
        if depth > MAX_NESTING or id(node) in self.active:
            where = self.loc(node)
            raise _Abort(where.line, where.col, dotted(path), "recursive or too deeply nested aliases")
        if node.tag not in _ALLOWED_TAGS:
            self.locs[path] = self.loc(node)
            self.issue(
                node,
                path,
                f"YAML tag {_show_tag(node.tag)} is not allowed; only plain strings, numbers, booleans, "
                "null, mappings and lists",
            )
            return None
        if isinstance(node, yaml.MappingNode):
            self.locs[path] = key_loc
            self.active.add(id(node))
            try:
                return self.build_mapping(node, path, depth)
            finally:
                self.active.discard(id(node))
        if isinstance(node, yaml.SequenceNode):
            self.locs[path] = key_loc
            self.active.add(id(node))
            try:
                return [
                    self.build(item, (*path, i), self.loc(item), depth + 1)
                    for i, item in enumerate(node.value)
                ]
            finally:
                self.active.discard(id(node))
        self.locs[path] = self.loc(node)
        assert isinstance(node, yaml.ScalarNode), node
        return self.build_scalar(node, path)

    def build_mapping(self, node: yaml.MappingNode, path: PathKey, depth: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        first_seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                self.issue(
                    key_node,
                    path,
                    "YAML merge keys (<<) are not supported; use `extends: base.yaml`",
                    poison=False,
                )
                continue
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag not in _ALLOWED_TAGS:
                self.issue(key_node, path, "mapping keys must be plain strings", poison=False)
                continue
            key = str(key_node.value)
            key_loc = self.loc(key_node)
            if _SURROGATE.search(key):
                self.issue(
                    key_node,
                    path,
                    "key contains a lone UTF-16 surrogate escape (\\ud800-\\udfff)",
                    poison=False,
                )
                continue
            if key in result:
                self.issue(
                    key_node, (*path, key), f"duplicate key '{key}' (first set on line {first_seen[key]})"
                )
                continue
            first_seen[key] = key_loc.line
            self.key_locs[(*path, key)] = key_loc
            result[key] = self.build(value_node, (*path, key), key_loc, depth + 1)
        return result

    def build_scalar(self, node: yaml.ScalarNode, path: PathKey) -> Any:
        if node.tag == _CORE + "str":
            if _SURROGATE.search(node.value):
                self.issue(node, path, "contains a lone UTF-16 surrogate escape (\\ud800-\\udfff)")
                return None
            return node.value
        if node.tag == _CORE + "int":
            digits = sum(ch.isdigit() for ch in node.value)
            if digits > MAX_INT_DIGITS:
                self.issue(node, path, f"number too large ({digits} digits)")
                return None
        try:
            value = self.loader.construct_object(node)
        except (ValueError, OverflowError, yaml.YAMLError) as exc:
            self.issue(node, path, f"not a valid {_show_tag(node.tag)[2:]}: {exc}")
            return None
        if isinstance(value, float) and not math.isfinite(value):
            self.issue(node, path, f"non-finite number {node.value!r} is not allowed")
            return None
        return value


def parse_file(path: Path, report: Report) -> LocatedDoc | None:
    """Bytes -> text -> nodes -> data with locations; None (with one issue) when unusable."""
    display = display_path(path)
    try:
        raw = _read_capped(path)
    except _Abort as stop:
        report(display, stop.line, stop.col, stop.field_name, stop.message)
        return None
    try:
        text = _decode(raw)
        loader, node = _compose(text)
        try:
            if node is None:
                raise _Abort(1, 1, FILE_FIELD, "file has no content (empty or only comments)")
            if not isinstance(node, yaml.MappingNode):
                kind = "a list" if isinstance(node, yaml.SequenceNode) else "a single value"
                raise _Abort(
                    node.start_mark.line + 1,
                    node.start_mark.column + 1,
                    YAML_FIELD,
                    f"the top level must be a mapping of fields (name, hypothesis, model, ...), not {kind}",
                )
            walker = _NodeWalker(loader, display, report)
            data = walker.build(node, (), Loc(display, 1, 1), 0)
        finally:
            loader.dispose()
    except _Abort as stop:
        report(display, stop.line, stop.col, stop.field_name, stop.message)
        return None
    except yaml.MarkedYAMLError as exc:
        line, col, problem = syntax_problem(exc, text)
        report(display, line, col, YAML_FIELD, f"YAML syntax error: {problem}")
        return None
    except yaml.reader.ReaderError as exc:
        line, col = _line_col(text, exc.position)
        report(
            display,
            line,
            col,
            FILE_FIELD,
            f"unacceptable character #x{exc.character:04x} (control character)",
        )
        return None
    except yaml.YAMLError as exc:
        report(display, 1, 1, YAML_FIELD, f"invalid YAML: {str(exc).splitlines()[0] if str(exc) else exc}")
        return None
    if not isinstance(data, dict):  # a tagged root (`!!python/object` on the top mapping): reported
        return None
    return LocatedDoc(
        data=data, locs=walker.locs, key_locs=walker.key_locs, poisoned=walker.poisoned, chain=[path]
    )


_CLOSERS = {"{": "}", "[": "]"}


def syntax_problem(exc: yaml.MarkedYAMLError, text: str) -> tuple[int, int, str]:
    """(line, col, message) of a YAML syntax error, in words, where the author must look: an
    unclosed bracket or quote at the character that opened it (PyYAML's mark is where it gave
    up, lines later, on the next key), a tab at the tab, an undefined alias at the alias."""
    problem, context = exc.problem or "", exc.context or ""
    at, ctx = exc.problem_mark, exc.context_mark
    line, col = (at.line + 1, at.column + 1) if at else (ctx.line + 1, ctx.column + 1) if ctx else (1, 1)
    lines = text.splitlines()
    if ctx is not None and context.startswith(("while parsing a flow mapping", "while parsing a flow sequence")):
        source = lines[ctx.line] if ctx.line < len(lines) else ""
        opener = source[ctx.column] if ctx.column < len(source) and source[ctx.column] in _CLOSERS else (
            "{" if "mapping" in context else "[")
        closer = _CLOSERS[opener]
        found = re.search(r"but got '?(.*?)'?$", problem)
        got = found[1] if found else ""
        where = f"'{opener}' opened here"
        if got == "<stream end>":
            why = f"the {where} is never closed before the end of the file"
        elif got in _CLOSERS.values():
            why = (f"the {where} is closed with '{got}' on line {line}, column {col}; "
                   f"a {'mapping' if opener == '{' else 'list'} ends with '{closer}'")
        elif at is not None and at.line > ctx.line:
            why = f"the {where} is never closed (line {line} starts the next key)"
        else:
            why = f"the {where} needs ',' between items or '{closer}' to end it before column {col}"
        rest = source[ctx.column:].split(" #", 1)[0].rstrip().rstrip(",")
        one_line = at is not None and at.line == ctx.line + 1 and closer not in rest
        fix = f"; end it with '{closer}': {rest}{closer}" if one_line else f"; end it with '{closer}'"
        return ctx.line + 1, ctx.column + 1, why + ("" if got in _CLOSERS.values() else fix)
    if ctx is not None and context.startswith("while scanning a quoted scalar"):
        quote = lines[ctx.line][ctx.column] if ctx.line < len(lines) and ctx.column < len(lines[ctx.line]) else '"'
        return (ctx.line + 1, ctx.column + 1,
                f"the quote {quote} opened here is never closed; end the text with {quote}")
    alias = re.match(r"found undefined alias '(.*)'", problem)
    if alias:
        return line, col, (f"*{alias[1]} refers to an anchor &{alias[1]} that is not defined above it "
                           "(an alias repeats a value marked earlier in the file)")
    if "'\\t'" in problem or "\t" in problem:
        return line, col, "a tab character: YAML indents with spaces only; replace the tab with spaces"
    if "expected a single document" in context:
        return line, col, ("a second YAML document starts here ('---'): an experiment is one document; "
                           "remove the '---' and what follows, or move it to its own file")
    if context.startswith("while parsing a block mapping") and ctx is not None:
        return line, col, (f"line {line} is not aligned with the keys of the mapping that starts on line "
                           f"{ctx.line + 1}: indent it exactly like its sibling keys")
    message = " ".join(p for p in (context, problem) if p) or "invalid YAML"
    if ctx is not None and at is not None and ctx.line != at.line and context:
        message = f"{context} (from line {ctx.line + 1}) {problem}"
    return line, col, message


def _read_capped(path: Path) -> bytes:
    try:
        if not path.exists():
            raise _Abort(1, 1, FILE_FIELD, "no such file")
        if path.is_dir():
            raise _Abort(1, 1, FILE_FIELD, "is a directory, not a file")
        if not path.is_file():  # a FIFO or device would block or never end
            raise _Abort(1, 1, FILE_FIELD, "is not a regular file")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise _Abort(
                1, 1, FILE_FIELD, f"file is {size / 1024:.0f} KiB; the limit is {MAX_FILE_BYTES // 1024} KiB"
            )
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _Abort(1, 1, FILE_FIELD, f"cannot read: {exc.strerror or exc}") from exc
    if len(raw) > MAX_FILE_BYTES:
        raise _Abort(1, 1, FILE_FIELD, f"file exceeds {MAX_FILE_BYTES // 1024} KiB")
    if not raw.strip():
        raise _Abort(1, 1, FILE_FIELD, "file is empty")
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise _Abort(1, 1, FILE_FIELD, "file is UTF-16 (byte-order mark); save it as UTF-8")
    nul = raw.find(b"\x00")
    if nul >= 0:
        line, col = _byte_line_col(raw, nul)
        raise _Abort(
            line,
            col,
            FILE_FIELD,
            f"binary content (NUL byte at offset {nul}); expected a UTF-8 YAML text file",
        )
    return raw


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, col = _byte_line_col(raw, exc.start)
        raise _Abort(
            line,
            col,
            FILE_FIELD,
            f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save the file as UTF-8",
        ) from exc


def _byte_line_col(raw: bytes, offset: int) -> tuple[int, int]:
    line_start = raw.rfind(b"\n", 0, offset) + 1
    return raw.count(b"\n", 0, offset) + 1, offset - line_start + 1


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line_start = text.rfind("\n", 0, offset) + 1
    return text.count("\n", 0, offset) + 1, offset - line_start + 1
