"""Continue a run on another layout: `pipeline train FILE --continue-from RUN_DIR`.

The trainer's checkpoints load under any layout or world size (`trainer.checkpoint`,
docs/checkpoints.md); what a user needs is a way to say "go on with *that* run, on these
machines". A layout is part of the spec hash, so a YAML with another `parallel:` or
`resource:` section is another run: it starts at step 0 in a run directory of its own.

Continuing seeds that new run directory from the old one before the trainer starts:

- the old run's newest valid checkpoint (hard links; a copy where links cannot be made),
  published like a save: files first, MANIFEST.json last, one rename;
- its `metrics.jsonl` and `alerts.jsonl` (the history up to the kill) and `mlflow_run.json`
  (the trainer then continues the same MLflow run).

The trainer resumes from that checkpoint as from its own, reshards, and raises one P2
`resharded` event ("resharded at step 30: 2 -> 1 processes"); the report shows it. Only what
cannot change the trained model may differ (`LAYOUT_FIELDS`), and the global batch must stay
the same (`refusal`): anything else is another experiment and is refused in one line.

A run that starts at step 0 while a run of the same experiment, data, code and seed has
checkpoints under another layout is told how to continue that one (`other_layout_hint`).
`for_seed` is what the flow asks for each candidate seed it is about to train.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from basics.errors import UsageError
from basics.files import atomic_write_json, read_json
from pipelines.launchers import running_job
from trainer.checkpoint import format as ckpt
from validation.resolved import RESOLVED_FILE, ResolvedExperiment, load_resolved

LAYOUT_FIELDS = ("parallel", "resource", "train.micro_batch_size", "train.grad_accum_steps",
                 "train.min_micro_batch_size", "train.global_batch_size")
"""Fields a continuation may change: where and how the processes run, and how the global batch
is split between them (its size is checked separately)."""

HISTORY_FILES = ("metrics.jsonl", "alerts.jsonl")
CONTINUED_FILE = "continued_from.json"
CONTINUED_IN = "continued_in.json"
"""Written into the old run: it must not be resumed (or continued) a second time elsewhere."""


@dataclass(frozen=True)
class Continuation:
    """One seed's continuation: where from, at which step, from which layout to which."""

    source: Path
    """The old seed's run directory."""
    checkpoint: Path
    """Its newest valid checkpoint."""
    step: int
    before: dict[str, Any]
    after: dict[str, Any]
    finished: bool = False
    """The old seed already finished (another seed of it was the one interrupted): reused as it is."""

    def record(self) -> dict[str, Any]:
        """What identity.json says about it (and so the MLflow tags `pipeline.continued_from`, ...)."""
        return {"continued_from": str(self.source), "continued_at_step": self.step,
                "layouts": [self.before, self.after]}


def layout_of(resolved: ResolvedExperiment) -> dict[str, Any]:
    """Processes and parallel axes of a resolved run (what `identity.json` records)."""
    lay = resolved.layout
    return {"processes": lay.world_size, "dp": lay.dp, "tp": lay.tp, "fsdp": lay.fsdp} | (
        {"pp": lay.pp} if lay.pp > 1 else {})


def describe(layout: dict[str, Any]) -> str:
    """`2 processes (dp 2, fsdp)`."""
    n = layout["processes"]
    return f"{n} process{'es' if n != 1 else ''} ({ckpt.describe_layout(layout | {'fsdp': layout.get('fsdp') and layout['dp'] > 1})})"


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out |= _flatten(value, path + ".")
        else:
            out[path] = value
    return out


def _changeable(path: str) -> bool:
    return any(path == f or path.startswith(f + ".") for f in LAYOUT_FIELDS)


def refusal(old: ResolvedExperiment, old_identity: dict[str, Any], new: ResolvedExperiment,
            code_version: str, data_version: str, seed: int) -> str | None:
    """Why the run of `old` cannot be continued as `new` (one line), or None when it can. Pure.

    Allowed: another layout, world size, resources and batch split; same global batch, same
    code, data, seed and every other training field."""
    if old_identity.get("seed") is not None and int(old_identity["seed"]) != seed:
        return f"it trained seed {old_identity['seed']}, this run is seed {seed}"
    if old_identity.get("code_version") not in (None, code_version):
        return (f"it ran other code (code version {old_identity['code_version']}, now {code_version}); "
                "a continuation runs the same trainer and model code")
    if old_identity.get("data_version") not in (None, data_version):
        return f"it trained on other data (data version {old_identity['data_version']}, now {data_version})"
    before, after = _flatten(old.spec.training_dict()), _flatten(new.spec.training_dict())
    changed = sorted(k for k in before.keys() | after.keys()
                     if before.get(k) != after.get(k) and not _changeable(k))
    if changed:
        first = changed[0]
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        return (f"{first} differs ({before.get(first)!r} -> {after.get(first)!r}){more}; only parallel, resource and "
                "the batch split (micro_batch_size, grad_accum_steps) may change")
    rows_before = old.spec.global_batch(old.layout.dp)
    rows_after = new.spec.global_batch(new.layout.dp)
    if rows_before != rows_after:
        return (f"the global batch changes ({old.spec.train.micro_batch_size} x {old.spec.train.grad_accum_steps} x dp "
                f"{old.layout.dp} = {rows_before} rows -> {new.spec.train.micro_batch_size} x "
                f"{new.spec.train.grad_accum_steps} x dp {new.layout.dp} = {rows_after}); set "
                f"train.grad_accum_steps to {max(1, rows_before // (new.spec.train.micro_batch_size * new.layout.dp))} "
                "to keep it")
    return None


def seed_dirs(run_dir: Path) -> dict[int, Path]:
    """seed -> trainer run directory, for an experiment run directory or one seed's directory."""
    run_dir = Path(run_dir).resolve()
    candidates = [run_dir] if (run_dir / RESOLVED_FILE).is_file() and (run_dir / "identity.json").is_file() \
        and run_dir.name.startswith("seed-") else sorted((run_dir / "train").glob("seed-*"))
    out: dict[int, Path] = {}
    for d in candidates:
        seed = (read_json(d / "identity.json") or {}).get("seed")
        if isinstance(seed, int):
            out[seed] = d
    return out


def plan(source: Path, new: ResolvedExperiment, *, code_version: str, data_version: str, seed: int,
         tracking_uri: str, target: Path | None = None) -> Continuation:
    """Check that the run in `source` (one seed's directory) can go on as `new` in `target`;
    `UsageError` (one line, saying why) when not."""
    where = f"cannot continue {source}"
    identity = read_json(source / "identity.json") or {}
    if not (source / RESOLVED_FILE).is_file():
        raise UsageError(f"{where}: no {RESOLVED_FILE} (not a training run directory)")
    went_on = continued_in(source)
    if went_on and (target is None or went_on.resolve() != Path(target).resolve()):
        # Two continuations of one run would write two futures into one MLflow run.
        raise UsageError(f"{where}: it was already continued in {went_on}; continue that run instead")
    result = read_json(source / "result.json") or {}
    old = load_resolved(source / RESOLVED_FILE)
    reason = refusal(old, identity, new, code_version, data_version, seed)
    if reason:
        raise UsageError(f"{where}: {reason}")
    if result.get("status") == "finished":
        return Continuation(source, source, int(result.get("steps") or 0), layout_of(old), layout_of(new), finished=True)
    tracked = (read_json(source / "mlflow_run.json") or {}).get("tracking_uri")
    if tracked and tracked != tracking_uri:
        raise UsageError(f"{where}: its MLflow run is in {tracked}; pass --tracking-uri {tracked} to keep one history")
    found = ckpt.find_resume_checkpoint(source / "checkpoints")
    if found is None:
        raise UsageError(f"{where}: no valid checkpoint under {source / 'checkpoints'}")
    step = int(found.name[len(ckpt.PREFIX):])
    return Continuation(source, found, step, layout_of(old), layout_of(new))


def for_seed(seeded: ResolvedExperiment, seed: int, seed_dir: Path, *, source_dir: Path | None, runs_root: Path,
             code_version: str, data_version: str, tracking_uri: str,
             warn: Callable[[str], None]) -> Continuation | None:
    """With a `source_dir` (--continue-from): the checked plan to continue that run's seed in
    `seed_dir` (UsageError, one line, when it cannot be). Without: None, after warning when a
    run of the same work has checkpoints under another layout and this one would start at step 0."""
    went_on = continued_in(seed_dir)
    if went_on is not None:  # resuming here too would write a second future into its MLflow run
        raise UsageError(f"{seed_dir} was continued in {went_on} under another layout; "
                         f"go on there (--continue-from {went_on} with that layout's file)")
    if source_dir is None:
        if not ckpt.list_checkpoints(seed_dir / "checkpoints"):
            hint = other_layout_hint(runs_root, seeded, seed=seed, code_version=code_version,
                                     data_version=data_version, spec_file=seeded.spec_file, exclude=seed_dir)
            if hint:
                warn(hint)
        return None
    sources = seed_dirs(source_dir)
    if seed not in sources:
        if not sources:
            raise UsageError(f"--continue-from {source_dir}: no training run there")
        warn(f"seed {seed}: {source_dir} has no run of it; it starts at step 0")
        return None
    if running_job(sources[seed]) is not None:
        raise UsageError(f"cannot continue {sources[seed]}: its job is still running; "
                         f"stop it first (pipeline cancel {sources[seed]})")
    return plan(sources[seed], seeded, code_version=code_version, data_version=data_version, seed=seed,
                tracking_uri=tracking_uri, target=seed_dir)


def continued_in(seed_dir: Path) -> Path | None:
    """The run directory this run was continued in (under another layout), if any."""
    went_on = (read_json(Path(seed_dir) / CONTINUED_IN) or {}).get("run_dir")
    return Path(went_on) if went_on else None


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(src, dst)


def seed_run(cont: Continuation, seed_dir: Path) -> bool:
    """Put the old run's checkpoint and history into `seed_dir` (idempotent: a run directory
    that already holds a checkpoint at or after the continuation's step is left alone, so a
    second interruption resumes from the continued run's own checkpoints). True when seeded."""
    root = seed_dir / "checkpoints"
    mine = [s for s, p in ckpt.list_checkpoints(root) if ckpt.verify_checkpoint(p) is None]
    if mine and max(mine) >= cont.step:
        return False
    tmp = ckpt.tmp_dir_for(root, cont.step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for path in sorted(cont.checkpoint.iterdir()):  # the manifest last: a torn copy is no checkpoint
        if path.is_file() and path.name != ckpt.MANIFEST:
            _link_or_copy(path, tmp / path.name)
    shutil.copy2(cont.checkpoint / ckpt.MANIFEST, tmp / ckpt.MANIFEST)
    os.rename(tmp, root / ckpt.checkpoint_name(cont.step))
    for name in (*HISTORY_FILES, "mlflow_run.json"):
        if (cont.source / name).is_file() and not (seed_dir / name).exists():
            shutil.copy2(cont.source / name, seed_dir / name)
    atomic_write_json(seed_dir / CONTINUED_FILE, cont.record() | {"checkpoint": str(cont.checkpoint)})
    atomic_write_json(cont.source / CONTINUED_IN, {"run_dir": str(seed_dir), "step": cont.step})
    return True


def other_layout_hint(runs_root: Path, new: ResolvedExperiment, *, seed: int, code_version: str,
                      data_version: str, spec_file: str | None, exclude: Path) -> str | None:
    """The line to print when a run starts at step 0 while an unfinished run of the same
    experiment, code, data and seed has a checkpoint under another layout; None otherwise."""
    for ident_file in sorted(runs_root.glob(f"*/{new.spec.name}/*/train/seed-{seed}/identity.json"), reverse=True):
        source = ident_file.parent
        if source.resolve() == exclude.resolve() or (source / "result.json").is_file():
            continue
        valid = ckpt.valid_checkpoints(source / "checkpoints")
        if not valid or not (source / RESOLVED_FILE).is_file():
            continue
        try:
            old = load_resolved(source / RESOLVED_FILE)
        except UsageError:
            continue
        if old.spec_hash == new.spec_hash or refusal(old, read_json(ident_file) or {}, new, code_version,
                                                     data_version, seed):
            continue
        command = f"pipeline train {spec_file or 'FILE'} --continue-from {source}"
        return (f"{source} has a checkpoint at step {valid[0][0]} under another layout "
                f"({describe(layout_of(old))}); this run starts at step 0. To continue that run instead: {command}")
    return None
