"""Load `experiments/<name>.yaml` into one frozen `ExperimentSpec`, safely, reporting every problem at once.

The file is untrusted input from a pull request, so loading is defensive end to end:

* bytes first: size cap, no NUL bytes, strict UTF-8 (a bad byte is reported with its line);
* YAML is *composed* into nodes by a `SafeLoader` subclass and turned into plain data by
  our own walker, which records the line/column of every key and value, rejects duplicate
  keys, any tag that is not a core type (`!!python/object` and friends), merge keys, and
  caps aliases, expanded nodes and nesting (an anchor bomb fails in milliseconds);
* `extends:` chains are deep-merged (mappings merge, lists replace) and every value keeps
  the file it came from, so an error in a base is reported in the base;
* pydantic errors are mapped back from their `loc` to the YAML node; cross-field rules
  (`validation.rules`) report the field to change; file-level rules (the name matches
  the file, data paths stay inside the data roots, the baseline exists) live here.

Every issue becomes one `path:line:col: field: message` line in a single `SpecError`.
"""

from __future__ import annotations

import contextvars
import difflib
import math
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from validation.errors import Issue, PipelineError, SpecError
from validation.paths import (
    DATA_ROOTS_ENV,
    EXPERIMENTS_DIR,
    data_roots,
    experiment_file,
    experiment_names,
    find_repo_root,
)
from validation.spec import ARCHITECTURES, CHAMPION, OPTIMIZERS, ExperimentSpec, foreign_plugins_active

MAX_FILE_BYTES = 256 * 1024
"""An experiment is a few hundred lines; anything bigger is a mistake or an attack."""
MAX_ALIASES = 100
"""Alias nodes (`*name`) per file; legitimate specs use a handful at most."""
MAX_NODES = 20_000
"""Nodes after alias expansion: what a billion-laughs document would blow up."""
MAX_NESTING = 48
"""Nesting depth of mappings/sequences (the spec itself needs 4)."""
MAX_EXTENDS_DEPTH = 5
"""`extends:` hops from the file being validated to the root of its chain."""
MAX_INT_DIGITS = 30
"""Integers longer than this are rejected before any bound check (no 10**4000 parsing)."""

FILE_FIELD = "<file>"
YAML_FIELD = "<yaml>"

_CORE = "tag:yaml.org,2002:"
_ALLOWED_TAGS = {_CORE + t for t in ("str", "int", "float", "bool", "null", "map", "seq")}
_MERGE_TAG = _CORE + "merge"
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_GLOB_CHARS = re.compile(r"[*?\[]")
_SURROGATE = re.compile("[\ud800-\udfff]")

PathKey = tuple[str | int, ...]


@dataclass(frozen=True)
class Loc:
    """Where a key or value sits: display path of its file, 1-based line and column."""

    file: str
    line: int
    col: int


@dataclass
class _Doc:
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


# --------------------------------------------------------------------------- public API


def load_spec(
    path: str | os.PathLike[str], *, repo_root: str | os.PathLike[str] | None = None
) -> ExperimentSpec:
    """Load and validate one experiment file; raise `SpecError` carrying every issue found."""
    spec, issues = check_spec(path, repo_root=repo_root)
    if issues:
        raise SpecError(issues)
    assert spec is not None
    return spec


def check_spec(
    path: str | os.PathLike[str], *, repo_root: str | os.PathLike[str] | None = None
) -> tuple[ExperimentSpec | None, list[Issue]]:
    """Like `load_spec` but returns `(spec or None, issues)`; the CLI uses it for many files."""
    loaded = load_located(path, repo_root=repo_root)
    return loaded.spec, loaded.issues


@dataclass(frozen=True)
class LoadedSpec:
    """A load result with a locator: dotted field (`data.sources[0].weight`) -> (file, line, col).

    Later checks (the preflight planner) use `locate` to point their own errors at the
    YAML line of the field to change, in the file that set it.
    """

    spec: ExperimentSpec | None
    issues: list[Issue]
    locate: typing.Callable[[str], tuple[str, int, int]]
    files: tuple[Path, ...]
    """The file and its `extends` chain, nearest first."""


def load_located(
    path: str | os.PathLike[str], *, repo_root: str | os.PathLike[str] | None = None
) -> LoadedSpec:
    """Load one file and keep the locations: what `pipeline plan` needs to place preflight errors."""
    loader = _SpecLoader(Path(path), Path(repo_root) if repo_root is not None else None)
    try:
        spec = loader.run()
    except RecursionError:  # belt and braces: nesting caps should make this unreachable
        loader.add(loader.top_display, 1, 1, YAML_FIELD, "document nested too deeply")
        spec = None
    doc = loader.doc or _Doc({}, {})

    def locate(field_path: str) -> tuple[str, int, int]:
        where = loader.locate(doc, parse_dotted(field_path))
        return where.file, where.line, where.col

    issues = loader.sorted_issues()
    return LoadedSpec(None if issues else spec, issues, locate, tuple(doc.chain))


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


_COMPARING: contextvars.ContextVar[bool] = contextvars.ContextVar("_COMPARING", default=False)
"""Set while a baseline file is loaded for `check_metric_comparable` (it does not look further)."""


def deep_merge(base: Any, override: Any) -> Any:
    """Mappings merge key by key; anything else (lists, scalars, null) in `override` replaces.

    A plug-in section (`model`, `train.optimizer`) whose discriminator the override changes
    (`model_type: nanogpt` over a llama base) keeps only the inherited keys the new plug-in
    declares: the base's `num_kv_heads` is not an error of the file that switched to an
    architecture without it. Keys the override itself sets are always checked."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key in ("model_type", "name"):
            if key in override and key in base and override[key] != base[key]:
                known = _plugin_fields(key, override[key])
                if known is not None:
                    merged = {k: v for k, v in base.items() if k in known}
        for key, value in override.items():
            merged[key] = deep_merge(merged[key], value) if key in merged else value
        return merged
    return override


def _plugin_fields(key: str, value: Any) -> set[str] | None:
    """Field names of the architecture (`model_type`) or optimizer (`name`) called `value`."""
    table: dict[str, Any] = ARCHITECTURES if key == "model_type" else OPTIMIZERS
    config = table.get(value) if isinstance(value, str) else None
    return set(config.model_fields) if config is not None else None


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


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _NodeWalker:
    """Turns a composed node graph into plain data plus a location for every path."""

    def __init__(self, loader: Any, display: str, report: typing.Callable[..., None]):
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


# --------------------------------------------------------------------------- loading


class _SpecLoader:
    """One `check_spec` call: reads the chain, validates, collects issues."""

    def __init__(self, path: Path, repo_root: Path | None):
        self.top = path
        self.top_display = display_path(path)
        self.repo_root = (repo_root or find_repo_root(path)).resolve()
        self.issues: list[Issue] = []
        self.top_extends_loc = Loc(self.top_display, 1, 1)
        self.doc: _Doc | None = None

    # -- issue bookkeeping

    def add(self, file: str, line: int, col: int, field_name: str, message: str) -> None:
        self.issues.append(Issue(file, max(line, 1), max(col, 1), _clean(field_name), _clean(message)))

    def add_at(
        self,
        doc: _Doc,
        path: PathKey,
        message: str,
        *,
        field_path: PathKey | None = None,
        at_key: bool = False,
    ) -> None:
        where = doc.key_locs.get(path) if at_key else None
        where = where or self.locate(doc, path)
        self.add(
            where.file, where.line, where.col, dotted(field_path if field_path is not None else path), message
        )

    def locate(self, doc: _Doc, path: PathKey) -> Loc:
        """The node for `path`, or its nearest ancestor that the files set (missing fields, defaults)."""
        for cut in range(len(path), 0, -1):
            if path[:cut] in doc.locs:
                return doc.locs[path[:cut]]
        return Loc(self.top_display, 1, 1)

    def sorted_issues(self) -> list[Issue]:
        unique = list(dict.fromkeys(self.issues))
        return sorted(unique, key=lambda i: (i.file != self.top_display, i.file, i.line, i.col, i.field))

    # -- the steps

    def run(self) -> ExperimentSpec | None:
        doc = self.read_chain(self.top, [self.top.resolve()])
        if doc is None:
            return None
        self.doc = doc
        self.check_file_rules(doc)
        try:
            spec = ExperimentSpec.model_validate(doc.data)
        except ValidationError as exc:
            self.map_validation_errors(doc, exc)
            return None
        from validation import rules

        for violation in rules.check(spec):
            self.add_at(doc, violation.path, violation.message)
        self.check_local_tokenizer(doc, spec)
        self.check_metric_comparable(doc, spec)
        return spec

    def check_metric_comparable(self, doc: _Doc, spec: ExperimentSpec) -> None:
        """`rules.metric_comparable` against the baseline experiment's file: the one check that
        reads a second spec (found by the one lookup rule, in this file's repository). The
        baseline's own rules do not look further; a baseline that does not load is reported by
        its own validation, not here."""
        from validation import rules

        if _COMPARING.get() or spec.hypothesis.baseline in (CHAMPION, spec.name):
            return
        if not spec.hypothesis.metric.startswith("eval/"):
            return
        if self.top.resolve().parent != (self.repo_root / EXPERIMENTS_DIR).resolve():
            return  # an experiment of this repository is compared with its baseline there
        found = experiment_file(self.repo_root, spec.hypothesis.baseline)
        if found is None:
            return
        token = _COMPARING.set(True)
        try:
            baseline = load_spec(found, repo_root=self.repo_root)
        except PipelineError:
            return
        finally:
            _COMPARING.reset(token)
        for violation in rules.metric_comparable(spec, baseline):
            self.add_at(doc, violation.path, violation.message)

    def check_local_tokenizer(self, doc: _Doc, spec: ExperimentSpec) -> None:
        """A local tokenizer must fit the embedding: its `tokenizer.json` read as JSON (no
        tokenizers, no torch). Reproduced on the old main: 4,096 tokens with
        `model.vocab_size: 2048` passed validate, prepare, checks and smoke, then failed
        training four times."""
        tok = spec.data.tokenizer
        path = ("data", "tokenizer", "path")
        if tok.kind != "local" or not tok.path or path in doc.poisoned:
            return
        file = Path(tok.path) if os.path.isabs(tok.path) else self.repo_root / tok.path
        size = tokenizer_file_vocab(file / "tokenizer.json")
        if size is not None and size > spec.model.vocab_size:
            self.add_at(doc, path, f"{tok.path}/tokenizer.json has {size:,} tokens but model.vocab_size is "
                                   f"{spec.model.vocab_size:,}: raise model.vocab_size to at least {size}")

    def read_chain(self, path: Path, stack: list[Path]) -> _Doc | None:
        doc = self.parse_file(path)
        if doc is None:
            return None
        doc.chain = [path]
        extends = doc.data.get("extends")
        if extends is None:
            return doc
        where = doc.locs[("extends",)]
        if not isinstance(extends, str) or not extends.strip():
            # Without its base the file cannot be checked further; one clear line beats a dozen.
            self.add(
                where.file, where.line, where.col, "extends", "must be one relative path to a .yaml file"
            )
            return None
        target = self.resolve_extends(extends, path, where)
        if target is None:
            return None
        if target in stack:
            names = " -> ".join(p.name for p in [*stack, target])
            self.add_extends_chain_issue(f"extends cycle: {names}")
            return None
        if len(stack) > MAX_EXTENDS_DEPTH:
            names = " -> ".join(p.name for p in [*stack, target])
            self.add_extends_chain_issue(f"extends chain deeper than {MAX_EXTENDS_DEPTH} files: {names}")
            return None
        base = self.read_chain(target, [*stack, target])
        if base is None:
            return None
        # A base's own name and extends describe the base, never the file extending it.
        base_data = {k: v for k, v in base.data.items() if k not in ("extends", "name")}
        merged = deep_merge(base_data, doc.data)
        return _Doc(
            data=merged,
            locs={**base.locs, **doc.locs},
            key_locs={**base.key_locs, **doc.key_locs},
            poisoned=base.poisoned | doc.poisoned,
            chain=[path, *base.chain],
        )

    def add_extends_chain_issue(self, message: str) -> None:
        """Chain-shaped problems are reported on the extends line of the file being validated."""
        where = self.top_extends_loc
        self.add(where.file, where.line, where.col, "extends", message)

    def resolve_extends(self, value: str, path: Path, where: Loc) -> Path | None:
        if path.resolve() == self.top.resolve():
            self.top_extends_loc = where
        if _CONTROL_CHARS.search(value):
            self.add(where.file, where.line, where.col, "extends", "contains control characters")
            return None
        if not value.endswith((".yaml", ".yml")):
            self.add(
                where.file, where.line, where.col, "extends", f"must name a .yaml file, got {_short(value)}"
            )
            return None
        if os.path.isabs(value):
            self.add(where.file, where.line, where.col, "extends", "must be a path relative to this file")
            return None
        try:
            target = (path.parent / value).resolve()
        except (OSError, RuntimeError) as exc:
            self.add(where.file, where.line, where.col, "extends", f"cannot resolve {_short(value)}: {exc}")
            return None
        allowed = [(self.repo_root / EXPERIMENTS_DIR).resolve(), self.top.resolve().parent]
        if not any(target.is_relative_to(root) for root in allowed):
            self.add(
                where.file,
                where.line,
                where.col,
                "extends",
                f"{_short(value)} points outside the experiments directory",
            )
            return None
        if not target.is_file():
            self.add(
                where.file, where.line, where.col, "extends", f"base file {_short(value)} does not exist"
            )
            return None
        return target

    def parse_file(self, path: Path) -> _Doc | None:
        """Bytes -> text -> nodes -> data with locations; None (with one issue) when unusable."""
        display = display_path(path)
        try:
            raw = _read_capped(path)
        except _Abort as stop:
            self.add(display, stop.line, stop.col, stop.field_name, stop.message)
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
                walker = _NodeWalker(loader, display, self.add)
                data = walker.build(node, (), Loc(display, 1, 1), 0)
            finally:
                loader.dispose()
        except _Abort as stop:
            self.add(display, stop.line, stop.col, stop.field_name, stop.message)
            return None
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
            context = exc.context or ""
            if (
                exc.context
                and exc.context_mark
                and exc.problem_mark
                and exc.context_mark.line != exc.problem_mark.line
            ):
                context += f" (from line {exc.context_mark.line + 1})"
            problem = " ".join(p for p in (context, exc.problem) if p) or "invalid YAML"
            self.add(display, line, col, YAML_FIELD, f"YAML syntax error: {problem}")
            return None
        except yaml.reader.ReaderError as exc:
            line, col = _line_col(text, exc.position)
            self.add(
                display,
                line,
                col,
                FILE_FIELD,
                f"unacceptable character #x{exc.character:04x} (control character)",
            )
            return None
        except yaml.YAMLError as exc:
            self.add(
                display, 1, 1, YAML_FIELD, f"invalid YAML: {str(exc).splitlines()[0] if str(exc) else exc}"
            )
            return None
        if not isinstance(data, dict):  # a tagged root (`!!python/object` on the top mapping): reported
            return None
        return _Doc(data=data, locs=walker.locs, key_locs=walker.key_locs, poisoned=walker.poisoned)

    # -- file-level rules (need the file name, the repo, the file system)

    def check_file_rules(self, doc: _Doc) -> None:
        data, stem = doc.data, self.top.stem
        name = data.get("name")
        if isinstance(name, str) and name != stem:
            self.add_at(doc, ("name",), f"'{name}' must equal the file name '{stem}'")

        # Each experiment states its own claim; inheriting the base's would test nothing new.
        statement_loc = doc.locs.get(("hypothesis", "statement"))
        if statement_loc is not None and statement_loc.file != self.top_display:
            section_loc = doc.locs.get(("hypothesis",))
            where = (
                section_loc
                if section_loc and section_loc.file == self.top_display
                else Loc(self.top_display, 1, 1)
            )
            self.add(
                where.file,
                where.line,
                where.col,
                "hypothesis.statement",
                f"inherited from {statement_loc.file}; state what this experiment tests",
            )

        roots = data_roots(self.repo_root)
        for path, value in _data_paths(data):
            if path in doc.poisoned or not isinstance(value, str):
                continue
            problem = check_data_path(value, self.repo_root, roots)
            if problem:
                self.add_at(doc, path, problem)
                doc.poisoned.add(path)

        evaluation = data.get("eval")
        if isinstance(evaluation, dict) and isinstance(evaluation.get("tasks"), list):
            from validation.downstream import task_problems

            for path, problem in task_problems(evaluation["tasks"], self.repo_root):
                # The trusted re-validation of a PR holds only its experiments/ (as data): a task
                # file is PR content the unprivileged check validated; its absence here is expected.
                if path not in doc.poisoned and not (foreign_plugins_active() and problem.startswith("no task file")):
                    self.add_at(doc, path, problem)

        hypothesis = data.get("hypothesis")
        baseline = hypothesis.get("baseline") if isinstance(hypothesis, dict) else None
        if (
            isinstance(baseline, str)
            and baseline not in (CHAMPION, name, stem)
            and re.fullmatch(r"[a-z0-9][a-z0-9_-]{2,63}", baseline)
            and (self.repo_root / EXPERIMENTS_DIR).is_dir()
            and experiment_file(self.repo_root, baseline) is None
        ):
            hint = _did_you_mean(baseline, experiment_names(self.repo_root))
            self.add_at(
                doc,
                ("hypothesis", "baseline"),
                f"no experiment '{baseline}' in {EXPERIMENTS_DIR}/{hint}; use an experiment name or `champion`",
            )

    # -- pydantic errors -> issues

    def map_validation_errors(self, doc: _Doc, exc: ValidationError) -> None:
        grouped: dict[PathKey, list[tuple[ErrorDetails, bool]]] = {}
        resolved = [
            (e, *_resolve_error_path(doc.data, e))
            for e in exc.errors(include_url=False, include_context=False)
        ]
        # For a union (`parallel: auto | {dp, tp, ...}`), when one branch got further into
        # the value, the shallow "should be 'auto'" complaint of the other is noise.
        deep_unions = {path[:n] for _, path, union in resolved if union for n in range(len(path))}
        for error, path, through_union in resolved:
            if self.poisoned(doc, path):
                continue  # already reported by the YAML walker
            if through_union and path in deep_unions and isinstance(_get(doc.data, path), dict):
                continue
            grouped.setdefault(path, []).append((error, through_union))
        # A misspelt key already says "did you mean 'x'": don't also report 'x' as missing.
        suggested = {
            (*path[:-1], match)
            for path, errors in grouped.items()
            if errors[0][0]["type"] == "extra_forbidden"
            for match in difflib.get_close_matches(str(path[-1]), _field_names(path[:-1], doc.data), n=1, cutoff=0.6)
        }
        for path, errors in grouped.items():
            if path in suggested and all(e["type"] == "missing" for e, _ in errors):
                continue
            if len(errors) > 1 and all(union for _, union in errors):
                options = list(dict.fromkeys(_alternative(e) for e, _ in errors))
                self.add_at(doc, path, "must be " + " or ".join(options) + _got(errors[0][0]))
                continue
            for error, _ in errors:
                self.map_one_error(doc, path, error)

    def map_tag_error(self, doc: _Doc, path: PathKey, error: ErrorDetails) -> None:
        """An unknown (or absent) plug-in name: point at the key that names it and list the
        files that exist (an architecture is models/<name>.py, an optimizer
        models/optimizers/<name>.py)."""
        ctx = error.get("ctx") or {}
        key = "name" if path and path[-1] == "optimizer" else "model_type"
        where = "models/optimizers" if key == "name" else "models"
        known = ", ".join(sorted(ARCHITECTURES if key == "model_type" else OPTIMIZERS))
        if error["type"] == "union_tag_not_found":
            self.add_at(doc, path, f"required field '{key}' is missing (one of: {known})", field_path=(*path, key))
            return
        value = ctx.get("tag") or _get(doc.data, (*path, key))
        self.add_at(doc, (*path, key), f"unknown {key} '{value!s}': no {where}/{value}.py; one of: {known}")

    @staticmethod
    def poisoned(doc: _Doc, path: PathKey) -> bool:
        return any(path[: len(bad)] == bad for bad in doc.poisoned)

    def map_one_error(self, doc: _Doc, path: PathKey, error: ErrorDetails) -> None:
        kind = error["type"]
        if kind == "missing":
            hint = f"; set `name: {self.top.stem}` (the file name)" if path == ("name",) else ""
            self.add_at(doc, path[:-1], f"required field '{path[-1]}' is missing{hint}", field_path=path)
            return
        if kind == "extra_forbidden":
            allowed = _field_names(path[:-1], doc.data)
            hint = _did_you_mean(str(path[-1]), allowed)
            self.add_at(doc, path, f"unknown key '{path[-1]}'{hint}", at_key=True)
            return
        if kind in ("union_tag_invalid", "union_tag_not_found"):
            self.map_tag_error(doc, path, error)
            return
        message = _plain_message(error)
        value = _get(doc.data, path)
        if kind == "value_error" and isinstance(value, dict):
            # A model-level validator: point at a field its message names, preferring one
            # set in the file being validated (that is the line its author can change).
            named = [
                (*path, n) for n in dict.fromkeys(re.findall(r"[a-z_][a-z0-9_]*", message)) if n in value
            ]
            own = [p for p in named if self.locate(doc, p).file == self.top_display]
            if named:
                target = (own or named)[0]
                if not self.poisoned(doc, target):
                    self.add_at(doc, target, message)
                return
        self.add_at(doc, path, message + _got(error))


# --------------------------------------------------------------------------- helpers


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


def _clean(text: str) -> str:
    """One printable line: control characters and lone surrogates escaped."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _CONTROL_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _did_you_mean(word: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _get(data: Any, path: PathKey) -> Any:
    for part in path:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            return None
    return data


def _resolve_error_path(data: Any, error: ErrorDetails) -> tuple[PathKey, bool]:
    """Drop pydantic's union-member tags from `loc` so it names YAML keys only."""
    loc = error["loc"]
    resolved: list[str | int] = []
    through_union = False
    current = data
    for index, part in enumerate(loc):
        if isinstance(current, dict) and part in current:
            resolved.append(part)
            current = current[part]
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            resolved.append(part)
            current = current[part]
        elif index == len(loc) - 1 and error["type"] in ("missing", "extra_forbidden"):
            resolved.append(part)
        else:
            through_union = True
    return tuple(resolved), through_union


def _plain_message(error: ErrorDetails) -> str:
    message = str(error.get("msg", "invalid value"))
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix) :]
    if error["type"] == "model_type" or error["type"] == "dict_type":
        return "must be a mapping"
    if error["type"] == "list_type":
        return "must be a list"
    return message


def _alternative(error: ErrorDetails) -> str:
    """One branch of a union, phrased to follow "must be"."""
    if error["type"] in ("model_type", "dict_type", "model_attributes_type"):
        return "a mapping"
    message = _plain_message(error)
    return message.removeprefix("Input should be ")


def _got(error: ErrorDetails) -> str:
    if error["type"] in ("value_error", "missing", "extra_forbidden"):
        return ""
    value = error.get("input")
    if isinstance(value, (dict, list)):
        return f", got a {'mapping' if isinstance(value, dict) else 'list'}"
    return f", got {_short(value)}"


def _model_at(path: PathKey, data: Any = None) -> type[BaseModel] | None:
    """The section model at `path`; inside a plug-in union (`model`, `train.optimizer`) the
    member `data` selects by its discriminator (`model_type`, `name`)."""
    model: type[BaseModel] | None = ExperimentSpec
    node = data
    for part in path:
        if model is None:
            return None
        node = node[part] if isinstance(node, (dict, list)) and _has(node, part) else None  # type: ignore[index]
        if isinstance(part, int):
            continue
        fields = {(f.alias or name): f for name, f in model.model_fields.items()}
        if part not in fields:
            return None
        model = _union_member(fields[part].annotation, node) or _find_model(fields[part].annotation)
    return model


def _has(node: Any, part: Any) -> bool:
    if isinstance(node, dict):
        return part in node
    return isinstance(part, int) and 0 <= part < len(node)


def _union_member(annotation: Any, node: Any) -> type[BaseModel] | None:
    """The member of a discriminated union of sections that `node` (a mapping) selects."""
    if not isinstance(node, dict):
        return None
    for arg in _models_in(annotation):
        for key in ("model_type", "name"):
            field = arg.model_fields.get(key)
            if field is not None and node.get(key) in typing.get_args(field.annotation):
                return arg
    return None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _find_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _find_model(arg)
        if found is not None:
            return found
    return None


def _field_names(path: PathKey, data: Any = None) -> list[str]:
    model = _model_at(path, data)
    if model is None:
        return []
    return [(f.alias or name) for name, f in model.model_fields.items()]


def tokenizer_file_vocab(path: Path) -> int | None:
    """Token ids a `tokenizer.json` can produce (largest id + 1 over the model's vocabulary and
    the added tokens); None when the file is absent or not a tokenizer. Plain JSON: no torch."""
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    model: dict[str, Any] = data["model"] if isinstance(data.get("model"), dict) else {}
    vocab = model.get("vocab")
    ids: list[int] = []
    if isinstance(vocab, dict):
        ids += [v for v in vocab.values() if isinstance(v, int)]
    elif isinstance(vocab, list):  # unigram: [[piece, score], ...]
        ids.append(len(vocab) - 1)
    ids += [t["id"] for t in data.get("added_tokens") or [] if isinstance(t, dict) and isinstance(t.get("id"), int)]
    return max(ids) + 1 if ids else None


def _data_paths(data: dict[str, Any]) -> list[tuple[PathKey, Any]]:
    """Every field that names a file or directory on disk."""
    found: list[tuple[PathKey, Any]] = []
    section = data.get("data")
    if isinstance(section, dict):
        sources = section.get("sources")
        if isinstance(sources, list):
            for i, source in enumerate(sources):
                if isinstance(source, dict) and "path" in source:
                    found.append((("data", "sources", i, "path"), source["path"]))
        tokenizer = section.get("tokenizer")
        if isinstance(tokenizer, dict) and tokenizer.get("path") is not None:
            found.append((("data", "tokenizer", "path"), tokenizer["path"]))
    evaluation = data.get("eval")
    tasks = evaluation.get("tasks") if isinstance(evaluation, dict) else None
    for i, task in enumerate(tasks if isinstance(tasks, list) else []):
        if isinstance(task, dict) and task.get("path") is not None:
            found.append((("eval", "tasks", i, "path"), task["path"]))
    model = data.get("model")
    if isinstance(model, dict) and model.get("init_from") is not None:
        found.append((("model", "init_from"), model["init_from"]))
    return found


def check_data_path(value: str, repo_root: Path, roots: list[Path]) -> str | None:
    """Why `value` may not be used as a data path, or None when it stays inside a data root."""
    if not value.strip():
        return "must not be empty"
    if _CONTROL_CHARS.search(value):
        return "contains control characters"
    if "\\" in value:
        return "use / as the path separator"
    parts = value.split("/")
    if ".." in parts:
        return "must not contain '..'; give a path inside a data root"
    prefix_parts: list[str] = []
    for part in parts:
        if _GLOB_CHARS.search(part):
            break
        prefix_parts.append(part)
    prefix = "/".join(prefix_parts) or "."
    shown = ", ".join(display_path(r) for r in roots)
    if os.path.isabs(value):
        candidate = Path(os.path.realpath(prefix or "/"))
        extra = roots[1:]
        if not any(candidate.is_relative_to(r) for r in extra):
            return f"absolute path outside the data roots ({shown}); use a path relative to the repository"
        return None
    candidate = Path(os.path.realpath(repo_root / prefix))
    if not any(candidate == r or candidate.is_relative_to(r) for r in roots):
        return f"must be inside a data root ({shown}; more via ${DATA_ROOTS_ENV}), e.g. data/demo/code.jsonl"
    return None
