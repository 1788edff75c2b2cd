"""Resolve once: one experiment file -> one frozen `ResolvedExperiment`, written as `spec.resolved.json`.

Every fact derived from a spec is worked out here and nowhere else:

- the merged, validated spec (the loader: `extends` chain, models, cross-field rules);
- the baseline: `champion`, or the experiment file found by the one lookup rule
  (`basics.paths.experiment_file`: `experiments/<name>.yaml`, else `.yml`);
- the parallel layout, planned for `parallel: auto` and checked against the trainer's
  declared execution capability (`validation.capability.TRAINER`) either way;
- the per-seed specs, each built through validation (never `model_copy(update=...)`),
  with the seed set and the layout explicit: what the trainer runs;
- parameters, FLOPs per token and the device peak (`validation.flops`: one table, one formula);
- the data paths resolved against the repository and the data roots;
- the identity inputs that do not need the file system or git (spec hash, seeds).

Orchestration writes it into the run directory; smoke, sweeps, the trainer
(`python -m trainer --spec RUN/spec.resolved.json`), reports and promotion read it back
with `load_resolved` instead of recomputing. Pure apart from reading the spec files:
no torch, no git, no data preparation.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from basics.errors import Issue, SpecError, UsageError
from basics.files import atomic_write_text
from basics.paths import data_roots, experiment_file, find_repo_root
from validation.capability import AXES, TRAINER, ExecutionCapability
from validation.flops import PEAK_TFLOPS_BF16, DevicePeak, device_peak, flops_per_token
from validation.loader import load_located
from validation.plan import Locator, no_location, plan_parallel
from validation.rules import layout_violations
from validation.spec import CHAMPION, ExperimentSpec, ParallelLayout

RESOLVED_FILE = "spec.resolved.json"
FORMAT: Literal[1] = 1
"""Version of the `spec.resolved.json` layout; bump it when a field changes meaning."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Baseline(_Frozen):
    """What the candidate is compared against."""

    kind: Literal["experiment", "champion", "none"]
    """`experiment`: another experiment file; `champion`: the registry's promoted model;
    `none`: a spec resolved without a file (a trial, a smoke spec) that names no baseline."""
    name: str
    """The experiment name, or `champion`."""
    file: str | None = None
    """Absolute path of the baseline's experiment file (kind `experiment` only)."""


class Layout(_Frozen):
    """The parallel layout the trainer runs, and how it was chosen."""

    dp: int
    tp: int
    pp: int
    fsdp: bool
    chosen_by: Literal["auto", "explicit"]
    world_size: int
    capability: tuple[str, ...]
    """The axes the execution capability allowed when this was checked (on this device kind)."""

    def parallel(self) -> ParallelLayout:
        return ParallelLayout(dp=self.dp, tp=self.tp, pp=self.pp, fsdp=self.fsdp)


class Peak(_Frozen):
    """Dense peak of one device (per thread on CPUs): see `validation.flops.DevicePeak`."""

    tflops: float
    per: Literal["device", "thread"]
    source: str

    def device(self) -> DevicePeak:
        return DevicePeak(self.tflops, self.per, self.source)

    def flops_per_second(self, threads: int = 1) -> float:
        return self.device().flops_per_second(threads)


class Compute(_Frozen):
    """Model size and training FLOPs: what MFU, the estimate and a sweep's cost are made of."""

    parameters: int
    """Exact parameter count of the model the spec builds."""
    flops_per_token: float
    """`validation.flops.flops_per_token` at `data.seq_len`."""
    peak: Peak
    steps: int
    tokens: int
    """Training tokens: steps x global batch x seq_len."""

    @property
    def training_flops(self) -> float:
        return self.flops_per_token * self.tokens


class DataPaths(_Frozen):
    """Data locations resolved against the repository (globs stay globs; nothing is read)."""

    sources: dict[str, str]
    """Source name -> absolute path or glob."""
    tokenizer: str | None = None
    init_from: str | None = None
    roots: tuple[str, ...]
    """Directories data may come from (`basics.paths.data_roots`)."""


class IdentityInputs(_Frozen):
    """The parts of the run identity known before any data is hashed or any git call."""

    experiment: str
    spec_hash: str
    seeds: tuple[int, ...]


class SeedRun(_Frozen):
    """One training run: its seed and the spec the trainer reads (layout explicit, seed set)."""

    seed: int
    spec: ExperimentSpec


class ResolvedExperiment(_Frozen):
    """Everything derived from one experiment spec, computed once."""

    format: Literal[1] = FORMAT
    spec_file: str | None
    """Absolute path of the experiment file (None for a spec built in code: a trial, a smoke spec)."""
    repo_root: str
    spec: ExperimentSpec
    """The merged, validated spec. In a seed's run directory: that seed's spec (see `for_seed`)."""
    spec_hash: str
    layout: Layout
    baseline: Baseline
    runs: tuple[SeedRun, ...]
    compute: Compute
    data: DataPaths
    identity: IdentityInputs

    @property
    def seeds(self) -> list[int]:
        return [run.seed for run in self.runs]

    def run_for(self, seed: int) -> SeedRun:
        for run in self.runs:
            if run.seed == seed:
                return run
        raise KeyError(seed)

    def for_seed(self, seed: int) -> ResolvedExperiment:
        """The resolution a single training run reads: `spec` is that seed's spec."""
        run = self.run_for(seed)
        return ResolvedExperiment.model_validate({**dict(self), "spec": run.spec, "runs": (run,)})

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

    def write(self, path: Path) -> Path:
        """Write as JSON, atomically (a reader never sees half a file)."""
        atomic_write_text(Path(path), self.to_json())
        return Path(path)


# --------------------------------------------------------------------------- resolving


def resolve(
    spec_file: str | os.PathLike[str],
    repo_root: str | os.PathLike[str] | None = None,
    *,
    capability: ExecutionCapability = TRAINER,
    seeds: list[int] | None = None,
) -> ResolvedExperiment:
    """Load, validate and resolve one experiment file; `SpecError` (every issue, with
    file:line) when anything is wrong, including a layout the capability does not cover.

    `seeds` overrides the hypothesis' seeds (a baseline runs on its candidate's seeds)."""
    path = Path(spec_file)
    root = Path(repo_root) if repo_root is not None else find_repo_root(path)
    loaded = load_located(path, repo_root=root)
    if loaded.issues:
        raise SpecError(loaded.issues)
    assert loaded.spec is not None
    return resolve_spec(loaded.spec, root, spec_file=path, locate=loaded.locate, capability=capability, seeds=seeds)


def resolve_spec(
    spec: ExperimentSpec,
    repo_root: str | os.PathLike[str],
    *,
    spec_file: str | os.PathLike[str] | None = None,
    locate: Locator = no_location,
    capability: ExecutionCapability = TRAINER,
    seeds: list[int] | None = None,
) -> ResolvedExperiment:
    """Resolve a spec that already passed validation (a file's, a sweep trial's, a smoke spec).

    `seeds` overrides the hypothesis' seeds (a baseline runs on its candidate's seeds)."""
    root = Path(repo_root).resolve()
    problems = layout_violations(spec, capability)
    if problems:
        raise SpecError([_issue(locate, ".".join(map(str, v.path)), v.message) for v in problems])
    plan = plan_parallel(spec, locate=locate, capability=capability)
    on_gpu = spec.resource.gpus_per_node > 0
    layout = Layout(
        dp=plan.dp, tp=plan.tp, pp=plan.pp, fsdp=plan.fsdp, chosen_by=plan.chosen_by,
        world_size=plan.world_size, capability=tuple(a for a in AXES if a in capability.axes(on_gpu)),
    )
    peak = device_peak(spec.resource, spec.train.precision)
    if peak is None:  # `plan` reports it with its fix; the same words here
        raise SpecError([_issue(locate, "resource.peak_tflops",
                                f"no peak FLOPS known for gpu_type '{spec.resource.gpu_type}' (known: "
                                f"{', '.join(sorted(PEAK_TFLOPS_BF16))}); set resource.peak_tflops")])
    run_seeds = seeds if seeds is not None else [spec.train.seed + i for i in range(spec.hypothesis.seeds)]
    # The plan keeps the spec's global batch: its micro batch, accumulation and checkpointing
    # are what each run trains with (validation/plan/layout.py).
    overrides = {k: v for k, v in plan.train_overrides().items() if _at(spec, k) != v}
    planned = rebuild(spec, overrides) if overrides else spec
    runs = tuple(SeedRun(seed=s, spec=seed_spec(planned, s, layout.parallel())) for s in run_seeds)
    steps = planned.total_steps(layout.dp)
    return ResolvedExperiment(
        spec_file=str(Path(spec_file).resolve()) if spec_file is not None else None,
        repo_root=str(root),
        spec=spec,
        spec_hash=spec.spec_hash(),
        layout=layout,
        baseline=_baseline(spec, root, spec_file, locate),
        runs=runs,
        compute=Compute(
            parameters=spec.model.parameter_count(),
            flops_per_token=flops_per_token(spec.model, spec.data.seq_len),
            peak=Peak(tflops=peak.tflops, per=peak.per, source=peak.source),
            steps=steps,
            tokens=steps * planned.global_batch(layout.dp) * spec.data.seq_len,
        ),
        data=_data_paths(spec, root),
        identity=IdentityInputs(experiment=spec.name, spec_hash=spec.spec_hash(), seeds=tuple(run_seeds)),
    )


def _at(spec: ExperimentSpec, dotted_path: str) -> Any:
    """The value at a dotted spec path (`train.micro_batch_size`)."""
    node: Any = spec
    for key in dotted_path.split("."):
        node = getattr(node, key)
    return node


def rebuild(spec: ExperimentSpec, changes: dict[str, Any]) -> ExperimentSpec:
    """`spec` with dotted-path `changes` (e.g. `{"train.seed": 7}`), validated again as a whole.

    The one way to derive a spec from a spec: `model_copy(update=...)` would skip every
    validator, so a derived spec could hold values no file could. What the file left to its
    default stays unset (the same values): the plan reads which fields a spec states, e.g. a CPU
    spec without `resource.assumed_mfu` is priced at the measured CPU utilisation, and a sweep's
    trial, dumped whole, was priced at the GPU default 0.35, ten times too fast."""
    data = spec.model_dump(mode="json", by_alias=True, exclude_unset=True)
    # The plug-in unions' selectors are always written: a spec built in code from a config
    # instance leaves its `model_type` / optimizer `name` default unset, and the union needs it.
    data.setdefault("model", {})["model_type"] = spec.model.model_type
    data.setdefault("train", {}).setdefault("optimizer", {})["name"] = spec.train.optimizer.name
    for dotted_path, value in changes.items():
        node = data
        *parents, leaf = dotted_path.split(".")
        for key in parents:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[leaf] = value
    return ExperimentSpec.model_validate(data)


def seed_spec(spec: ExperimentSpec, seed: int, layout: ParallelLayout) -> ExperimentSpec:
    """The spec one training run reads: `train.seed` set and the layout explicit."""
    return rebuild(spec, {"train.seed": seed, "parallel": layout.model_dump(mode="json")})


def _issue(locate: Locator, field_path: str, message: str) -> Issue:
    file, line, col = locate(field_path)
    return Issue(file=file, line=line, col=col, field=field_path, message=message)


def _baseline(spec: ExperimentSpec, root: Path, spec_file: Any, locate: Locator) -> Baseline:
    name = spec.hypothesis.baseline
    if name == CHAMPION:
        return Baseline(kind="champion", name=CHAMPION)
    if spec_file is None or name == spec.name:
        return Baseline(kind="none", name=name)
    found = experiment_file(root, name)
    if found is None:
        raise SpecError([_issue(locate, "hypothesis.baseline",
                                f"no experiment '{name}' in {root / 'experiments'} (looked for {name}.yaml "
                                f"and {name}.yml); use an experiment name or `{CHAMPION}`")])
    return Baseline(kind="experiment", name=name, file=str(found.resolve()))


def _data_paths(spec: ExperimentSpec, root: Path) -> DataPaths:
    def absolute(value: str) -> str:
        return value if os.path.isabs(value) else str(root / value)

    tokenizer = spec.data.tokenizer.path
    return DataPaths(
        sources={s.name: absolute(s.path) for s in spec.data.sources},
        tokenizer=absolute(tokenizer) if tokenizer else None,
        init_from=absolute(spec.model.init_from) if spec.model.init_from else None,
        roots=tuple(str(r) for r in data_roots(root)),
    )


# --------------------------------------------------------------------------- reading


def spec_section(data: Any) -> dict[str, Any]:
    """The spec part of a parsed `spec.resolved.json` (also accepts a bare spec dict: files
    written by hand or by older versions), for readers that only want plain data."""
    if isinstance(data, dict) and data.get("format") == FORMAT and isinstance(data.get("spec"), dict):
        spec: dict[str, Any] = data["spec"]
        return spec
    return data if isinstance(data, dict) else {}


def load_resolved(path: str | os.PathLike[str], repo_root: str | os.PathLike[str] | None = None) -> ResolvedExperiment:
    """Read a `spec.resolved.json`. A bare spec dict (hand-written, or from before the resolve
    step) is validated and resolved on the spot. `UsageError` when unreadable or invalid."""
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {file}: {str(exc).splitlines()[0]}") from exc
    try:
        if isinstance(data, dict) and "format" in data:
            return ResolvedExperiment.model_validate(data)
        spec = ExperimentSpec.model_validate(data)
    except ValueError as exc:
        raise UsageError(f"{file}: not a resolved experiment: {str(exc).splitlines()[0]}") from exc
    root = Path(repo_root) if repo_root is not None else find_repo_root(file)
    return resolve_spec(spec, root, seeds=[spec.train.seed]).for_seed(spec.train.seed)
