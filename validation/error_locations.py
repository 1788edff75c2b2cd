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

from basics.errors import Issue
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
            for e in exc.errors(include_url=False)
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
                value = _get(doc.data, path)
                words = [w for o in options for w in re.findall(r"'([^']*)'", o)]
                hint = did_you_mean(value, words) if isinstance(value, str) else ""
                self.add_at(doc, path, "must be " + " or ".join(options) + _got(errors[0][0]) + hint)
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
            key = str(path[-1])
            hint = did_you_mean(key, allowed)
            if not hint and SYNONYMS.get(key) in allowed:
                hint = f"; did you mean '{SYNONYMS[key]}'?"
            if not hint and allowed:
                where = dotted(path[:-1]) if path[:-1] else "the top level"
                hint = (f"; {where} takes {', '.join(allowed)}" if len(allowed) <= 16
                        else f"; the keys of {where} are in experiments/schema.json (editor completion)")
            self.add_at(doc, path, f"unknown key '{key}'{hint}", at_key=True)
            return
        if kind in ("union_tag_invalid", "union_tag_not_found"):
            self._map_tag_error(doc, path, error)
            return
        if kind == PLUGIN_BROKEN:
            self._map_broken_plugin(doc, path)
            return
        message = _plain_message(error)
        value = _get(doc.data, path)
        if kind != "value_error":
            self.add_at(doc, path, describe_error(error, path, doc.data))
            return
        if isinstance(value, dict):
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
        self.add_at(doc, path, message)


SYNONYMS = {
    "learning_rate": "lr", "steps": "max_steps", "num_steps": "max_steps", "max_iters": "max_steps",
    "train_steps": "max_steps", "batch_size": "micro_batch_size", "warmup": "warmup_steps",
    "n_layers": "num_layers", "n_layer": "num_layers", "layers": "num_layers", "n_heads": "num_heads",
    "n_head": "num_heads", "d_model": "hidden_size", "n_embd": "hidden_size", "dim": "hidden_size",
    "seq_length": "seq_len", "max_seq_len": "seq_len", "context_length": "seq_len", "block_size": "seq_len",
    "gradient_accumulation_steps": "grad_accum_steps", "clip_grad_norm": "grad_clip", "max_grad_norm": "grad_clip",
}
"""Names other trainers give a field (nanoGPT, Hugging Face, torchtitan): did-you-mean where
spelling is no guide (`learning_rate` is not close to `lr`)."""


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


# --------------------------------------------------------------------------- pydantic's words -> ours

_PERCENT = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*%\s*$")
_WHOLE = ("int_parsing", "int_type", "int_from_float", "int_parsing_size")
_NUMBER = ("float_parsing", "float_type", "decimal_parsing", "decimal_type")
_BOUND = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")
_FORMS: dict[str, str] = {
    "name": "a lowercase name of 3 to 64 characters (a-z, 0-9, '-', '_'; starting with a letter or digit), "
            "the file name without .yaml, e.g. higher-lr",
    "hypothesis.baseline": "the name of another experiment (a lowercase name of 3 to 64 characters: a-z, 0-9, "
                           "'-', '_', e.g. base) or `champion`",
    "owner": "a GitHub user or team name (letters, digits and '-', at most 39 characters), e.g. octocat",
    "data.sources.name": "a lowercase name of 1 to 32 characters (a-z, 0-9, '-', '_'; starting with a letter "
                         "or digit), e.g. code",
    "resource.gpu_type": "a lowercase accelerator name (a-z, 0-9, '-', '_'; at most 32 characters), e.g. h100",
    "resource.partition": "a Slurm partition name (letters, digits, '.', '-', '_'; at most 64 characters), e.g. gpu",
    "resource.rendezvous": "host:port of node 0 (letters, digits, '.', '-', '_', then ':' and a port), "
                           "e.g. node-0.cluster:29500",
    "eval.tasks.name": "an lm-eval task name (letters, digits, '.', '-', '_'; at most 64 characters), e.g. hellaswag",
}
"""What a field with a `pattern` looks like, said in words with an example: the regex itself
(250 characters for a metric) is no help to the person who mistyped it."""


def describe_error(error: ErrorDetails, path: PathKey | None, data: Any = None) -> str:
    """One pydantic error on the field at `path` in the project's words: what the field takes
    (its type and valid range, its allowed values or its form, with an example), then what was
    given. `data` is the validated document (it names the sources and tasks a metric may refer
    to); `path` None means the error's own `loc`, without pydantic's union-member tags."""
    if path is None:
        path = _resolve_error_path(data, error)[0]
    kind = error["type"]
    ctx: dict[str, Any] = dict(error.get("ctx") or {})
    value = error.get("input")
    field = _field_at(path, data)
    got = _got(error)
    if kind in _WHOLE or kind in _NUMBER or kind in _BOUND:
        whole = kind in _WHOLE or _is_int_field(field, value)
        what = "a whole number" if whole else "a number"
        text = f"must be {what}{_range_words(field, ctx)}{got}"
        match = _PERCENT.match(value) if isinstance(value, str) else None
        if match and not whole:
            text += f"; write a percentage as a fraction: {float(match[1]) / 100:g} for {match[1]}%"
        return text
    if kind in ("bool_parsing", "bool_type"):
        return f"must be true or false{got}"
    if kind == "string_type":
        return f"must be text (quote it if it looks like a number or a date){got}"
    if kind in ("literal_error", "enum"):
        expected = str(ctx.get("expected") or "")
        options = re.findall(r"'([^']*)'", expected)
        hint = did_you_mean(str(value), options) if isinstance(value, str) else ""
        return f"must be {expected or 'one of the listed values'}{got}{hint}"
    if kind == "string_too_short":
        words = _description(field)
        return (f"must be at least {ctx.get('min_length')} characters, got {short(value)} "
                f"({len(value) if isinstance(value, str) else '?'})" + (f"; {words}" if words else ""))
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters, got {len(value) if isinstance(value, str) else '?'}"
    if kind == "too_short":
        n = ctx.get("min_length")
        return f"must list at least {n} item{'s' if n != 1 else ''}, got {ctx.get('actual_length', 0)}"
    if kind == "too_long":
        return f"must list at most {ctx.get('max_length')} items, got {ctx.get('actual_length')}"
    if kind == "string_pattern_mismatch":
        where = ".".join(str(p) for p in path if not isinstance(p, int))
        if path and path[-1] == "metric":
            return metric_message(str(value), data)
        form = _FORMS.get(where)
        if form is None:  # a pattern without words yet: short enough to show, or not shown at all
            pattern = str(ctx.get("pattern", ""))
            form = f"of the form {pattern}" if len(pattern) <= 40 else "of the expected form"
        return f"must be {form}{got}"
    return _plain_message(error).replace("Input should be ", "must be ") + got


def metric_message(metric: str, data: Any = None) -> str:
    """A metric name that is not one the trainer logs: the closest one this spec has, then what a
    metric name looks like (the sources and tasks of `data`, the experiment's document, named)."""
    named_sources = [s.get("name") for s in _get(data, ("data", "sources")) or [] if isinstance(s, dict)]
    sources: list[str] = [s for s in named_sources if isinstance(s, str)]
    named_tasks = [t.get("name") or (Path(str(t.get("path"))).stem if t.get("path") else None)
                   for t in _get(data, ("eval", "tasks")) or [] if isinstance(t, dict)]
    tasks: list[str] = [t for t in named_tasks if isinstance(t, str)]
    known = ["eval/loss", "eval/bpb", "train/loss", "perf/tokens_per_s", "perf/mfu", "perf/peak_mem_gb"]
    known += [f"eval/{s}/{m}" for s in sources for m in ("loss", "bpb")]
    known += [f"eval/task/{t}/acc" for t in tasks]
    close = difflib.get_close_matches(metric, known, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'? " if close else ". "
    named = f" (one of data.sources: {', '.join(sources)})" if sources else " (a name in data.sources)"
    example = f" (e.g. eval/task/{tasks[0]}/acc)" if tasks else ""
    return (f"{short(metric)} is not a metric the trainer logs{hint}A metric is eval/loss or eval/bpb "
            f"(held-out, all sources), eval/<source>/loss or eval/<source>/bpb{named}, train/loss, "
            f"perf/tokens_per_s, perf/mfu, perf/peak_mem_gb, or eval/task/<task>/<measure> of a task in "
            f"eval.tasks{example}")


def _field_at(path: PathKey, data: Any) -> Any:
    """The pydantic `FieldInfo` of the field at `path` (list indices skipped), or None."""
    names = [p for p in path if not isinstance(p, int)]
    if not names:
        return None
    cut = max(i for i, p in enumerate(path) if not isinstance(p, int))
    model = _model_at(path[:cut], data)
    if model is None:
        return None
    fields = {(f.alias or name): f for name, f in model.model_fields.items()}
    return fields.get(str(path[cut]))


def _constraints(field: Any) -> list[Any]:
    """The annotated-types constraints of a field, also inside `Annotated[...] | None`."""
    if field is None:
        return []
    found = list(field.metadata)
    stack = [field.annotation]
    while stack:
        annotation = stack.pop()
        if typing.get_origin(annotation) is typing.Annotated:
            for meta in typing.get_args(annotation)[1:]:
                found += list(getattr(meta, "metadata", [meta]))
        stack += [a for a in typing.get_args(annotation) if typing.get_origin(annotation) is not typing.Annotated]
    return found


def _is_int_field(field: Any, value: Any) -> bool:
    if field is None:
        return isinstance(value, int) and not isinstance(value, bool)
    annotation = field.annotation
    args = {annotation, *typing.get_args(annotation)}
    for arg in list(args):
        if typing.get_origin(arg) is typing.Annotated:
            args.add(typing.get_args(arg)[0])
    return int in args and float not in args


def _range_words(field: Any, ctx: dict[str, Any]) -> str:
    """' from 8 to 65536', ' above 0 and at most 0.5', ...: every bound of the field (the error's
    context alone names only the bound that was crossed)."""
    bounds = {key: ctx[key] for key in ("gt", "ge", "lt", "le") if key in ctx}
    for meta in _constraints(field):
        for key in ("gt", "ge", "lt", "le"):
            if getattr(meta, key, None) is not None:
                bounds.setdefault(key, getattr(meta, key))
    low = f"above {_num(bounds['gt'])}" if "gt" in bounds else f"at least {_num(bounds['ge'])}" if "ge" in bounds else ""
    high = f"below {_num(bounds['lt'])}" if "lt" in bounds else f"at most {_num(bounds['le'])}" if "le" in bounds else ""
    if "ge" in bounds and "le" in bounds:
        return f" from {_num(bounds['ge'])} to {_num(bounds['le'])}"
    return " " + " and ".join(p for p in (low, high) if p) if low or high else ""


def _num(x: Any) -> str:
    """A bound as a person writes it: 10,000,000 rather than 1e+07, 0.5 as 0.5."""
    if isinstance(x, int | float) and float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}" if abs(x) >= 10_000 else str(int(x))
    return f"{x:g}" if isinstance(x, float) else str(x)


def _description(field: Any) -> str:
    """The field's docstring (its first sentence, lower-cased start) when short enough to quote."""
    text = " ".join(str(getattr(field, "description", "") or "").split())
    first = text.split(". ")[0].rstrip(".")
    return first[:1].lower() + first[1:] if first and len(first) <= 100 else ""
