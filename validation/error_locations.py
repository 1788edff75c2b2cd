"""Problems with a spec field -> `path:line:col: field: message` issues at the YAML node that set it.

`SpecIssues` collects the issues of one load. A problem named by its field path (a
cross-field rule, a file rule) is placed at that field's node in the file that set it, or
at the nearest ancestor the files set; pydantic errors are mapped back from their `loc`,
with did-you-mean suggestions for misspelt keys and unknown plug-in names.
"""

from __future__ import annotations

import difflib
import re
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from validation.errors import Issue
from validation.spec import (
    ARCHITECTURES,
    BROKEN_ARCHITECTURES,
    BROKEN_OPTIMIZERS,
    OPTIMIZERS,
    PLUGIN_BROKEN,
    ExperimentSpec,
)
from validation.yaml_source import CONTROL_CHARS, Loc, LocatedDoc, PathKey, display_path, dotted, short


class SpecIssues:
    """The issues of one spec load, each at the node of the field to change."""

    def __init__(self, top: Path):
        self.top = top
        self.top_display = display_path(top)
        self.issues: list[Issue] = []

    def add(self, file: str, line: int, col: int, field_name: str, message: str) -> None:
        self.issues.append(Issue(file, max(line, 1), max(col, 1), _clean(field_name), _clean(message)))

    def add_at(
        self,
        doc: LocatedDoc,
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

    def locate(self, doc: LocatedDoc, path: PathKey) -> Loc:
        """The node for `path`, or its nearest ancestor that the files set (missing fields, defaults)."""
        for cut in range(len(path), 0, -1):
            if path[:cut] in doc.locs:
                return doc.locs[path[:cut]]
        return Loc(self.top_display, 1, 1)

    def sorted_issues(self) -> list[Issue]:
        unique = list(dict.fromkeys(self.issues))
        return sorted(unique, key=lambda i: (i.file != self.top_display, i.file, i.line, i.col, i.field))

    # -- pydantic errors -> issues

    def map_validation_errors(self, doc: LocatedDoc, exc: ValidationError) -> None:
        grouped: dict[PathKey, list[tuple[ErrorDetails, bool]]] = {}
        resolved = [
            (e, *_resolve_error_path(doc.data, e))
            for e in exc.errors(include_url=False, include_context=False)
        ]
        # For a union (`parallel: auto | {dp, tp, ...}`), when one branch got further into
        # the value, the shallow "should be 'auto'" complaint of the other is noise.
        deep_unions = {path[:n] for _, path, union in resolved if union for n in range(len(path))}
        for error, path, through_union in resolved:
            if self._poisoned(doc, path):
                continue  # already reported by the YAML walker
            if through_union and path in deep_unions and isinstance(_get(doc.data, path), dict):
                continue
            grouped.setdefault(path, []).append((error, through_union))
        # A misspelt key already says "did you mean 'x'": don't also report 'x' as missing.
        suggested = {
            (*path[:-1], match)
            for path, errors in grouped.items()
            if errors[0][0]["type"] == "extra_forbidden"
            for match in difflib.get_close_matches(
                str(path[-1]), _field_names(path[:-1], doc.data), n=1, cutoff=0.6
            )
        }
        for path, errors in grouped.items():
            if path in suggested and all(e["type"] == "missing" for e, _ in errors):
                continue
            if len(errors) > 1 and all(union for _, union in errors):
                options = list(dict.fromkeys(_alternative(e) for e, _ in errors))
                self.add_at(doc, path, "must be " + " or ".join(options) + _got(errors[0][0]))
                continue
            for error, _ in errors:
                self._map_one_error(doc, path, error)

    def _map_tag_error(self, doc: LocatedDoc, path: PathKey, error: ErrorDetails) -> None:
        """An unknown (or absent) plug-in name: point at the key that names it and list the
        files that exist (an architecture is models/<name>.py, an optimizer
        models/optimizers/<name>.py)."""
        ctx = error.get("ctx") or {}
        key = "name" if path and path[-1] == "optimizer" else "model_type"
        where = "models/optimizers" if key == "name" else "models"
        known = ", ".join(sorted(ARCHITECTURES if key == "model_type" else OPTIMIZERS))
        if error["type"] == "union_tag_not_found":
            self.add_at(
                doc, path, f"required field '{key}' is missing (one of: {known})", field_path=(*path, key)
            )
            return
        value = ctx.get("tag") or _get(doc.data, (*path, key))
        self.add_at(doc, (*path, key), f"unknown {key} '{value!s}': no {where}/{value}.py; one of: {known}")

    def _map_broken_plugin(self, doc: LocatedDoc, path: PathKey) -> None:
        """The selected plug-in file does not load: the issue is at that file's line (a PR
        annotation on the plug-in), naming the experiment line that selects it."""
        key = "name" if path and path[-1] == "optimizer" else "model_type"
        value = _get(doc.data, (*path, key))
        error = (BROKEN_OPTIMIZERS if key == "name" else BROKEN_ARCHITECTURES).get(str(value))
        at = self.locate(doc, (*path, key))
        if error is None:  # not expected: the union only fails this way for a known broken file
            self.add(at.file, at.line, at.col, dotted((*path, key)), f"{key} '{value}' does not load")
            return
        self.add(error.file, error.line or 1, 1, dotted((*path, key)),
                 f"{error.reason} ({key} '{value}' selected by {at.file}:{at.line})")

    @staticmethod
    def _poisoned(doc: LocatedDoc, path: PathKey) -> bool:
        return any(path[: len(bad)] == bad for bad in doc.poisoned)

    def _map_one_error(self, doc: LocatedDoc, path: PathKey, error: ErrorDetails) -> None:
        kind = error["type"]
        if kind == "missing":
            hint = f"; set `name: {self.top.stem}` (the file name)" if path == ("name",) else ""
            self.add_at(doc, path[:-1], f"required field '{path[-1]}' is missing{hint}", field_path=path)
            return
        if kind == "extra_forbidden":
            allowed = _field_names(path[:-1], doc.data)
            hint = did_you_mean(str(path[-1]), allowed)
            self.add_at(doc, path, f"unknown key '{path[-1]}'{hint}", at_key=True)
            return
        if kind in ("union_tag_invalid", "union_tag_not_found"):
            self._map_tag_error(doc, path, error)
            return
        if kind == PLUGIN_BROKEN:
            self._map_broken_plugin(doc, path)
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
                if not self._poisoned(doc, target):
                    self.add_at(doc, target, message)
                return
        self.add_at(doc, path, message + _got(error))


def _clean(text: str) -> str:
    """One printable line: control characters and lone surrogates escaped."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return CONTROL_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def did_you_mean(word: str, candidates: list[str]) -> str:
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
    return f", got {short(value)}"


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
