"""Load `experiments/<name>.yaml` into one frozen `ExperimentSpec`, reporting every problem at once.

`load_spec`, `check_spec` and `load_located` run the steps: the file and its `extends`
chain (`validation.extends`, over the hardened reader `validation.yaml_source`), the
models, the cross-field rules (`validation.rules`), and the rules that need the file name,
the repository or the file system, which live here (the name matches the file, data paths
stay inside the data roots, the baseline exists, ...). Every issue becomes one
`path:line:col: field: message` line (`validation.error_locations`) in a single `SpecError`.
"""

from __future__ import annotations

import contextvars
import json
import os
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from basics.errors import Issue, PipelineError, SpecError
from basics.paths import (
    DATA_ROOTS_ENV,
    EXPERIMENTS_DIR,
    data_roots,
    experiment_file,
    experiment_names,
    find_repo_root,
)
from models._hf import HFCausalLM
from validation import rules
from validation.error_locations import SpecIssues, did_you_mean
from validation.eval_tasks import task_problems
from validation.extends import read_chain
from validation.spec import CHAMPION, ExperimentSpec, foreign_plugins_active
from validation.yaml_source import (
    CONTROL_CHARS,
    YAML_FIELD,
    Loc,
    LocatedDoc,
    PathKey,
    display_path,
    parse_dotted,
)

_GLOB_CHARS = re.compile(r"[*?\[]")


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
        loader.issues.add(loader.issues.top_display, 1, 1, YAML_FIELD, "document nested too deeply")
        spec = None
    doc = loader.doc or LocatedDoc({}, {})

    def locate(field_path: str) -> tuple[str, int, int]:
        where = loader.issues.locate(doc, parse_dotted(field_path))
        return where.file, where.line, where.col

    issues = loader.issues.sorted_issues()
    return LoadedSpec(None if issues else spec, issues, locate, tuple(doc.chain))


_COMPARING: contextvars.ContextVar[bool] = contextvars.ContextVar("_COMPARING", default=False)
"""Set while a baseline file is loaded for `check_metric_comparable` (it does not look further)."""


# --------------------------------------------------------------------------- loading


class _SpecLoader:
    """One `check_spec` call: reads the chain, validates, collects issues."""

    def __init__(self, path: Path, repo_root: Path | None):
        self.top = path
        self.issues = SpecIssues(path)
        self.repo_root = (repo_root or find_repo_root(path)).resolve()
        self.doc: LocatedDoc | None = None

    # -- the steps

    def run(self) -> ExperimentSpec | None:
        doc = read_chain(self.top, self.repo_root, self.issues.add)
        if doc is None:
            return None
        self.doc = doc
        self.check_file_rules(doc)
        try:
            spec = ExperimentSpec.model_validate(doc.data)
        except ValidationError as exc:
            self.issues.map_validation_errors(doc, exc)
            return None
        for violation in rules.check(spec):
            self.issues.add_at(doc, violation.path, violation.message)
        self.check_local_tokenizer(doc, spec)
        self.check_init_from(doc, spec)
        self.check_metric_comparable(doc, spec)
        return spec

    def check_metric_comparable(self, doc: LocatedDoc, spec: ExperimentSpec) -> None:
        """`rules.metric_comparable` against the baseline experiment's file: the one check that
        reads a second spec (found by the one lookup rule, in this file's repository). The
        baseline's own rules do not look further; a baseline that does not load is reported by
        its own validation, not here."""
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
            self.issues.add_at(doc, violation.path, violation.message)

    def check_init_from(self, doc: LocatedDoc, spec: ExperimentSpec) -> None:
        """A Hugging Face checkpoint's `config.json` must describe the model the spec builds
        (`init_from_problems` of the architecture: plain JSON, no torch); each disagreeing field
        is reported on its own line. A directory that does not exist yet is the trainer's to check."""
        path = spec.model.init_from
        if path is None or ("model", "init_from") in doc.poisoned or not isinstance(spec.model, HFCausalLM):
            return
        directory = Path(path) if os.path.isabs(path) else self.repo_root / path
        for field, why in spec.model.init_from_problems(directory):
            self.issues.add_at(doc, ("model", field), f"init_from {path}: {why}")

    def check_local_tokenizer(self, doc: LocatedDoc, spec: ExperimentSpec) -> None:
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
            self.issues.add_at(doc, path, f"{tok.path}/tokenizer.json has {size:,} tokens but model.vocab_size is "
                                          f"{spec.model.vocab_size:,}: raise model.vocab_size to at least {size}")

    # -- file-level rules (need the file name, the repo, the file system)

    def check_file_rules(self, doc: LocatedDoc) -> None:
        data, stem = doc.data, self.top.stem
        name = data.get("name")
        if isinstance(name, str) and name != stem:
            self.issues.add_at(doc, ("name",), f"'{name}' must equal the file name '{stem}'")

        # Each experiment states its own claim; inheriting the base's would test nothing new.
        statement_loc = doc.locs.get(("hypothesis", "statement"))
        if statement_loc is not None and statement_loc.file != self.issues.top_display:
            section_loc = doc.locs.get(("hypothesis",))
            where = (
                section_loc
                if section_loc and section_loc.file == self.issues.top_display
                else Loc(self.issues.top_display, 1, 1)
            )
            self.issues.add(
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
                self.issues.add_at(doc, path, problem)
                doc.poisoned.add(path)

        evaluation = data.get("eval")
        if isinstance(evaluation, dict) and isinstance(evaluation.get("tasks"), list):
            for path, problem in task_problems(evaluation["tasks"], self.repo_root):
                # The trusted re-validation of a PR holds only its experiments/ (as data): a task
                # file is PR content the unprivileged check validated; its absence here is expected.
                if path not in doc.poisoned and not (foreign_plugins_active() and problem.startswith("no task file")):
                    self.issues.add_at(doc, path, problem)

        hypothesis = data.get("hypothesis")
        baseline = hypothesis.get("baseline") if isinstance(hypothesis, dict) else None
        if (
            isinstance(baseline, str)
            and baseline not in (CHAMPION, name, stem)
            and re.fullmatch(r"[a-z0-9][a-z0-9_-]{2,63}", baseline)
            and (self.repo_root / EXPERIMENTS_DIR).is_dir()
            and experiment_file(self.repo_root, baseline) is None
        ):
            hint = did_you_mean(baseline, experiment_names(self.repo_root))
            self.issues.add_at(
                doc,
                ("hypothesis", "baseline"),
                f"no experiment '{baseline}' in {EXPERIMENTS_DIR}/ (the name of another experiment file, or "
                f"`champion`){hint}",
            )


# --------------------------------------------------------------------------- helpers


def tokenizer_file_vocab(path: Path) -> int | None:
    """Token ids a `tokenizer.json` can produce (largest id + 1 over the model's vocabulary and
    the added tokens); None when the file is absent or not a tokenizer. Plain JSON: no torch."""
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
    if CONTROL_CHARS.search(value):
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
