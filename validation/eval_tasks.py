"""Downstream evaluation: lm-evaluation-harness tasks in the spec (`eval.tasks`), checked torch-free.

An experiment lists tasks; after training, the trainer scores the exported model on each
(`trainer.lm_eval_scoring`) and every task metric becomes `eval/task/<task>/<metric>` (with
`<metric>_stderr` and `n` beside it), valid as `hypothesis.metric`.

A task is either the name of a task the installed lm-eval ships (its data must be available
locally: nothing here reaches a hub) or `path:` to a local task YAML inside a data root. This
module never imports lm-eval or torch: a task name is looked up in the YAML files of the
installed lm-eval package, read as text; a local task file is read with a YAML loader that
keeps `!function` tags as text (never runs them).

Trust: a task YAML can run Python (`!function utils.process_docs`). A task file a pull request
brings is PR code, like a model file: it runs in the unprivileged check and, after `/train` of
that exact SHA, in the training job; a privileged job never loads it (it only reads the metrics
the run recorded).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

TASK_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
TASK_METRIC_PATTERN = r"eval/task/[A-Za-z0-9][A-Za-z0-9_.-]{0,63}/[a-z][a-z0-9_]{0,31}"
"""`eval/task/<task>/<metric>`: part of `validation.spec.METRIC_PATTERN`."""
TASK_METRIC = re.compile(r"^eval/task/(?P<task>[A-Za-z0-9][A-Za-z0-9_.-]{0,63})/(?P<metric>[a-z][a-z0-9_]{0,31})$")
HIGHER_IS_BETTER = {"acc", "acc_norm", "exact_match", "f1", "mcc", "bleu", "rouge1", "rouge2", "rougeL", "em"}
"""Metrics of lm-eval's stock tasks where higher is better (the rest of its metrics, perplexities
and bits per byte, are better lower)."""
LOWER_IS_BETTER = {"perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte", "ter"}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class EvalTask(_Section):
    """One lm-eval task: a name lm-eval ships, or a local task YAML."""

    name: Annotated[str, Field(pattern=TASK_NAME_PATTERN)] | None = None
    """Task name (`hellaswag`, ...); for a local file, defaults to the file's `task:`."""
    path: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    """A local task YAML (e.g. `data/demo/tasks/next_line/next_line.yaml`) inside a data root; its
    `dataset_path: json` with `data_files` next to it (no download)."""
    limit: Annotated[int, Field(ge=1, le=100_000)] = 200
    """Examples scored (the first `limit` of the split): the example budget."""
    num_fewshot: Annotated[int, Field(ge=0, le=32)] = 0
    """Few-shot examples in each prompt."""

    @model_validator(mode="after")
    def _name_or_path(self) -> EvalTask:
        if self.name is None and self.path is None:
            raise ValueError("give the task's `name` (a task lm-eval ships) or `path` (a local task YAML)")
        return self


class EvalSpec(_Section):
    """Downstream tasks scored on the final model (lm-evaluation-harness)."""

    tasks: Annotated[list[EvalTask], Field(min_length=1, max_length=32)]
    """The tasks; their metrics are `eval/task/<task>/<metric>`."""
    time_budget_s: Annotated[float, Field(gt=0.0, le=86_400.0)] = 600.0
    """Wall-clock budget of the whole downstream evaluation; a task still running past it is
    stopped and reported as failed (the training result is kept)."""
    batch_size: Annotated[int, Field(ge=1, le=4096)] = 16
    """Requests per forward pass."""
    max_gen_tokens: Annotated[int, Field(ge=1, le=4096)] = 64
    """Upper bound on greedily generated tokens per request (generation tasks)."""

    @model_validator(mode="after")
    def _unique(self) -> EvalSpec:
        names = [task_name(t) for t in self.tasks]
        dupes = sorted({n for n in names if n and names.count(n) > 1})
        if dupes:
            raise ValueError(f"tasks must be unique; repeated: {', '.join(dupes)}")
        return self

    def examples(self) -> int:
        """The example budget: every task's limit (shown in the plan)."""
        return sum(t.limit for t in self.tasks)


# --------------------------------------------------------------------------- task files


class _KeepTags(yaml.SafeLoader):
    """Reads a task YAML without running it: `!function x.y` stays the string 'x.y'."""


_KeepTags.add_multi_constructor("!", lambda loader, suffix, node: loader.construct_scalar(node)
                                if isinstance(node, yaml.ScalarNode) else None)


def read_task_file(path: Path) -> dict[str, Any]:
    """A task YAML as data (tags kept as text). Raises OSError or ValueError."""
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_KeepTags)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ValueError(f"is not valid YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(data, dict):
        raise ValueError("is not a task YAML (a mapping with `task:`)")
    return data


def task_name(task: EvalTask, repo_root: Path | None = None) -> str | None:
    """The task's name: `name`, else the `task:` of its file (None when unreadable)."""
    if task.name is not None:
        return task.name
    if repo_root is None or task.path is None:
        return Path(task.path or "").stem or None
    try:
        value = read_task_file(Path(repo_root) / task.path).get("task")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, str) else None


@functools.cache
def shipped_task_names() -> frozenset[str] | None:
    """Task names of the installed lm-eval, read from its task YAMLs as text (no import);
    None when lm-eval is not installed (then names are checked by the trainer)."""
    found = importlib.util.find_spec("lm_eval")
    if found is None or not found.submodule_search_locations:
        return None
    names: set[str] = set()
    pattern = re.compile(r"^(?:task|group|tag):\s*['\"]?([A-Za-z0-9][A-Za-z0-9_.-]*)", re.MULTILINE)
    for root in found.submodule_search_locations:
        for file in Path(root, "tasks").rglob("*.yaml"):
            try:
                names.update(pattern.findall(file.read_text(encoding="utf-8", errors="replace")))
            except OSError:
                continue
    return frozenset(names)


def task_problems(tasks: list[Any], repo_root: Path) -> list[tuple[tuple[str | int, ...], str]]:
    """(spec path, problem) for every task entry (raw YAML data) whose name or file is wrong.

    Data-root containment of `path` is the loader's data-path rule; this checks the rest. The
    task's data files may be generated later (the demo task's are made by `pipeline data demo`,
    after the PR check validates): the trainer checks them before it evaluates."""
    # The trusted re-validation of a PR (`validation.spec.foreign_plugins_allowed`) reads the PR's
    # spec as data with the default branch's files: the loader drops "no task file" there (a task
    # file the PR adds is not present, and its checks ran in the PR's own check). Not asked here:
    # validation.spec imports this module.
    problems: list[tuple[tuple[str | int, ...], str]] = []
    shipped: frozenset[str] | None = None
    for i, task in enumerate(tasks):
        if not isinstance(task, dict):
            continue
        path, name = task.get("path"), task.get("name")
        if isinstance(path, str) and path.strip():
            file = Path(repo_root) / path
            if not file.is_file():
                problems.append((("eval", "tasks", i, "path"), f"no task file {path}"))
                continue
            try:
                data = read_task_file(file)
            except (OSError, ValueError) as exc:
                problems.append((("eval", "tasks", i, "path"), f"{path} {exc}"))
                continue
            own = data.get("task")
            if not isinstance(own, str) or not re.fullmatch(TASK_NAME_PATTERN, own):
                problems.append((("eval", "tasks", i, "path"), f"{path} has no valid `task:` name"))
            elif isinstance(name, str) and name != own:
                problems.append((("eval", "tasks", i, "name"), f"'{name}' differs from the file's task '{own}'"))
            elif name is None and own != file.stem:
                # Rules see no files: without `name`, a task is known by its file's stem.
                problems.append((("eval", "tasks", i, "path"), f"{path} defines task '{own}': name the file "
                                                               f"{own}.yaml or add `name: {own}`"))
        elif isinstance(name, str):
            shipped = shipped if shipped is not None else shipped_task_names()
            if shipped is not None and name not in shipped:
                close = difflib.get_close_matches(name, sorted(shipped), n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                problems.append((("eval", "tasks", i, "name"),
                                 f"unknown lm-eval task '{name}'{hint} (or give `path:` to a local task YAML)"))
    return problems


def better_direction(metric: str) -> str | None:
    """'increase' or 'decrease': which way a task metric is better (None: not a task metric)."""
    match = TASK_METRIC.match(metric)
    if not match:
        return None
    return "decrease" if match["metric"] in LOWER_IS_BETTER else "increase"
