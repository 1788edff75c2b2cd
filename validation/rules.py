"""Cross-field rules: what no single section can check on its own.

Each rule returns `Violation`s that name the field a person should change (not the
section that happened to notice), so the loader can point at that YAML line. Rules
run on a spec that already passed the models, so they trust their typed inputs.
All of them run; nothing stops at the first problem.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from validation.capability import TRAINER, ExecutionCapability
from validation.error_locations import describe_error
from validation.eval_tasks import TASK_METRIC, task_name
from validation.spec import ExperimentSpec, ParallelLayout

WEIGHT_TOLERANCE = 1e-6
_SOURCE_METRIC = re.compile(r"^eval/(?P<source>[a-z0-9][a-z0-9_-]{0,31})/(loss|bpb)$")


@dataclass(frozen=True)
class Violation:
    """A broken rule: the spec path of the field to change and what is wrong with it."""

    path: tuple[str | int, ...]
    message: str


Rule = Callable[[ExperimentSpec], Iterator[Violation]]


def check(spec: ExperimentSpec, capability: ExecutionCapability = TRAINER) -> list[Violation]:
    """Every violation of every rule, in rule order; layouts are held to `capability`."""
    return layout_violations(spec, capability) + [violation for rule in RULES for violation in rule(spec)]


# --------------------------------------------------------------------------- parallelism


def parallel_divides_model(spec: ExperimentSpec) -> Iterator[Violation]:
    """Tensor parallelism splits heads (within one node), pipeline parallelism splits layers:
    each must divide evenly. The one divisibility check; the planner reads it too."""
    if not isinstance(spec.parallel, ParallelLayout):
        return
    layout, model, res = spec.parallel, spec.model, spec.resource
    problem = model.tp_problem(layout.tp) if model.tensor_parallel_plan() else None  # no plan at all: layout_is_executable
    if problem:
        yield Violation(("parallel", "tp"), problem)
    if res.gpus_per_node and layout.tp > 1 and res.gpus_per_node % layout.tp:
        yield Violation(
            ("parallel", "tp"),
            f"tp={layout.tp} must divide resource.gpus_per_node ({res.gpus_per_node}): "
            "tensor parallelism stays inside one node",
        )
    yield from _pipeline_split(spec, layout)


def virtual_stages_per_rank(schedule: str) -> int:
    """Model chunks one pipeline rank holds under `parallel.pp_schedule`: 2 for interleaved 1F1B
    (stage k on rank k % pp; Narayanan et al. 2021), 1 for the others. The rule's one home: the
    layer split below, the plan's bubble and in-flight micro-batches, and the trainer's stages."""
    return 2 if schedule == "interleaved_1f1b" else 1


def _pipeline_split(spec: ExperimentSpec, layout: ParallelLayout) -> Iterator[Violation]:
    """pp stages (x `virtual_stages_per_rank`) cut the layers evenly or by `pp_split`;
    the schedule gets enough micro-batches (`train.grad_accum_steps`)."""
    layers, pp = spec.model.num_layers, layout.pp
    stages = pp * virtual_stages_per_rank(layout.pp_schedule)
    if layout.pp_split is not None:
        if len(layout.pp_split) != stages or sum(layout.pp_split) != layers:
            yield Violation(("parallel", "pp_split"),
                            f"pp_split {layout.pp_split} must give {stages} stages summing to model.num_layers "
                            f"({layers})")
    elif layers % stages:
        what = f"pp={pp}" if stages == pp else f"pp={pp} x {stages // pp} interleaved stages = {stages}"
        yield Violation(("parallel", "pp"), f"{what} must divide model.num_layers ({layers}), "
                                            "or give parallel.pp_split (layers per stage)")


def _pipeline_micro_batches(spec: ExperimentSpec, layout: ParallelLayout) -> Iterator[Violation]:
    """The trainer's schedules (torch.distributed.pipelining) need enough micro-batches (once the
    layers split: one problem at a time)."""
    pp, accum = layout.pp, spec.train.grad_accum_steps
    if any(True for _ in _pipeline_split(spec, layout)):
        return
    if pp > 1 and layout.pp_schedule != "gpipe" and accum < pp:
        yield Violation(("train", "grad_accum_steps"),
                        f"parallel.pp_schedule {layout.pp_schedule} with pp={pp} needs at least {pp} micro-batches "
                        f"(train.grad_accum_steps is {accum}); raise it or use pp_schedule: gpipe")
    elif pp > 1 and layout.pp_schedule == "interleaved_1f1b" and accum % pp:
        yield Violation(("train", "grad_accum_steps"),
                        f"parallel.pp_schedule interleaved_1f1b needs train.grad_accum_steps ({accum}) "
                        f"a multiple of pp={pp}")


def layout_matches_resources(spec: ExperimentSpec) -> Iterator[Violation]:
    """An explicit layout uses exactly the processes the resources provide."""
    if not isinstance(spec.parallel, ParallelLayout):
        return
    layout, res = spec.parallel, spec.resource
    product = layout.dp * layout.tp * layout.pp
    if product != res.world_size:
        per_node = (
            f"gpus_per_node={res.gpus_per_node}"
            if res.gpus_per_node
            else f"cpu_processes={res.cpu_processes}"
        )
        yield Violation(
            ("parallel", "dp"),
            f"dp*tp*pp = {layout.dp}*{layout.tp}*{layout.pp} = {product} must equal the world size "
            f"resource.nodes*{per_node} = {res.world_size}",
        )


def layout_is_executable(
    spec: ExperimentSpec, capability: ExecutionCapability = TRAINER
) -> Iterator[Violation]:
    """An explicit layout uses only axes the trainer executes (`validation.capability`)."""
    if not isinstance(spec.parallel, ParallelLayout):
        return
    for axis, message in capability.refusals(spec.parallel, on_gpu=spec.resource.gpus_per_node > 0):
        yield Violation(("parallel", axis), message)
    refused = False
    for axis, message in capability.model_refusals(spec.parallel, spec.model):
        refused = True
        yield Violation(("parallel", axis), message)
    if capability.pp_alone and not refused and not capability.refusals(spec.parallel, spec.resource.gpus_per_node > 0):
        yield from _pipeline_micro_batches(spec, spec.parallel)


def layout_violations(spec: ExperimentSpec, capability: ExecutionCapability = TRAINER) -> list[Violation]:
    """Every problem of an explicit layout: divisibility, world size, capability.

    An axis the capability refuses is reported once, with the refusal (which says what to
    change): how it would have to divide is moot while the trainer cannot run it at all."""
    refused = list(layout_is_executable(spec, capability))
    moot = {v.path for v in refused}
    divides = [v for v in parallel_divides_model(spec) if v.path not in moot]
    return [*divides, *layout_matches_resources(spec), *refused]


def global_batch_consistent(spec: ExperimentSpec) -> Iterator[Violation]:
    """A stated global batch is a promise: micro x accumulation x dp must keep it."""
    given = spec.train.global_batch_size
    if given is None:
        return
    dp = spec.parallel_layout().dp
    actual = spec.global_batch(dp)
    if actual != given:
        yield Violation(
            ("train", "global_batch_size"),
            f"{given} != micro_batch_size*grad_accum_steps*dp = "
            f"{spec.train.micro_batch_size}*{spec.train.grad_accum_steps}*{dp} = {actual}",
        )


# --------------------------------------------------------------------------- data and model


def mixture_weights(spec: ExperimentSpec) -> Iterator[Violation]:
    """The mixture is a distribution: weights sum to 1 and at least one source is used."""
    weights = spec.data.weights()
    total = math.fsum(weights.values())
    if abs(total - 1.0) > WEIGHT_TOLERANCE:
        listed = ", ".join(f"{name}={w:g}" for name, w in weights.items())
        yield Violation(("data", "sources"), f"mixture weights must sum to 1, got {total:.6g} ({listed})")
    elif not any(w > 0 for w in weights.values()):
        yield Violation(("data", "sources"), "at least one source needs a weight > 0")


def metrics_exist(spec: ExperimentSpec) -> Iterator[Violation]:
    """`eval/<source>/...` metrics only exist for sources in the mixture."""
    names = [s.name for s in spec.data.sources]
    metrics = {("hypothesis", "metric"): spec.hypothesis.metric}
    if spec.sweep is not None and spec.sweep.metric is not None:
        metrics[("sweep", "metric")] = spec.sweep.metric
    for path, metric in metrics.items():
        match = _SOURCE_METRIC.match(metric)
        if match and match["source"] not in names:
            close = difflib.get_close_matches(match["source"], names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            yield Violation(
                path,
                f"'{metric}' names source '{match['source']}', which is not in data.sources "
                f"({', '.join(names)}){hint}",
            )


def task_metrics_exist(spec: ExperimentSpec) -> Iterator[Violation]:
    """`eval/task/<task>/<metric>` only exists for a task in `eval.tasks`."""
    tasks = [n for n in (task_name(t) for t in spec.eval.tasks) if n] if spec.eval is not None else []
    metrics = {("hypothesis", "metric"): spec.hypothesis.metric}
    if spec.sweep is not None and spec.sweep.metric is not None:
        metrics[("sweep", "metric")] = spec.sweep.metric
    for path, metric in metrics.items():
        match = TASK_METRIC.match(metric)
        if not match:
            continue
        if match["metric"] == "n" or match["metric"].endswith("_stderr"):
            yield Violation(path, f"'{metric}' is a count or a standard error, not a task metric; use e.g. "
                                  f"eval/task/{match['task']}/acc")
        elif match["task"] not in tasks:
            close = difflib.get_close_matches(match["task"], tasks, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            listed = ", ".join(tasks) if tasks else "none: add the task under eval.tasks"
            yield Violation(path, f"'{metric}' names task '{match['task']}', which is not in eval.tasks "
                                  f"({listed}){hint}")
    selected = (spec.sweep.metric or spec.hypothesis.metric) if spec.sweep is not None else None
    if spec.sweep is not None and spec.sweep.prune and selected and TASK_METRIC.match(selected):
        yield Violation(("sweep", "prune"), f"'{selected}' is scored once, after training: successive halving "
                                            "has no intermediate values to prune on; set sweep.prune: false")


def metric_definition(spec: ExperimentSpec, metric: str) -> dict[str, Any]:
    """What an eval metric's value means besides the model, as far as a spec says it: how the
    held-out split is cut and packed and, for a per-token `loss`, the tokenizer. (Which text is
    held out is the data version, known after preparation: the report compares it.)"""
    task = TASK_METRIC.match(metric)
    if task:  # a task metric means its task entry: the same file or name, limit and few-shot count
        entries = [t for t in (spec.eval.tasks if spec.eval else []) if task_name(t) == task["task"]]
        return {f"eval.tasks[{task['task']}]": entries[0].model_dump(mode="json") if entries else None}
    out: dict[str, Any] = {"data.seq_len": spec.data.seq_len, "data.eval_fraction": spec.data.eval_fraction,
                           "data.min_doc_chars": spec.data.min_doc_chars, "train.eval_batches": spec.train.eval_batches}
    if metric.endswith("/loss"):
        out["data.tokenizer"] = spec.data.tokenizer.model_dump(mode="json")
    return out


def metric_comparable(spec: ExperimentSpec, baseline: ExperimentSpec) -> Iterator[Violation]:
    """A hypothesis on an eval metric whose definition differs from the baseline's compares
    two different numbers: nats per token of two tokenizers, or losses on two held-out sets."""
    metric = spec.hypothesis.metric
    if not metric.startswith("eval/"):
        return
    mine, theirs = metric_definition(spec, metric), metric_definition(baseline, metric)
    differing = [k for k in mine if mine[k] != theirs.get(k)]
    if not differing:
        return
    if differing[0].startswith("eval.tasks["):
        advice = f"give both experiments the same {differing[0]} entry (the baseline runs its own eval.tasks)"
    elif differing == ["data.tokenizer"]:
        advice = f"use `{metric.removesuffix('loss')}bpb` (bits per byte do not depend on the tokenizer)"
    else:
        held = [k for k in differing if k != "data.tokenizer"]
        advice = (f"keep the baseline's held-out settings ({', '.join(f'{k} {theirs[k]}' for k in held)})"
                  + (f" and use `{metric.removesuffix('loss')}bpb`" if "data.tokenizer" in differing else ""))
    yield Violation(("hypothesis", "metric"),
                    f"'{metric}' is defined differently here and in baseline '{baseline.name}' "
                    f"({', '.join(differing)} differ), so the two values are not comparable; {advice}")


def tokenizer_fits_model(spec: ExperimentSpec) -> Iterator[Violation]:
    """Token ids must have embedding rows; sequences must have positions."""
    tok = spec.data.tokenizer
    if tok.vocab_size > spec.model.vocab_size:
        yield Violation(
            ("data", "tokenizer", "vocab_size"),
            f"{tok.vocab_size} exceeds model.vocab_size ({spec.model.vocab_size})",
        )
    if spec.data.seq_len > spec.model.max_position_embeddings:
        yield Violation(
            ("data", "seq_len"),
            f"{spec.data.seq_len} exceeds model.max_position_embeddings ({spec.model.max_position_embeddings})",
        )
    if tok.kind == "local" and not tok.path:
        yield Violation(
            ("data", "tokenizer", "path"), "kind: local needs a path to a directory with tokenizer.json"
        )
    if tok.kind == "bpe" and tok.path:
        yield Violation(("data", "tokenizer", "path"), "path is only used with kind: local (bpe is trained)")


# --------------------------------------------------------------------------- hypothesis, train, resources


def baseline_is_another_experiment(spec: ExperimentSpec) -> Iterator[Violation]:
    if spec.hypothesis.baseline == spec.name:
        yield Violation(
            ("hypothesis", "baseline"),
            f"an experiment cannot be its own baseline ('{spec.name}'); name another experiment or `champion`",
        )


def schedule_fits_steps(spec: ExperimentSpec) -> Iterator[Violation]:
    """Warmup must end before training does, or the schedule never reaches its peak."""
    steps = spec.total_steps(spec.parallel_layout().dp)
    if spec.train.warmup_steps >= steps:
        yield Violation(
            ("train", "warmup_steps"),
            f"{spec.train.warmup_steps} must be less than the total steps ({steps})",
        )


def precision_fits_device(spec: ExperimentSpec) -> Iterator[Violation]:
    if spec.train.precision == "fp16" and not spec.resource.gpus_per_node:
        yield Violation(("train", "precision"), "fp16 needs GPUs; use fp32 or bf16 on CPU")


def launcher_consistent(spec: ExperimentSpec) -> Iterator[Violation]:
    """Each launcher needs its own settings and ignores the others'."""
    res = spec.resource
    if res.launcher == "static" and not res.rendezvous:
        yield Violation(
            ("resource", "rendezvous"), "the static launcher needs rendezvous: host:port of node 0"
        )
    if res.launcher != "static" and res.rendezvous:
        yield Violation(
            ("resource", "rendezvous"), f"only used by the static launcher (launcher is {res.launcher})"
        )
    if res.launcher != "slurm" and res.partition:
        yield Violation(
            ("resource", "partition"), f"only used by the slurm launcher (launcher is {res.launcher})"
        )
    if res.launcher == "local" and res.nodes > 1:
        yield Violation(
            ("resource", "nodes"),
            f"the local launcher runs on one host; nodes={res.nodes} needs slurm or static",
        )
    if res.gpus_per_node and res.gpu_type == "cpu":
        yield Violation(
            ("resource", "gpu_type"), "set the accelerator type (e.g. h100) when gpus_per_node > 0"
        )


def sweep_parameters_exist(spec: ExperimentSpec) -> Iterator[Violation]:
    """Each swept path names a real field and every value to try is valid there."""
    if spec.sweep is None:
        return
    base = spec.model_dump(mode="json", by_alias=True)
    combos = 1
    for dotted_path, values in spec.sweep.parameters.items():
        combos *= len(values)
        where = ("sweep", "parameters", dotted_path)
        keys = dotted_path.split(".")
        problem = _leaf_field_problem(keys, spec)
        if problem:
            yield Violation(where, problem)
            continue
        for value in values:
            trial = _with_value(base, keys, value)
            try:
                ExperimentSpec.model_validate(trial)
            except ValidationError as exc:
                first = exc.errors(include_url=False)[0]
                words = describe_error(first, None, trial)
                yield Violation(where, f"value {value!r} is invalid for {dotted_path}: {words}")
                break
    if spec.sweep.method == "grid" and combos > spec.sweep.max_trials:
        yield Violation(
            ("sweep", "max_trials"),
            f"grid has {combos} combinations but max_trials is {spec.sweep.max_trials}; "
            "raise it or use method: random",
        )


def _leaf_field_problem(keys: list[str], spec: ExperimentSpec | None = None) -> str | None:
    model: type[BaseModel] = ExperimentSpec
    node: Any = spec
    for depth, key in enumerate(keys):
        fields = model.model_fields
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            return f"'{'.'.join(keys)}' is not a field: no '{key}' in {'.'.join(keys[:depth]) or 'the spec'}{hint}"
        annotation = fields[key].annotation
        node = getattr(node, key, None)
        sub = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        if sub is None and isinstance(node, BaseModel):  # a plug-in union (model, train.optimizer)
            sub = type(node)
        last = depth == len(keys) - 1
        if last and sub is not None:
            return f"'{'.'.join(keys)}' is a section; sweep a single field inside it"
        if not last:
            if sub is None:
                return f"'{'.'.join(keys)}' is not a field: '{key}' has no sub-fields"
            model = sub
    return None


def _with_value(data: dict[str, Any], keys: list[str], value: Any) -> dict[str, Any]:
    out = dict(data)
    node = out
    for key in keys[:-1]:
        node[key] = dict(node.get(key) or {})
        node = node[key]
    node[keys[-1]] = value
    return out


RULES: tuple[Rule, ...] = (
    # (the layout rules run first, through `layout_violations`)
    global_batch_consistent,
    mixture_weights,
    metrics_exist,
    task_metrics_exist,
    tokenizer_fits_model,
    baseline_is_another_experiment,
    schedule_fits_steps,
    precision_fits_device,
    launcher_consistent,
    sweep_parameters_exist,
)
