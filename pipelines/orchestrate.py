"""One command, the whole experiment flow: validate -> prepare -> check -> smoke -> train
-> evaluate -> report, for the baseline (first, when it has no finished run with the
current code and data) and the candidate, on the same seeds.

This module decides what to run and in which order; the work itself is done by the data
layer (`validation.data`), the data checks (`validation.data.checks`), the launchers
(`pipelines.launchers`) and `reports`. It does not know what a transformer is.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines import continuation
from pipelines.identity import CodeVersion, RunIdentity, code_version, experiment_key
from pipelines.rundir import finished_training_runs, new_run_dir, runs_root
from pipelines.stages import StageOutcome, StageRunner
from trainer import checkpoint as ckpt
from trainer.tracking import default_tracking_uri
from validation.errors import Detached, PipelineError, TrainingError, UsageError
from validation.files import atomic_write_json, atomic_write_text, read_json
from validation.resolved import RESOLVED_FILE, ResolvedExperiment, resolve
from validation.spec import CHAMPION, ExperimentSpec


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


def _metric_rows(path: Path, metric: str) -> list[tuple[int, float]]:
    """(step, value) of `metric` logged so far in a metrics.jsonl (a torn last line is skipped)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("key") == metric and isinstance(row.get("value"), int | float):
            rows.append((int(row.get("step", 0)), float(row["value"])))
    return sorted(rows)


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
        if resolved.spec.sweep is None:
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
            candidate = self.run_sweep(resolved, baseline)
        else:
            candidate = self.run_one(resolved, role="candidate", baseline=baseline)
        return candidate, baseline

    def _confirmatory_seeds(self, spec_path: Path, resolved: ResolvedExperiment) -> ResolvedExperiment:
        """A claim's confirmatory registration runs on seeds no run of the claim used (a pilot's
        seeds would reuse the pilot's runs); once it exists, the spec's seeds stand (any seed
        outside the registration is exploratory). reports.prereg."""
        from reports import prereg

        spec = resolved.spec
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
        if not spec.hypothesis.pilot:
            entry = prereg.register_confirmatory(root, entry)
        prereg.record_registration(run_dir, entry, results_existed=results_existed)
        prereg.mark_seen(root, claim, seed)
        return claim

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
        self._publish(result, out_dir)
        self.reporter.stage(spec.name, "report", "finished", f"identical to {base.spec.name}")
        return result

    def run_sweep(self, resolved: ResolvedExperiment, baseline: ExperimentResult | None) -> ExperimentResult:
        """Trials on the selection seeds, up to `sweep.parallel` at once, each a normal run (own
        identity, own job on the launcher), pruned by successive halving at their evals; the
        winner is then trained on the hypothesis seeds and judged on those only."""
        from concurrent.futures import ThreadPoolExecutor

        from pipelines import sweep as sw

        spec = resolved.spec
        config = spec.sweep
        assert config is not None
        metric, mode = sw.selection(spec)
        trials = sw.expand_trials(resolved)
        cost = sw.sweep_cost(trials, resolved, baseline.resolved if baseline is not None else None)
        tier = sw.sweep_tier(cost, resolved)
        self.reporter.stage(spec.name, "plan", "finished", f"sweep: {cost.describe()}; tier {tier.name}")
        if tier.name == "refused":
            raise PipelineError(f"sweep {spec.name}: {cost.describe()}: {tier.reason}")
        for trial in trials:  # data once, before trials race for it
            self._prepare(trial.spec)
        total_steps = trials[0].resolved.compute.steps
        pruner = (sw.SuccessiveHalving(mode, config.reduction_factor, min(spec.train.eval_interval, total_steps))
                  if config.prune else None)

        def run_trial(trial: sw.Trial) -> sw.TrialOutcome:
            return self._run_trial(trial, metric, pruner, baseline, total_steps)

        with ThreadPoolExecutor(max_workers=config.parallel, thread_name_prefix="trial") as pool:
            outcomes = list(pool.map(run_trial, trials))
        winner = sw.select_winner(outcomes, mode)
        if winner is None:
            table = sw.render_trials_markdown(outcomes, None, metric, mode, total_steps=total_steps, cost=cost)
            raise TrainingError(f"sweep of {spec.name}: no trial finished\n{table}")
        # The winner, on fresh seeds: none of the hypothesis seeds took part in picking it.
        confirm = sw.winner_experiment(resolved, winner.trial)
        table = sw.render_trials_markdown(outcomes, winner, metric, mode, total_steps=total_steps,
                                          selection=sw.selection_seeds(spec), decided=list(confirm.seeds), cost=cost)
        self.sweep_tables[confirm.spec.name] = table  # the winner's report stage appends it
        chosen = self.run_one(confirm, role="candidate", baseline=baseline)
        chosen.extra.update(sweep_markdown=table, sweep_winner=winner.trial.name, sweep_outcomes=outcomes)
        return chosen

    def _run_trial(self, trial: Any, metric: str, pruner: Any, baseline: ExperimentResult | None,
                   total_steps: int) -> Any:
        """One trial as a normal run; a watcher reports its selection metric at each eval to the
        pruner and cancels the job when the pruner says so (the launcher does not retry a cancel)."""
        import threading

        from pipelines.sweep import TrialOutcome

        spec = trial.spec
        prepared = self._prepare_cached(spec)
        run_dir = new_run_dir(self.repo, spec.name, experiment_key(self.code_for(spec), spec.spec_hash(), prepared.version,
                                                                   list(trial.resolved.seeds)))
        first = run_dir / "train" / f"seed-{trial.resolved.seeds[0]}"
        stop = threading.Event()
        pruned_at: list[int] = []
        if pruner is not None:
            pruner.start(trial.index)

            def watch() -> None:
                while not stop.wait(0.5):
                    for row in _metric_rows(first / "metrics.jsonl", metric):
                        if pruner.report(trial.index, *row):
                            pruned_at.append(row[0])
                            atomic_write_json(first / "pruned.json", {"step": row[0], "metric": metric})
                            self.reporter.stage(spec.name, "train", "pruned", f"at step {row[0]} ({metric} {row[1]:.4g})")
                            self._cancel_quietly(first)
                            return

            threading.Thread(target=watch, name=f"prune-{trial.name}", daemon=True).start()
        try:
            res = self.run_one(trial.resolved, role="trial", baseline=baseline)
        except TrainingError as exc:  # a failed or pruned trial is reported, not hidden
            stop.set()
            if pruned_at:
                if pruner is not None:
                    pruner.finish(trial.index, None, pruned=True)
                # Steps it really trained: a trainer stopped gracefully (SIGTERM) finishes the
                # step under way and checkpoints it, e.g. pruned at 4, checkpoint step 5 on Slurm.
                saved = ckpt.list_checkpoints(first / "checkpoints")
                steps = max(pruned_at[0], saved[0][0] if saved else 0)
                return TrialOutcome(trial, "pruned", None, pruned_at=pruned_at[0], steps_done=steps)
            if pruner is not None:
                pruner.finish(trial.index, None, pruned=False)
            return TrialOutcome(trial, "failed", None, str(exc).splitlines()[0][:200])
        stop.set()
        values, status, detail, steps = [], "finished", "", total_steps
        for d in res.seed_dirs:
            result = read_json(d / "result.json") or {}
            if result.get("status") != "finished":
                status, detail = str(result.get("status")), str(result.get("stop_reason") or "")
            if isinstance(result.get("steps"), int):
                steps = min(steps, int(result["steps"]))
            value = (result.get("final_metrics") or {}).get(metric)
            if value is not None:
                values.append(float(value))
        mean = sum(values) / len(values) if values and status == "finished" else None
        if pruner is not None:
            pruner.finish(trial.index, mean, pruned=False)
        return TrialOutcome(trial, status, mean, detail, steps_done=steps)

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
        prepared = self._prepare(spec)
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

        base_prepared = self._prepare_cached(baseline.spec) if baseline is not None else None
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

    def _prepare(self, spec: ExperimentSpec):  # -> validation.data.PreparedData
        from pipelines.resources import ensure_disk_space
        from validation.data import prepare_data

        ensure_disk_space(self.repo / "data", need_gb=1.0, what="data preparation")
        return prepare_data(spec.data, self.repo, progress=True)

    def _prepare_cached(self, spec: ExperimentSpec):
        from validation.data import prepare_data

        return prepare_data(spec.data, self.repo, progress=False)

    def _check(self, spec: ExperimentSpec, prepared, base_prepared, out_dir: Path) -> StageOutcome:
        from validation.data.checks import run_data_checks

        out_dir.mkdir(parents=True, exist_ok=True)
        result = run_data_checks(spec, prepared, baseline=base_prepared, out_dir=out_dir)
        outputs = {"ok": bool(result.success), "markdown": str(out_dir / "data_check.md"), "json": str(out_dir / "data_check.json")}
        if not result.success:
            from validation.errors import DataCheckFailed

            raise DataCheckFailed(f"data checks failed for {spec.name}; see {out_dir / 'data_check.md'}")
        return StageOutcome(outputs=outputs, artifacts=[(out_dir / "data_check.json", "json"), (out_dir / "data_check.md", "file")])

    def _smoke(self, resolved: ResolvedExperiment, prepared: Any, out_dir: Path) -> StageOutcome:
        from trainer.smoke import run_smoke

        spec = resolved.spec
        out_dir.mkdir(parents=True, exist_ok=True)
        # Details stay in the smoke run's logs/; the console shows warnings only.
        result = run_smoke(resolved, prepared, out_dir / "run", tracking_uri="none", console_level="WARNING")
        if result.get("status") == "passed":
            # A sharded layout also runs 2 CPU processes of its kind (FSDP / TP): a tensor-parallel
            # plan that does not fit the model fails here, in the PR check, not after /train.
            from pipelines.sharded_smoke import run_sharded_smoke

            sharded = run_sharded_smoke(resolved, prepared, out_dir / "sharded")
            if sharded is not None:
                result["sharded"] = sharded
                result["checks"] |= sharded["checks"]
                result["status"] = sharded["status"]
        atomic_write_json(out_dir / "smoke.json", result)
        if result.get("status") != "passed":
            failed = [k for k, ok in result.get("checks", {}).items() if not ok]
            error = (result.get("sharded") or {}).get("error")
            raise TrainingError(f"smoke run of {spec.name} failed: {', '.join(failed) or 'see ' + str(out_dir)}"
                                + (f": {error}" if error else ""))
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

        existing = finished_training_runs(self.repo).get(identity.key)
        if existing is not None and not self.options.force:
            self.reporter.stage(spec.name, "train", "reused", f"seed {seed}: {existing}")
            if role != "baseline":  # its hypothesis meets results that already exist: say so
                register_hypothesis(existing, spec.name, spec.hypothesis, resolved.seeds, results_existed=True)
            if role == "candidate":
                self._register_claim(resolved, seed, existing, results_existed=True)
            return existing, True
        seed_dir = run_dir / "train" / f"seed-{seed}"
        seeded = resolved.for_seed(seed)
        cont = self._continuation(seeded, seed, identity, seed_dir) if role == "candidate" else None
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
                             hypothesis_registered=json.dumps(registered["hypothesis"], sort_keys=True),
                             **(cont.record() if cont is not None else {})),
        )
        if cont is not None and continuation.seed_run(cont, seed_dir):
            self.reporter.stage(spec.name, "train", "continued", f"seed {seed} from {cont.checkpoint} "
                                f"({continuation.describe(cont.before)} -> {continuation.describe(cont.after)})")
        from pipelines.launchers import get_launcher, job_from_spec, run_with_retries

        job = job_from_spec(
            seeded.spec, spec_path=seed_dir / RESOLVED_FILE, run_dir=seed_dir, data_dir=prepared.path,
            tracking_uri=self.tracking_uri, env={"MLFLOW_TRACKING_URI": self.tracking_uri},
        )
        total = resolved.compute.steps
        running = self._still_running(seed_dir)
        if self.options.detach:
            if running is None:
                from pipelines.resources import ensure_disk_space

                ensure_disk_space(seed_dir, need_gb=checkpoint_gb(spec), what=f"training {spec.name}")
                running = get_launcher(launcher).submit(job)
            self.detached.append((spec.name, seed, seed_dir, running.launcher, running.job_id))
            return seed_dir, False
        done = self.reporter.training(f"{spec.name} seed {seed}", seed_dir, total)
        stop_live = self._live_comment(spec, seed_dir, total)
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
            self._cancel_quietly(seed_dir)
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
            status = result.get("status") if result else "no result.json"
            reason = (result or {}).get("reason") or (result or {}).get("message") or getattr(state, "detail", "")
            raise TrainingError(f"training {spec.name} seed {seed} ended '{status}': {reason} (logs: {seed_dir / 'logs'})")
        return seed_dir, False

    def _continuation(self, seeded: ResolvedExperiment, seed: int, identity: RunIdentity,
                      seed_dir: Path) -> continuation.Continuation | None:
        """With --continue-from: the checked plan to continue that run's seed (UsageError, one
        line, when it cannot be). Without: None, after saying so when a run of the same work
        has checkpoints under another layout and this one would start at step 0."""
        went_on = continuation.continued_in(seed_dir)
        if went_on is not None:  # resuming here too would write a second future into its MLflow run
            raise UsageError(f"{seed_dir} was continued in {went_on} under another layout; "
                             f"go on there (--continue-from {went_on} with that layout's file)")
        source_dir = self.options.continue_from
        if source_dir is None:
            if not ckpt.list_checkpoints(seed_dir / "checkpoints"):
                hint = continuation.other_layout_hint(
                    runs_root(self.repo), seeded, seed=seed, code_version=identity.code.tree,
                    data_version=identity.data_version, spec_file=seeded.spec_file, exclude=seed_dir)
                if hint:
                    self.reporter.stage(seeded.spec.name, "train", "warning", hint)
            return None
        sources = continuation.seed_dirs(source_dir)
        if seed not in sources:
            if not sources:
                raise UsageError(f"--continue-from {source_dir}: no training run there")
            self.reporter.stage(seeded.spec.name, "train", "warning",
                                f"seed {seed}: {source_dir} has no run of it; it starts at step 0")
            return None
        if (self._still_running(sources[seed])) is not None:
            raise UsageError(f"cannot continue {sources[seed]}: its job is still running; "
                             f"stop it first (pipeline cancel {sources[seed]})")
        return continuation.plan(sources[seed], seeded, code_version=identity.code.tree,
                                 data_version=identity.data_version, seed=seed, tracking_uri=self.tracking_uri,
                                 target=seed_dir)

    @staticmethod
    def _still_running(seed_dir: Path):
        """The handle of a job launched earlier for `seed_dir` that has not ended, else None."""
        from pipelines.launchers import get_launcher, handle_for_run

        if not (seed_dir / "launch.json").exists() or (seed_dir / "result.json").exists():
            return None
        try:
            handle = handle_for_run(seed_dir)
            state = get_launcher(handle.launcher).poll(handle)
        except PipelineError:
            return None
        return None if state.done else handle

    def _live_comment(self, spec: ExperimentSpec, seed_dir: Path, total: int) -> Callable[[], None]:
        """While training for a PR, update its sticky comment with step, ETA and live loss."""
        if not (self.options.pr and os.environ.get("GITHUB_TOKEN") and os.environ.get("GITHUB_REPOSITORY")):
            return lambda: None
        import threading

        from pipelines.github.client import GitHubConfig, PyGithubHost
        from pipelines.github.comment import StickyComment
        from reports.render import render_status

        config = GitHubConfig.from_env(os.environ["GITHUB_REPOSITORY"])
        comment = StickyComment.for_experiment(PyGithubHost(config), self.options.pr, spec.name,
                                               author=config.bot_login)
        stop = threading.Event()
        interval = float(os.environ.get("PIPELINE_COMMENT_INTERVAL_S", "60"))
        started = time.time()

        def follow() -> None:
            while not stop.wait(interval):
                step, loss = latest_loss(seed_dir / "metrics.jsonl")
                if step is None:
                    continue
                elapsed = time.time() - started
                eta = elapsed / step * (total - step) if step else None
                try:
                    comment.upsert(render_status("training", experiment=spec.name, step=step, total_steps=total,
                                                 eta_s=eta, loss=loss), {"stage": "training"})
                except PipelineError:
                    pass  # progress is best effort; the final report is what must land

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()

        def finish() -> None:
            stop.set()
            thread.join(timeout=5)

        return finish

    @staticmethod
    def _cancel_quietly(seed_dir: Path) -> None:
        from pipelines.launchers import get_launcher, handle_for_run

        if not (seed_dir / "launch.json").exists() or (seed_dir / "result.json").exists():
            return
        try:
            handle = handle_for_run(seed_dir)
            get_launcher(handle.launcher).cancel(handle)
        except Exception:  # best effort while already failing; the original error is re-raised
            pass

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
            baseline_dirs=baseline.seed_dirs if baseline else self._champion_records(candidate.spec),
            spec=candidate.spec,
            experiment=candidate.spec.name,
            baseline_name=baseline.spec.name if baseline else None,  # champion: its run's experiment
            out_dir=out_dir,
            mlflow_url=os.environ.get("PIPELINE_MLFLOW_PUBLIC_URL"),
            mlflow_client=self._mlflow_client(),
        )
        table = candidate.extra.get("sweep_markdown") or self.sweep_tables.get(candidate.spec.name)
        if table:
            md = out_dir / "report.md"
            atomic_write_text(md, md.read_text(encoding="utf-8").rstrip("\n") + "\n\n" + table)
        from trainer.tracking import spool_notice

        notice = spool_notice(list(candidate.seed_dirs) + list(baseline.seed_dirs if baseline else []))
        if notice:  # MLflow was down: say so in the comment, with the command that fixes it
            md = out_dir / "report.md"
            atomic_write_text(md, md.read_text(encoding="utf-8").rstrip("\n") + "\n\n" + notice)
            replay = [line for line in notice.splitlines() if line.startswith("pipeline replay-metrics")]
            self.reporter.stage(candidate.spec.name, "report", "warning",
                                f"MLflow unreachable: metrics spooled; send them with `{replay[0]}`")
        comment = self._publish(candidate, out_dir)
        verdict = getattr(report, "verdict", None)
        self._tag_verdict(candidate, getattr(verdict, "outcome", None))
        outputs = {
            "report_dir": str(out_dir),
            "verdict": getattr(verdict, "outcome", None) or getattr(verdict, "label", None) or str(verdict),
            "verdict_reason": getattr(verdict, "reason", ""),
            "comment": str(comment) if comment else None,
        }
        return StageOutcome(outputs=outputs, artifacts=[(out_dir / "report.md", "file"), (out_dir / "result.json", "json")])

    def _mlflow_client(self):
        """A client for the tracking store, or None when it cannot be reached (the report still
        gets written; MLflow gets it on the next run)."""
        from trainer.tracking import reachable_client

        # Bounded (trainer.tracking.MLFLOW_HTTP_POLICY) and remembered: a dead server costs one
        # short attempt for the whole report stage, not minutes per lookup.
        return reachable_client(self.tracking_uri)

    def _champion_records(self, spec: ExperimentSpec) -> list:
        """The promoted model's training run (registry alias `champion`) as the baseline, when
        the hypothesis names `champion` and the registry has one; [] otherwise (the report then
        says there is no baseline run)."""
        if spec.hypothesis.baseline != CHAMPION:
            return []
        client = self._mlflow_client()
        if client is None:
            return []
        from reports.records import records_from_mlflow

        name = os.environ.get("PIPELINE_REGISTRY_MODEL", "gitops-train")
        try:
            version = client.get_model_version_by_alias(name, CHAMPION)
            # The version belongs to its attestation run; the metrics live in the training run.
            run_id = (version.tags or {}).get("pipeline.training_run_id") or version.run_id
            run = client.get_run(run_id)
            experiment = client.get_experiment(run.info.experiment_id).name
            return records_from_mlflow(client, experiment, f"attributes.run_id = '{run_id}'")
        except Exception:  # no registered model or alias yet: nothing to compare against
            return []

    def _tag_verdict(self, candidate: ExperimentResult, outcome: str | None) -> None:
        """Record the verdict on every candidate MLflow run: promotion reads it from there."""
        client = self._mlflow_client()
        if client is None or outcome is None:
            return
        for d in candidate.seed_dirs:
            run_id = (read_json(d / "result.json") or {}).get("mlflow_run_id")
            # Only runs the candidate trained: a run reused from another experiment with the same
            # identity (its baseline, in an A/A case) must not carry the candidate's verdict.
            trained_for = (read_json(d / "identity.json") or {}).get("experiment")
            if run_id and trained_for in (None, candidate.spec.name):
                try:
                    client.set_tag(run_id, "pipeline.verdict", str(outcome))
                    # Provenance for promotion (pipelines/github/promote.py): the PR and the
                    # train workflow's run, which promotion checks against the GitHub API.
                    if self.options.pr:
                        client.set_tag(run_id, "pipeline.pr", str(self.options.pr))
                    if os.environ.get("GITHUB_ACTIONS") == "true" and os.environ.get("GITHUB_RUN_ID", "").isdigit():
                        client.set_tag(run_id, "pipeline.github_run_id", os.environ["GITHUB_RUN_ID"])
                except Exception:  # best effort, see _mlflow_client
                    pass

    def _publish(self, candidate: ExperimentResult, report_dir: Path) -> Path | None:
        """Update the sticky comment: on GitHub when a PR and a token are known, else a local file."""
        from pipelines.github.client import DryRunCodeHost, GitHubConfig, PyGithubHost
        from pipelines.github.comment import StickyComment

        body = (report_dir / "report.md").read_text(encoding="utf-8")
        export = os.environ.get("PIPELINE_REPORT_EXPORT")
        if export:
            # In the train workflow: a short job after training posts this with a fresh token
            # (the training job's GITHUB_TOKEN lives at most 24 h; a training may take 72).
            Path(export).mkdir(parents=True, exist_ok=True)
            atomic_write_text(Path(export) / "report.md", body)
            if (report_dir / "result.json").is_file():  # the candidate runs and verdict, for the attest job
                atomic_write_text(Path(export) / "result.json", (report_dir / "result.json").read_text(encoding="utf-8"))
            return Path(export) / "report.md"
        state = {"stage": "report"} | ({"validated_sha": self.options.sha} if self.options.sha else {})
        if self.options.pr and os.environ.get("GITHUB_TOKEN") and os.environ.get("GITHUB_REPOSITORY"):
            config = GitHubConfig.from_env(os.environ["GITHUB_REPOSITORY"])
            StickyComment.for_experiment(PyGithubHost(config), self.options.pr, candidate.spec.name,
                                         author=config.bot_login).upsert(body, state)
            return None
        host = DryRunCodeHost(report_dir / "comments")
        posted = StickyComment.for_experiment(host, self.options.pr or 0, candidate.spec.name,
                                              author=host.bot_login).upsert(body, state)
        path = Path(host.path_of(posted))
        atomic_write_text(report_dir / "comment.md", path.read_text(encoding="utf-8"))
        return report_dir / "comment.md"


def checkpoint_gb(spec: ExperimentSpec) -> float:
    """Disk a run needs for its checkpoints: (keep_last + best + one being written) x
    (weights + AdamW states, 16 bytes/parameter), plus 0.5 GB of slack for logs and export."""
    return (spec.train.keep_last + 2) * 16 * spec.model.parameter_count() / 1e9 + 0.5


def latest_loss(metrics: Path) -> tuple[int | None, float | None]:
    """The last (step, train/loss) in a metrics.jsonl (a torn last line is ignored)."""
    step = loss = None
    try:
        lines = metrics.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None, None
    for line in lines:
        try:
            point = json.loads(line)
        except ValueError:
            continue
        if point.get("key") == "train/loss":
            step, loss = int(point["step"]), float(point["value"])
    return step, loss


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
