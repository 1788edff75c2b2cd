"""One command, the whole experiment flow: validate -> prepare -> check -> smoke -> train
-> evaluate -> report, for the baseline (first, when it has no finished run with the
current code and data) and the candidate, on the same seeds.

This module decides what to run and in which order; the work itself is done by data
preparation (`pipelines.dataprep`), the data checks (`validation.data.checks`), the launchers
(`pipelines.launchers`) and `reports`. It does not know what a transformer is. Beside the
stages: a sweep's trials run in `pipelines.sweep_trials`, `--continue-from` is decided in
`pipelines.continuation`, the PR comment (progress, then the report) is `pipelines.pr_comment`,
and the champion baseline and verdict tags in MLflow are `pipelines.mlflow_verdict`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from basics.errors import Detached, PipelineError, TrainingError
from basics.files import atomic_write_json, atomic_write_text, read_json
from pipelines import continuation, tracked_runs
from pipelines.exits import training_failure
from pipelines.identity import CodeVersion, RunIdentity, code_version, experiment_key
from pipelines.mlflow_verdict import champion_records, mlflow_client, tag_verdict
from pipelines.pr_comment import live_progress, publish_report
from pipelines.rundir import data_cache_root, finished_training_runs, new_run_dir, runs_root
from pipelines.stages import StageOutcome, StageRunner
from pipelines.sweep_trials import run_sweep
from trainer.mlflow_endpoint import default_tracking_uri
from validation.resolved import RESOLVED_FILE, ResolvedExperiment, resolve
from validation.spec import ExperimentSpec


@dataclass
class RunOptions:
    """How to run; the defaults are a laptop run."""

    launcher: str | None = None
    """Override `resource.launcher` (local, slurm, static)."""
    detach: bool = False
    """Submit and return (Slurm) instead of following the job."""
    pr: int | None = None
    """Pull request number, recorded as a tag and used for the comment."""
    sha: str | None = None
    """Head SHA the launch is bound to."""
    tracking_uri: str | None = None
    smoke: bool = True
    """Run the smoke stage before training."""
    force: bool = False
    """Re-run stages even when their result exists for the same identity."""
    run_baseline: bool = True
    """Train the baseline first when it has no finished run."""
    continue_from: Path | None = None
    """A run directory (an experiment's or one seed's) whose checkpoints the candidate continues
    under its own layout (`pipelines.continuation`)."""
    measured_cpu: tuple[Any, ...] = ()
    """This machine's speed on the specs' shapes (`validation.plan.cpu_speed.MeasuredCpu`): the
    plan recorded at launch prices a CPU run from it (`pipeline demo`, `pipeline run --measure-cpu`)."""


class Reporter:
    """Where progress goes (the CLI draws progress bars; tests record events)."""

    def stage(self, experiment: str, stage: str, event: str, detail: str = "") -> None:  # pragma: no cover - UI
        pass

    def training(self, label: str, run_dir: Path, total_steps: int) -> Callable[[], None]:  # pragma: no cover - UI
        """Start showing a training run; returns a function to call when it ends."""
        return lambda: None


@dataclass
class ExperimentResult:
    """The outcome of one experiment (all its seeds)."""

    resolved: ResolvedExperiment
    run_dir: Path
    data_version: str
    seed_dirs: list[Path]
    reused: list[bool]
    report_dir: Path | None = None
    verdict: str | None = None
    verdict_reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def spec(self) -> ExperimentSpec:
        return self.resolved.spec

    @property
    def spec_path(self) -> Path | None:
        return Path(self.resolved.spec_file) if self.resolved.spec_file else None


class ExperimentFlow:
    """Runs the stages of experiments in one repository with shared caches."""

    def __init__(self, repo: Path, options: RunOptions | None = None, reporter: Reporter | None = None):
        self.repo = repo
        self.options = options or RunOptions()
        self.reporter = reporter or Reporter()
        self._codes: dict[tuple[str, str], CodeVersion] = {}
        self.tracking_uri = self.options.tracking_uri or default_tracking_uri(repo)
        self.detached: list[tuple[str, int, Path, str, str]] = []
        """(experiment, seed, run dir, launcher, job id) submitted with --detach."""
        self.sweep_tables: dict[str, str] = {}
        """experiment -> the trial table its (winner's) report ends with."""

    def code_for(self, spec: Any) -> CodeVersion:
        """The code version of a run of `spec`: the framework plus the architecture and optimizer
        files it uses (pipelines.identity.model_paths), so adding an architecture does not
        move the identity of runs that do not use it."""
        key = (spec.model.model_type, spec.train.optimizer.name)
        if key not in self._codes:
            self._codes[key] = code_version(self.repo, *key)
        return self._codes[key]

    # ------------------------------------------------------------------ public

    def run(self, spec_path: Path) -> tuple[ExperimentResult, ExperimentResult | None]:
        """The whole flow for `spec_path`; returns (candidate, baseline)."""
        resolved = resolve(spec_path, self.repo)
        # A sweep's winner trains on the plan's seeds too (the trusted plan decides a sweep's claim).
        if resolved.spec.sweep is None or self._planned(resolved.spec.name) is not None:
            resolved = self._confirmatory_seeds(spec_path, resolved)
        spec = resolved.spec
        baseline: ExperimentResult | None = None
        base_resolved = None
        if resolved.baseline.file is not None:
            # Paired comparison: the baseline runs on the candidate's seeds.
            base_resolved = resolve(Path(resolved.baseline.file), self.repo, seeds=resolved.seeds)
            if spec.sweep is None and base_resolved.spec_hash == resolved.spec_hash:
                return self.run_identical(resolved, base_resolved), None  # A/A: nothing to train or judge
        if base_resolved is not None and self.options.run_baseline:
            try:
                baseline = self.run_one(base_resolved, role="baseline")
            except Detached:
                baseline = None  # submitted; go on and submit the candidate too
        if self.options.detach and spec.sweep is not None:
            raise PipelineError(f"{spec_path}: --detach does not support sweeps yet; run the sweep attached")
        if self.options.continue_from is not None and spec.sweep is not None:
            raise PipelineError(f"{spec_path}: --continue-from continues one run, not a sweep")
        if spec.sweep is not None:
            candidate = run_sweep(self, resolved, baseline)
        else:
            candidate = self.run_one(resolved, role="candidate", baseline=baseline)
        return candidate, baseline

    def _confirmatory_seeds(self, spec_path: Path, resolved: ResolvedExperiment) -> ResolvedExperiment:
        """A claim's confirmatory registration runs on seeds no run of the claim used (a pilot's
        seeds would reuse the pilot's runs); once it exists, the spec's seeds stand (any seed
        outside the registration is exploratory). reports.prereg."""
        from reports import prereg

        spec = resolved.spec
        planned = self._planned(spec.name)
        if planned is not None:  # trusted code chose them before launch (pipelines.trusted.registry)
            seeds = list(planned.seeds)
            return resolved if seeds == list(resolved.seeds) else resolve(spec_path, self.repo, seeds=seeds)
        claim = prereg.claim_key(spec)
        root = runs_root(self.repo)
        if spec.hypothesis.pilot or prereg.confirmatory_registration(root, claim) is not None:
            return resolved
        seeds = prereg.fresh_seeds(spec.train.seed, spec.hypothesis.seeds, prereg.seen_seeds(root, claim))
        return resolved if seeds == list(resolved.seeds) else resolve(spec_path, self.repo, seeds=seeds)

    def _register_claim(self, resolved: ResolvedExperiment, seed: int, run_dir: Path, *, results_existed: bool) -> str:
        """Binds a candidate seed run to its claim's registration (reports.prereg); returns the claim."""
        from reports import prereg

        spec = resolved.spec
        claim = prereg.claim_key(spec)
        root = runs_root(self.repo)
        entry = prereg.claim_entry(claim, spec.name, spec.hypothesis, resolved.seeds, pilot=spec.hypothesis.pilot)
        planned = self._planned(spec.name)
        if planned is not None and planned.registration is not None:
            # The trusted registry's, in force for every runner (a sweep winner's claim is the sweep's).
            claim, entry = planned.claim, dict(planned.registration)
        if not spec.hypothesis.pilot:
            entry = prereg.register_confirmatory(root, entry)
        prereg.record_registration(run_dir, entry, results_existed=results_existed)
        prereg.mark_seen(root, claim, seed)
        return claim

    @staticmethod
    def _planned(experiment: str) -> Any:
        """This experiment's part of the launch plan the job was given (None on a laptop)."""
        from pipelines.launch_plan import launch_plan

        plan = launch_plan()
        return plan.for_experiment(experiment) if plan is not None else None

    def run_identical(self, resolved: ResolvedExperiment, base: ResolvedExperiment) -> ExperimentResult:
        """A candidate whose identity is its baseline's (same code, spec hash, so data and seeds):
        no training, no verdict, no tags, 0 device-hours; the comment says so (reports.identical)."""
        from reports.identical import OUTCOME, build_identical_report, cosmetic_differences, reason

        spec = resolved.spec
        code = self.code_for(resolved.spec)
        run_id = experiment_key(code, resolved.spec_hash, "identical:" + base.spec.name, resolved.seeds)
        run_dir = new_run_dir(self.repo, spec.name, run_id)
        resolved.write(run_dir / RESOLVED_FILE)
        atomic_write_json(run_dir / "identity.json", {
            "experiment": spec.name, "role": "candidate", "run_id": run_id, "seeds": resolved.seeds,
            "code_version": code.tree, "git_sha": code.git_sha, "spec_hash": resolved.spec_hash,
            "identical_to": base.spec.name, "pr": self.options.pr})
        differences = cosmetic_differences(spec.model_dump(mode="json"), base.spec.model_dump(mode="json"))
        out_dir = build_identical_report(run_dir / "report", spec.name, base.spec.name, differences,
                                         spec.hypothesis.model_dump(mode="json"))
        result = ExperimentResult(resolved, run_dir, "", [], [], report_dir=out_dir, verdict=OUTCOME,
                                  verdict_reason=reason(spec.name, base.spec.name))
        publish_report(spec.name, out_dir, pr=self.options.pr, sha=self.options.sha)
        self.reporter.stage(spec.name, "report", "finished", f"identical to {base.spec.name}")
        return result

    def run_one(
        self, resolved: ResolvedExperiment, *, role: str, baseline: ExperimentResult | None = None
    ) -> ExperimentResult:
        spec, seeds = resolved.spec, resolved.seeds
        name = spec.name
        rep = self.reporter
        started = time.time()

        # The caller resolved the spec (`validation.resolved.resolve`: schema, rules, hostile-input
        # limits, baseline, layout vs the execution capability); the stage marker records it.
        rep.stage(name, "validate", "finished", f"spec {spec.spec_hash()}")

        rep.stage(name, "prepare", "started")
        prepared = self.prepare(spec)
        rep.stage(name, "prepare", "finished", f"data {prepared.version}")

        run_id = experiment_key(self.code_for(spec), spec.spec_hash(), prepared.version, seeds)
        run_dir = new_run_dir(self.repo, name, run_id)
        # One process at a time per run directory (two PRs needing the same baseline).
        with identity_lock(runs_root(self.repo), f"run-{run_id}"):
            return self._run_stages(resolved, role=role, baseline=baseline, prepared=prepared,
                                    run_id=run_id, run_dir=run_dir, started=started)

    def _run_stages(self, resolved: ResolvedExperiment, *, role: str, baseline: ExperimentResult | None,
                    prepared: Any, run_id: str, run_dir: Path, started: float) -> ExperimentResult:
        spec, seeds = resolved.spec, resolved.seeds
        spec_path = str(resolved.spec_file or run_dir / RESOLVED_FILE)
        name, rep = spec.name, self.reporter
        code = self.code_for(spec)
        ident = f"{code.tree}:{spec.spec_hash()}:{prepared.version}:{','.join(map(str, seeds))}"
        stages = StageRunner(run_dir, ident, on_event=lambda s, e, r: rep.stage(name, s, e, _detail(r)) if s not in ("validate", "prepare") else None)
        resolved.write(run_dir / RESOLVED_FILE)
        atomic_write_json(
            run_dir / "identity.json",
            {"experiment": name, "role": role, "run_id": run_id, "seeds": seeds, "code_version": code.tree,
             "git_sha": code.git_sha, "dirty": code.dirty, "spec_hash": spec.spec_hash(),
             "data_version": prepared.version, "spec_path": spec_path, "pr": self.options.pr},
        )
        stages.run("validate", lambda: StageOutcome(
            outputs={"spec_path": spec_path, "spec_hash": spec.spec_hash()},
            artifacts=[(run_dir / RESOLVED_FILE, "json")]))
        stages.run("prepare", lambda: StageOutcome(
            outputs={"data_version": prepared.version, "data_dir": str(prepared.path)},
            artifacts=[(prepared.path / "manifest.json", "json")]))

        base_prepared = self.prepare_quietly(baseline.spec) if baseline is not None else None
        stages.run("check", lambda: self._check(spec, prepared, base_prepared, run_dir / "check"), force=self.options.force)
        # The smoke run guards the change under review; a baseline is not under review.
        if self.options.smoke and role != "baseline":
            stages.run("smoke", lambda: self._smoke(resolved, prepared, run_dir / "smoke"), force=self.options.force)

        seed_dirs: list[Path] = []
        reused: list[bool] = []

        def train() -> StageOutcome:
            for seed in seeds:
                d, was_reused = self._train_seed(resolved, seed, prepared, run_dir, role)
                seed_dirs.append(d)
                reused.append(was_reused)
            return StageOutcome(
                outputs={"seed_dirs": [str(d) for d in seed_dirs], "reused": reused},
                artifacts=[(d / "result.json", "json") for d in seed_dirs] + [(d / "metrics.jsonl", "jsonl") for d in seed_dirs],
            )

        if self.options.detach:
            before = len(self.detached)
            train()
            if len(self.detached) > before:
                # The training stage is not done: no marker; the next `pipeline run` follows it.
                raise Detached(f"{name}: submitted {len(self.detached) - before} training job(s)")
        train_result = stages.run("train", train, force=self.options.force)
        if not seed_dirs:  # skipped: restore from the stage result
            seed_dirs = [Path(p) for p in train_result.outputs["seed_dirs"]]
            reused = [True] * len(seed_dirs)

        stages.run("evaluate", lambda: self._evaluate(spec, seed_dirs, run_dir), force=self.options.force)
        result = ExperimentResult(resolved, run_dir, prepared.version, seed_dirs, reused)
        if role == "candidate":
            rep_stage = stages.run("report", lambda: self._report(result, baseline), force=True)
            result.report_dir = Path(rep_stage.outputs["report_dir"])
            result.verdict = rep_stage.outputs.get("verdict")
            result.verdict_reason = rep_stage.outputs.get("verdict_reason", "")
        result.extra["wall_s"] = time.time() - started
        return result

    # ------------------------------------------------------------------ stages

    def prepare(self, spec: ExperimentSpec):  # -> validation.data.PreparedData
        """The spec's data, prepared now unless its version exists (progress on the console)."""
        from pipelines.dataprep.prepare import prepare_data
        from pipelines.resources import ensure_disk_space

        cache = data_cache_root(self.repo)
        ensure_disk_space(cache, need_gb=1.0, what="data preparation")
        return prepare_data(spec.data, self.repo, cache_root=cache, progress=True,
                            expected_digests=_attested_data_digests())

    def prepare_quietly(self, spec: ExperimentSpec):
        """The spec's data without progress output: for data `prepare` has already made."""
        from pipelines.dataprep.prepare import prepare_data

        return prepare_data(spec.data, self.repo, cache_root=data_cache_root(self.repo), progress=False,
                            expected_digests=_attested_data_digests())

    def _check(self, spec: ExperimentSpec, prepared, base_prepared, out_dir: Path) -> StageOutcome:
        from validation.data.checks import run_data_checks

        out_dir.mkdir(parents=True, exist_ok=True)
        result = run_data_checks(spec, prepared, baseline=base_prepared, out_dir=out_dir)
        outputs = {"ok": bool(result.success), "markdown": str(out_dir / "data_check.md"), "json": str(out_dir / "data_check.json")}
        if not result.success:
            from basics.errors import DataCheckFailed

            raise DataCheckFailed(f"data checks failed for {spec.name}; see {out_dir / 'data_check.md'}")
        return StageOutcome(outputs=outputs, artifacts=[(out_dir / "data_check.json", "json"), (out_dir / "data_check.md", "file")])

    def _smoke(self, resolved: ResolvedExperiment, prepared: Any, out_dir: Path) -> StageOutcome:
        from trainer.smoke import failure_line, run_smoke

        spec = resolved.spec
        out_dir.mkdir(parents=True, exist_ok=True)
        # Details stay in the smoke run's logs/; the console shows warnings only.
        result = run_smoke(resolved, prepared, out_dir / "run", tracking_uri="none", console_level="WARNING")
        if result.get("status") == "passed":
            # A sharded layout also runs 2 CPU processes of its kind (FSDP / TP): a tensor-parallel
            # plan that does not fit the model fails here, in the PR check, not after /train.
            from pipelines.layout_probe import run_layout_probe

            sharded = run_layout_probe(resolved, prepared, out_dir / "sharded")
            if sharded is not None:
                result["sharded"] = sharded
                result["checks"] |= sharded["checks"]
                result["status"] = sharded["status"]
        atomic_write_json(out_dir / "smoke.json", result)
        if result.get("status") != "passed":
            raise TrainingError(failure_line(spec.name, result))
        return StageOutcome(outputs={"tokens_per_s": result.get("tokens_per_s"), "wall_s": result.get("wall_s")},
                            artifacts=[(out_dir / "smoke.json", "json")])

    def _train_seed(self, resolved: ResolvedExperiment, seed: int, prepared: Any, run_dir: Path,
                    role: str) -> tuple[Path, bool]:
        spec = resolved.spec
        identity = RunIdentity(spec.name, seed, self.code_for(spec), resolved.spec_hash, prepared.version)
        # Two `pipeline run`s that need the same training (two PRs, one baseline) must not
        # train it twice into one directory: the second waits, then reuses the result.
        with identity_lock(runs_root(self.repo), identity.key):
            return self._train_seed_locked(resolved, seed, prepared, run_dir, role, identity)

    def _train_seed_locked(self, resolved: ResolvedExperiment, seed: int, prepared: Any, run_dir: Path,
                           role: str, identity: RunIdentity) -> tuple[Path, bool]:
        spec = resolved.spec
        from reports.prereg import register_hypothesis
        from reports.records import launch_estimate

        existing = self._reusable_local(finished_training_runs(self.repo).get(identity.key))
        if existing is None and not self.options.force:  # another checkout may have trained it
            existing = self._fetch_recorded(identity, run_dir / "train" / f"seed-{seed}")
        if existing is not None and not self.options.force:
            origin = tracked_runs.fetched_from(existing)
            where = f"MLflow run {origin['mlflow_run_id']}" if origin else str(existing)
            self.reporter.stage(spec.name, "train", "reused", f"seed {seed}: {where}")
            if role != "baseline":  # its hypothesis meets results that already exist: say so
                register_hypothesis(existing, spec.name, spec.hypothesis, resolved.seeds, results_existed=True)
            if role == "candidate":
                self._register_claim(resolved, seed, existing, results_existed=True)
            return existing, True
        seed_dir = run_dir / "train" / f"seed-{seed}"
        self._set_aside_unplanned(spec.name, seed_dir)
        seeded = resolved.for_seed(seed)
        cont = continuation.for_seed(
            seeded, seed, seed_dir, source_dir=self.options.continue_from, runs_root=runs_root(self.repo),
            code_version=identity.code.tree, data_version=identity.data_version, tracking_uri=self.tracking_uri,
            warn=lambda line: self.reporter.stage(seeded.spec.name, "train", "warning", line),
        ) if role == "candidate" else None
        if cont is not None and cont.finished:  # that seed of the old run finished: its result stands
            self.reporter.stage(spec.name, "train", "reused", f"seed {seed}: {cont.source} (another layout)")
            return cont.source, True
        seed_dir.mkdir(parents=True, exist_ok=True)
        seeded.write(seed_dir / RESOLVED_FILE)
        launcher = self.options.launcher or spec.resource.launcher
        # Preregistration: the hypothesis as it is when training starts (reports.prereg); the
        # identity carries it into the MLflow tag `pipeline.hypothesis_registered`.
        registered = register_hypothesis(seed_dir, spec.name, spec.hypothesis, resolved.seeds)
        claim = self._register_claim(resolved, seed, seed_dir, results_existed=False) if role == "candidate" else None
        atomic_write_json(
            seed_dir / "identity.json",
            identity.to_dict(run_id=f"{run_dir.name}-s{seed}", pr=self.options.pr, launcher=launcher,
                             head_sha=self.options.sha, role=role, claim=claim,
                             # The bytes trained on (the data version names the inputs only): the
                             # attest job records it, and later launches check the cache against it.
                             data_digest=prepared.content_digest,
                             hypothesis_registered=json.dumps(registered["hypothesis"], sort_keys=True),
                             # The approved plan's cost of this run, recorded at launch for the report
                             # (and as MLflow tags): `spec` as loaded from the file, as the plan priced it.
                             **launch_estimate(spec, self.options.measured_cpu),
                             **(cont.record() if cont is not None else {})),
        )
        self._resume_planned(spec.name, role, seed, seed_dir, identity)
        if cont is not None and continuation.seed_run(cont, seed_dir):
            self.reporter.stage(spec.name, "train", "continued", f"seed {seed} from {cont.checkpoint} "
                                f"({continuation.describe(cont.before)} -> {continuation.describe(cont.after)})")
        from pipelines.launchers import (
            cancel_quietly,
            get_launcher,
            job_from_spec,
            run_with_retries,
            running_job,
        )

        job = job_from_spec(
            seeded.spec, spec_path=seed_dir / RESOLVED_FILE, run_dir=seed_dir, data_dir=prepared.path,
            tracking_uri=self.tracking_uri, env={"MLFLOW_TRACKING_URI": self.tracking_uri},
        )
        total = resolved.compute.steps
        running = running_job(seed_dir)
        if self.options.detach:
            if running is None:
                from pipelines.resources import ensure_disk_space

                ensure_disk_space(seed_dir, need_gb=checkpoint_gb(spec), what=f"training {spec.name}")
                running = get_launcher(launcher).submit(job)
            self.detached.append((spec.name, seed, seed_dir, running.launcher, running.job_id))
            return seed_dir, False
        done = self.reporter.training(f"{spec.name} seed {seed}", seed_dir, total)
        stop_live = live_progress(self.options.pr, spec.name, seed_dir, total)
        from pipelines.launchers.logtail import story_lines

        # P0/P1 alerts and relaunches reach the console as they happen (one line each).
        story = story_lines(lambda event, line: self.reporter.stage(spec.name, "train", event, f"seed {seed}: {line}"))
        try:
            if running is not None:  # submitted earlier (--detach, or another process): follow it
                get_launcher(running.launcher).wait(running, on_log=story)
            if not (seed_dir / "result.json").exists():
                from pipelines.resources import ensure_disk_space

                ensure_disk_space(seed_dir, need_gb=checkpoint_gb(spec), what=f"training {spec.name}")
                outcome = run_with_retries(get_launcher(launcher), job, on_log=story)
            else:
                outcome = None
        except BaseException:
            # Interrupted (Ctrl-C, SIGTERM, an error): stop the job gracefully (it checkpoints
            # on SIGTERM) instead of leaving orphaned training processes behind.
            cancel_quietly(seed_dir)
            raise
        finally:
            stop_live()
            done()
        state = outcome.state if outcome is not None else None
        result = read_json(seed_dir / "result.json")
        if result and result.get("status") == "diverged":
            # A diverged run is an outcome, not a crash: the report says "refuted: diverged at step k".
            self.reporter.stage(spec.name, "train", "diverged", f"seed {seed} at step {result.get('diverged_at_step')}")
            return seed_dir, False
        if not result or result.get("status") != "finished":
            raise training_failure(spec.name, seed, seed_dir, state)  # a startup failure exits 14, like the trainer
        self._publish_record(spec.name, seed_dir)
        return seed_dir, False

    def _resume_planned(self, experiment: str, role: str, seed: int, seed_dir: Path, identity: RunIdentity) -> None:
        """A `/train` after the runner was lost: the trusted plan names the checkpoint an earlier
        launch of this commit recorded for this run (`facts["resume"]`, pipelines/trusted/registry.py
        `resume_points`); it is copied in, and the trainer resumes from it, only when its manifest
        still hashes to the recorded digest and every file matches the manifest. Anything else on
        the shared storage (a checkpoint someone planted) is never loaded."""
        from basics.files import sha256_file
        from pipelines.launch_plan import launch_plan
        from trainer.checkpoint.format import checkpoint_name, list_checkpoints, verify_checkpoint

        plan = launch_plan()
        if plan is None or list_checkpoints(seed_dir / "checkpoints"):
            return
        points = [e.facts.get("resume", {}).get(role, {}).get(str(seed)) for e in plan.experiments]
        point = next((p for p in points if isinstance(p, dict) and p.get("spec_hash") == identity.spec_hash
                      and p.get("code_version") == identity.code.tree), None)
        if point is None:
            return
        source = Path(str(point["path"]))
        manifest = source / "MANIFEST.json"
        problem = ("its MANIFEST.json is gone" if not manifest.is_file()
                   else "its MANIFEST.json is not the one that launch recorded"
                   if sha256_file(manifest) != point["manifest_sha256"] else verify_checkpoint(source))
        if problem:
            self.reporter.stage(experiment, "train", "warning", f"seed {seed}: not resuming from {source} "
                                f"(step {point['step']}): {problem}; training from the start")
            return
        target = seed_dir / "checkpoints" / checkpoint_name(int(point["step"]))
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".tmp_resume_{target.name}")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(source, staging, symlinks=False)
        if verify_checkpoint(staging) is not None or sha256_file(staging / "MANIFEST.json") != point["manifest_sha256"]:
            shutil.rmtree(staging, ignore_errors=True)  # changed while copying: not this launch's
            self.reporter.stage(experiment, "train", "warning", f"seed {seed}: {source} changed while copied; "
                                "training from the start")
            return
        os.rename(staging, target)
        self.reporter.stage(experiment, "train", "resumed", f"seed {seed} from the lost launch's checkpoint at "
                            f"step {point['step']} (MLflow run {point['run_id']}, manifest verified)")

    @staticmethod
    def _reusable_local(existing: Path | None) -> Path | None:
        """A finished run under runs/, unless a launch plan says which runs may be reused: runs/
        on a runner's shared storage is written by every job's (PR) code, so then only a run
        whose MLflow run the plan names counts (the attest job checks the same ids)."""
        from pipelines.launch_plan import launch_plan

        if existing is None:
            return None
        plan = launch_plan()
        if plan is None:
            return existing
        run_id = (read_json(existing / "result.json") or {}).get("mlflow_run_id")
        return existing if run_id in plan.reusable_runs() else None

    def _set_aside_unplanned(self, experiment: str, seed_dir: Path) -> None:
        """With a launch plan, a seed directory this job did not make (another job's, on shared
        storage) is neither resumed nor reused: it is renamed aside and the seed trains afresh.
        Continuing another job's checkpoints is `--continue-from`, said explicitly."""
        from pipelines.launch_plan import launch_plan

        if not seed_dir.exists() or launch_plan() is None:
            return
        aside = seed_dir.with_name(f"{seed_dir.name}.unplanned-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        seed_dir.rename(aside)
        self.reporter.stage(experiment, "train", "warning", f"{seed_dir} was not made by this launch: moved to {aside}")

    def _fetch_recorded(self, identity: RunIdentity, dest: Path) -> Path | None:
        """A finished run of `identity` that another checkout recorded on the tracking server,
        fetched into `dest` (pipelines.tracked_runs); with a launch plan, only a run it names."""
        if self.tracking_uri == "none":
            return None
        from pipelines.launch_plan import launch_plan

        plan = launch_plan()
        allowed = plan.reusable_runs() if plan is not None else None
        return tracked_runs.fetch_finished(mlflow_client(self.tracking_uri), identity.key, dest,
                                           tracking_uri=self.tracking_uri, allowed=allowed)

    def _publish_record(self, experiment: str, seed_dir: Path) -> None:
        """Makes a finished run reusable by other checkouts sharing the tracking server."""
        if self.tracking_uri == "none":
            return
        try:
            tracked_runs.publish_record(mlflow_client(self.tracking_uri), seed_dir)
        except Exception as exc:  # noqa: BLE001 - best effort: the run stays reusable here
            from trainer.mlflow_endpoint import short_error

            self.reporter.stage(experiment, "train", "warning", f"{seed_dir.name}: record not published to MLflow: {short_error(exc)}")

    def _evaluate(self, spec: ExperimentSpec, seed_dirs: list[Path], run_dir: Path) -> StageOutcome:
        metric = spec.hypothesis.metric
        per_seed: dict[str, dict[str, float]] = {}
        for d in seed_dirs:
            result = read_json(d / "result.json") or {}
            metrics = result.get("final_metrics") or {}
            # A NaN or missing metric (a diverged run) is recorded as None and judged by the
            # report ("refuted: candidate diverged"), never an abort of the whole flow.
            per_seed[d.name] = {k: (float(v) if isinstance(v, int | float) and math.isfinite(float(v)) else None)
                                for k, v in metrics.items() if isinstance(v, int | float) or v is None}
            per_seed[d.name].setdefault(metric, None)
        out = run_dir / "evaluation.json"
        atomic_write_json(out, {"experiment": spec.name, "metric": metric, "per_seed": per_seed})
        return StageOutcome(outputs={"metric": metric, "values": {k: v[metric] for k, v in per_seed.items()}},
                            artifacts=[(out, "json")])

    def _report(self, candidate: ExperimentResult, baseline: ExperimentResult | None) -> StageOutcome:
        from reports import build_report

        out_dir = candidate.run_dir / "report"
        report = build_report(
            candidate_dirs=candidate.seed_dirs,
            baseline_dirs=baseline.seed_dirs if baseline else champion_records(candidate.spec, self.tracking_uri),
            spec=candidate.spec,
            experiment=candidate.spec.name,
            baseline_name=baseline.spec.name if baseline else None,  # champion: its run's experiment
            out_dir=out_dir,
            mlflow_url=os.environ.get("PIPELINE_MLFLOW_PUBLIC_URL"),
            mlflow_client=mlflow_client(self.tracking_uri),
        )
        table = candidate.extra.get("sweep_markdown") or self.sweep_tables.get(candidate.spec.name)
        if table:
            md = out_dir / "report.md"
            atomic_write_text(md, md.read_text(encoding="utf-8").rstrip("\n") + "\n\n" + table)
        from trainer.spool_replay import spool_notice

        notice = spool_notice(list(candidate.seed_dirs) + list(baseline.seed_dirs if baseline else []))
        if notice:  # MLflow was down: say so in the comment, with the command that fixes it
            md = out_dir / "report.md"
            atomic_write_text(md, md.read_text(encoding="utf-8").rstrip("\n") + "\n\n" + notice)
            replay = [line for line in notice.splitlines() if line.startswith("pipeline replay-metrics")]
            self.reporter.stage(candidate.spec.name, "report", "warning",
                                f"MLflow unreachable: metrics spooled; send them with `{replay[0]}`")
        comment = publish_report(candidate.spec.name, out_dir, pr=self.options.pr, sha=self.options.sha)
        verdict = getattr(report, "verdict", None)
        tag_verdict(candidate.spec.name, candidate.seed_dirs, getattr(verdict, "outcome", None),
                    tracking_uri=self.tracking_uri, pr=self.options.pr)
        outputs = {
            "report_dir": str(out_dir),
            "verdict": getattr(verdict, "outcome", None) or getattr(verdict, "label", None) or str(verdict),
            "verdict_reason": getattr(verdict, "reason", ""),
            "comment": str(comment) if comment else None,
        }
        return StageOutcome(outputs=outputs, artifacts=[(out_dir / "report.md", "file"), (out_dir / "result.json", "json")])


def _attested_data_digests() -> dict[str, str]:
    """data version -> content digest the trusted side recorded for it (the launch plan's
    `data_digests`; none on a laptop): the shared cache is PR-writable, so a cached version is
    used only when its content is the attested one (pipelines/dataprep/prepare.py)."""
    from pipelines.launch_plan import launch_plan

    plan = launch_plan()
    found: dict[str, str] = {}
    for entry in plan.experiments if plan is not None else ():
        found |= {str(k): str(v) for k, v in (entry.facts.get("data_digests") or {}).items()}
    return found


def checkpoint_gb(spec: ExperimentSpec) -> float:
    """Disk a run needs for its checkpoints: (keep_last + best + one being written) x
    (weights + AdamW states, 16 bytes/parameter), plus 0.5 GB of slack for logs and export."""
    return (spec.train.keep_last + 2) * 16 * spec.model.parameter_count() / 1e9 + 0.5


@contextlib.contextmanager
def identity_lock(root: Path, key: str) -> Iterator[None]:
    """An exclusive lock per training identity (flock: released if the holder dies)."""
    import fcntl

    locks = root / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with (locks / f"{key}.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _detail(result: Any) -> str:
    if result is None:
        return ""
    if getattr(result, "status", "") == "failed":
        return result.message
    return f"{result.duration_s:.1f}s"


def summary_lines(candidate: ExperimentResult, baseline: ExperimentResult | None, tracking_uri: str) -> list[str]:
    lines = [f"experiment   {candidate.spec.name}  (run dir {candidate.run_dir})"]
    if baseline is not None:
        lines.append(f"baseline     {baseline.spec.name}  (run dir {baseline.run_dir})")
    lines.append(f"hypothesis   {candidate.spec.hypothesis.metric} should {candidate.spec.hypothesis.direction} "
                 f"by >= {candidate.spec.hypothesis.min_effect:.1%} vs {candidate.spec.hypothesis.baseline}")
    if candidate.verdict:
        from reports.verdict import headline

        lines.append(f"verdict      {headline(candidate.verdict, candidate.verdict_reason)}")
    if candidate.report_dir:
        lines.append(f"report       {candidate.report_dir / 'report.md'}")
    if tracking_uri.startswith("sqlite:///"):
        lines.append(f"MLflow UI    mlflow ui --backend-store-uri {tracking_uri}  (then open http://127.0.0.1:5000)")
    else:
        lines.append(f"MLflow       {tracking_uri}")
    return lines


__all__ = ["ExperimentFlow", "ExperimentResult", "Reporter", "RunOptions", "summary_lines"]
