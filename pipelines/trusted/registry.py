"""The trusted registry: what every GPU job may reuse and which seeds a claim gets, decided by
default-branch code before any PR code runs, and kept where only the attestor writes.

The store is the MLflow provenance experiment (`pipelines.trusted.provenance`): the training
job's credential can only read it. Beside the attestations it holds append-only records, each
one MLflow run tagged `pipeline.registry=<kind>`:

- `run`: one attested training run: its identity (`pipeline.identity`, code version, spec
  hash, data version, seed), experiment, role, claim, the training run id, and a snapshot of
  its final metrics (metrics of the record run itself, which the trainer cannot rewrite);
- `registration`: a claim's confirmatory registration (`reports.prereg.claim_entry`: the
  hypothesis fields, the seeds, when training started, the pull request). The earliest one per
  claim *and pull request* is in force for that pull request only: another PR's registration of
  the same public configuration (with its own metric, direction, min_effect, alpha or seeds)
  never sets this PR's decision rule;
- `seeds`: the seeds one launch of a claim used, confirmatory or not. They are per claim, across
  pull requests: a seed any look at the configuration used is never a fresh seed again, so no
  PR can register the lucky seeds of another PR's reruns ("best of k reruns").

Before launch the `plan` job (trusted, GitHub-hosted, the approved commit checked out as data)
calls `plan_launch`: per experiment, the claim's kind for this launch (`decide`), its seeds,
and the attested runs that may be reused by role. The plan reaches the GPU job as a file
(`PIPELINE_LAUNCH_PLAN`): the flow runs on the plan's seeds and reuses from MLflow only the
runs it names (`pipelines.tracked_runs`). After training, the attest job records the plan's
registration (if the claim had none) and seeds, and a `run` record per attested run
(`record_launch`), so the next launch's plan sees them.

A rename, a new base seed or more seeds after a claim's confirmatory registration by the same
pull request are the same claim (`reports.prereg.claim_key`), planned `exploratory`: the
headline stays the registration's; the new runs are shown beside it and decide nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from basics.errors import UsageError
from pipelines.launch_plan import (  # the plan's data types, shared with the training side
    CONFIRMATORY,
    EXPLORATORY,
    PILOT,
    PLAN_ENV,
    ExperimentPlan,
    LaunchPlan,
    launch_plan,
)

PROVENANCE_EXPERIMENT = "pipeline-provenance"
ATTESTED_BY = "experiment-train.yml/attest"
VERDICTS = frozenset({"supported", "refuted", "inconclusive"})
_SHA = re.compile(r"^[0-9a-f]{40}$")
# Experiment names are validated slugs (basics/files.py); they go into a filter string.
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")

KIND_TAG = "pipeline.registry"
_HEX = re.compile(r"^[0-9a-f]{8,64}$")


# --------------------------------------------------------------------------- the decision (pure)


def decide(*, experiment: str, claim: str, pilot: bool, base_seed: int, n_seeds: int, spec_seeds: list[int],
           entry: dict[str, Any], registration: dict[str, Any] | None, seen: set[int],
           others: Sequence[int] = ()) -> ExperimentPlan:
    """One experiment's kind and seeds for this launch, from the trusted registry's view of its
    claim. `entry` is the registration this launch would make (`reports.prereg.claim_entry`),
    `registration` this pull request's own in force (None: it has none), `seen` every seed any
    launch of the claim used (every pull request's), `others` the pull requests that registered
    the claim too (their rules decide nothing here).

    - pilot: its own seeds, exploratory by construction;
    - no registration yet: confirmatory, on the first seeds from the spec's base seed that no
      run of the claim used (a pilot's or an earlier rerun's seeds would reuse their runs);
    - a registration exists: the spec's seeds; confirmatory only if they are the
      registration's own (a retry of the same launch), else exploratory: a rename, a new base
      seed or added seeds cannot make a new headline for the claim."""
    if pilot:
        return ExperimentPlan(experiment, claim, PILOT, tuple(spec_seeds), registration,
                              reason="pilot: exploratory, decides nothing")
    if registration is None:
        from reports.prereg import fresh_seeds

        seeds = fresh_seeds(base_seed, n_seeds, seen)
        also = sorted(set(others))
        note = (f"; pull request(s) {', '.join(f'#{n}' for n in also)} registered this configuration too: their "
                "rules decide nothing here and the seeds they used are not reused") if also else ""
        return ExperimentPlan(experiment, claim, CONFIRMATORY, tuple(seeds), {**entry, "seed_list": seeds},
                              new_registration=True,
                              reason=(f"first registration of the claim by this pull request, on seeds no run of it "
                                      f"used ({_seeds(seeds)}){note}"))
    registered = [int(s) for s in registration.get("seed_list") or []]
    if set(spec_seeds) <= set(registered):
        return ExperimentPlan(experiment, claim, CONFIRMATORY, tuple(spec_seeds), registration,
                              reason=f"the claim's registration ({_seeds(registered)}) is continued")
    return ExperimentPlan(
        experiment, claim, EXPLORATORY, tuple(spec_seeds), registration,
        reason=(f"the claim was registered as `{registration.get('experiment')}` on seeds {_seeds(registered)} at "
                f"{registration.get('registered_at')}: seeds {_seeds(spec_seeds)} are exploratory; the headline "
                "stays that registration's"))


def plan_claim(registry: TrustedRegistry | None, spec: Any, spec_seeds: Sequence[int], *, pr: int,
               now: float) -> ExperimentPlan:
    """`decide` for one experiment spec against the registry's view of its claim (no registry:
    every claim unregistered)."""
    from dataclasses import replace

    from reports import prereg

    claim = prereg.claim_key(spec)
    made = registry.registrations(claim) if registry is not None else []
    # This pull request's own registration only: the configuration is public, and another PR
    # registering it first must not choose this PR's metric, direction, min_effect, alpha or seeds.
    own = [entry for by, entry in made if by == pr]
    registration = min(own, key=lambda e: float(e.get("registered_at_s") or 0.0)) if own else None
    seen = registry.seen_seeds(claim) if registry is not None else set()
    entry = prereg.claim_entry(claim, spec.name, spec.hypothesis, spec_seeds, pilot=spec.hypothesis.pilot, now=now,
                               pr=pr)
    others = sorted({by for by, _ in made if by != pr})
    plan = decide(experiment=spec.name, claim=claim, pilot=spec.hypothesis.pilot, base_seed=spec.train.seed,
                  n_seeds=spec.hypothesis.seeds, spec_seeds=list(spec_seeds), entry=entry,
                  registration=registration, seen=seen, others=others)
    # Looks at the same configuration by other pull requests: they decide nothing here, but the
    # comment names them, so reviewers see a configuration tried in several pull requests.
    return replace(plan, facts={**plan.facts, "other_prs": others}) if others else plan


def _seeds(seeds: list[int] | tuple[int, ...]) -> str:
    return ", ".join(str(s) for s in seeds)


def reusable(records: list[dict[str, Any]], *, code_version: str, spec_hash: str, seeds: list[int] | tuple[int, ...],
             code_tree: str) -> tuple[str, ...]:
    """Training run ids of attested `run` records this launch may reuse: same code version,
    spec hash and one of the seeds, made either by trusted code (the commit's code outside
    `experiments/` was the default branch's at attestation) or by this very code (`code_tree`).
    A run made by a PR that changed code the identity does not cover (pipelines/, reports/)
    is reused only by launches of that same code."""
    wanted = {int(s) for s in seeds}
    out = [r["training_run_id"] for r in records
           if r.get("code_version") == code_version and r.get("spec_hash") == spec_hash
           and int(r.get("seed", -1)) in wanted
           and (r.get("trusted_code") == "true" or r.get("code_tree") == code_tree)]
    return tuple(dict.fromkeys(out))


def code_tree(checkout: Path) -> str:
    """A hash of the commit's tree outside `experiments/` (git objects only; nothing is run)."""
    import hashlib
    import subprocess

    listing = subprocess.run(["git", "-C", str(checkout), "ls-tree", "HEAD"], capture_output=True, text=True,
                             check=True, timeout=60).stdout
    kept = [line for line in listing.splitlines() if line.split("\t", 1)[-1] != "experiments"]
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()[:16]


def trusted_code_at(default_checkout: Path, plan: ExperimentPlan) -> bool:
    """Whether the planned commit's code outside experiments/ is the default branch's (checked
    out in `default_checkout`, the attest job's working directory)."""
    import subprocess

    try:
        return bool(plan.facts.get("code_tree")) and code_tree(default_checkout) == plan.facts["code_tree"]
    except (OSError, subprocess.SubprocessError):
        return False


# --------------------------------------------------------------------------- the store (MLflow)


class TrustedRegistry:
    """Records in the provenance experiment (written by the attestor only; read by anyone)."""

    def __init__(self, client: Any, store_id: str):
        self.client = client
        self.store_id = store_id

    def _records(self, kind: str, **tags: str) -> list[Any]:
        for value in tags.values():
            assert _HEX.match(value), "hex keys only: they go into a filter string"
        query = " and ".join([f"tags.`{KIND_TAG}` = '{kind}'", "attributes.status = 'FINISHED'",
                              *(f"tags.`pipeline.{k}` = '{v}'" for k, v in tags.items())])
        return list(self.client.search_runs([self.store_id], filter_string=query, max_results=5000,
                                            order_by=["attributes.start_time ASC"]))

    def registrations(self, claim: str) -> list[tuple[int, dict[str, Any]]]:
        """(pull request, registration) of every confirmatory registration of the claim, oldest
        first; the pull request is the attestor's tag, never a field the entry carries."""
        found = []
        for run in self._records("registration", claim=claim):
            try:
                entry = json.loads(run.data.tags.get("pipeline.registration", ""))
            except ValueError:
                continue
            pr = run.data.tags.get("pipeline.pr", "")
            if isinstance(entry, dict) and entry.get("claim") == claim and pr.isdigit():
                found.append((int(pr), entry))
        return sorted(found, key=lambda f: float(f[1].get("registered_at_s") or 0.0))

    def registration(self, claim: str, *, pr: int) -> dict[str, Any] | None:
        """The registration in force for pull request `pr`: the earliest that PR made."""
        return next((entry for by, entry in self.registrations(claim) if by == pr), None)

    def seen_seeds(self, claim: str) -> set[int]:
        """Every seed any launch of the claim used (planned seeds and attested runs)."""
        seen: set[int] = set()
        for run in self._records("seeds", claim=claim) + self._records("run", claim=claim):
            for part in run.data.tags.get("pipeline.seeds", run.data.tags.get("pipeline.seed", "")).split(","):
                if part.strip().lstrip("-").isdigit():
                    seen.add(int(part))
        return seen

    def runs(self, *, code_version: str, spec_hash: str) -> list[dict[str, Any]]:
        """Attested training runs of one configuration, with their metrics as attested."""
        return [_run_record(r) for r in self._records("run", code_version=code_version, spec_hash=spec_hash)]

    def runs_by_training_run(self, training_run_id: str) -> list[dict[str, Any]]:
        """The `run` records of one training run (its metrics as first attested)."""
        return [_run_record(r) for r in self._records("run", training_run_id=training_run_id)]

    def record_launch(self, plan: ExperimentPlan, *, pr: int, sha: str, attestation_run_id: str | None,
                      runs: list[dict[str, Any]], trusted_code: bool, tree: str) -> None:
        """After training (the attest job): the plan's registration (a new one; the earliest per
        claim and pull request is in force for that pull request), the seeds it used, and one
        record per attested training run."""
        common = {"pipeline.pr": str(pr), "pipeline.sha": sha, "pipeline.claim": plan.claim,
                  "pipeline.experiment": plan.experiment, "pipeline.attestation_run_id": attestation_run_id or ""}
        if plan.new_registration and plan.registration is not None:
            self._write("registration", {**common, "pipeline.registration": json.dumps(plan.registration, sort_keys=True)})
        self._write("seeds", {**common, "pipeline.seeds": ",".join(map(str, plan.seeds)), "pipeline.kind": plan.kind})
        for run in runs:
            tags = {**common, **{f"pipeline.{k}": str(run[k]) for k in RUN_FIELDS if run.get(k) is not None},
                    "pipeline.claim": plan.claim if run.get("role") == "candidate" else "",
                    "pipeline.trusted_code": "true" if trusted_code else "false", "pipeline.code_tree": tree}
            self._write("run", tags, metrics=run.get("metrics") or {})

    def _write(self, kind: str, tags: dict[str, str], metrics: Mapping[str, float] | None = None) -> None:
        run = self.client.create_run(self.store_id, tags={**tags, KIND_TAG: kind},
                                     run_name=f"{kind}-{tags.get('pipeline.experiment', '')}")
        for key, value in (metrics or {}).items():
            self.client.log_metric(run.info.run_id, key, float(value))
        self.client.set_terminated(run.info.run_id, "FINISHED")


def _run_record(run: Any) -> dict[str, Any]:
    tags = {k.removeprefix("pipeline."): v for k, v in run.data.tags.items() if k.startswith("pipeline.")}
    return {**tags, "metrics": dict(run.data.metrics), "record_run_id": run.info.run_id}


RUN_FIELDS = ("training_run_id", "identity", "code_version", "spec_hash", "data_version", "data_digest", "seed",
              "role")
"""What a `run` record keeps of an attested training run (besides its metrics)."""


def training_run_facts(client: Any, run_id: str) -> dict[str, Any]:
    """What the attest job records of one training run: its identity tags (the trainer wrote
    them; checked against the plan by `check_run_facts`) and its final metrics, as they are now."""
    run = client.get_run(run_id)
    tags = run.data.tags
    facts: dict[str, Any] = {k: tags.get(f"pipeline.{k}") for k in RUN_FIELDS if k != "training_run_id"}
    facts = {k: v for k, v in facts.items() if v is not None or k != "data_digest"}
    return {**facts, "training_run_id": run_id, "metrics": dict(run.data.metrics)}


def check_run_facts(facts: Mapping[str, Any], *, code_version: str, spec_hashes: set[str]) -> list[str]:
    """Why a training run cannot be recorded as reusable ([] = it can): its identity must be
    the hash of its parts, on the code version and a spec hash the plan computed."""
    from pipelines.identity import CodeVersion, RunIdentity

    problems = []
    if facts.get("code_version") != code_version:
        problems.append(f"run {facts.get('training_run_id')} claims code version {facts.get('code_version')}, "
                        f"the commit's is {code_version}")
    if facts.get("spec_hash") not in spec_hashes:
        problems.append(f"run {facts.get('training_run_id')} claims a spec hash the plan did not compute")
    try:
        key = RunIdentity("", int(facts["seed"]), CodeVersion("", str(facts["code_version"]), False, ""),
                          str(facts["spec_hash"]), str(facts["data_version"])).key
    except (KeyError, TypeError, ValueError):
        key = None
    if key is None or key != facts.get("identity"):
        problems.append(f"run {facts.get('training_run_id')}: its identity is not the hash of its parts")
    return problems


# --------------------------------------------------------------------------- after training (attest job)


@dataclass(frozen=True)
class TrustedVerdict:
    """The verdict trusted code computed from attested metrics against the claim's registration."""

    outcome: str
    reason: str
    kind: str
    reported: str | None
    """What the trained commit's own report said."""
    seeds: tuple[int, ...] = ()
    """The seeds of the attested candidate runs the verdict was computed from."""
    sweep_trials: int = 0
    """A sweep's number of trials (0: not a sweep)."""
    winner: str = ""
    """A sweep's winning trial, whose configuration the attested candidate runs have."""
    other_prs: tuple[int, ...] = ()
    """Other pull requests that registered the same claim (each its own test, on its own seeds)."""

    @property
    def differs(self) -> bool:
        return self.reported != self.outcome

    def attested(self) -> str:
        """What the verdict was computed from, in one sentence (validated names and numbers only)."""
        runs = f"the candidate's runs on seed(s) {_seeds(self.seeds)}" if self.seeds else "no candidate run"
        if self.sweep_trials:
            runs = (f"the sweep's winner{f' `{self.winner}`' if self.winner else ''} of {self.sweep_trials} trials, "
                    f"trained again: {runs} (the trials picked it on their own seeds and decide nothing)")
        return (f"Attested by this launch's trusted attest job from the metrics of {runs}, against the baseline on "
                "the same seeds: this is the verdict promotion uses.")

    def headline(self) -> str:
        """The comment's first line about the verdict and what was attested (markdown; every part
        is validated or ours)."""
        line = f"**Verdict (trusted, from attested metrics): {self.outcome}**"
        if self.kind == EXPLORATORY:
            line += " (this launch was exploratory: the claim's registration decides)"
        line += f"\n\n{self.attested()}"
        if self.other_prs:
            line += (f" Pull request(s) {', '.join(f'#{n}' for n in self.other_prs)} registered this configuration "
                     "too: each is its own test on its own seeds, and none of theirs is one of this launch's.")
        if self.differs:
            line += (f"\n\n> The pull request's own report says `{self.reported or 'no verdict'}`; it was computed by "
                     "the pull request's code and is not the verdict promotion uses.")
        return line


def _ids(result: Mapping[str, Any], key: str) -> list[str]:
    out = []
    for entry in result.get(key) or ():
        rid = entry.get("mlflow_run_id") if isinstance(entry, Mapping) else None
        if isinstance(rid, str) and re.fullmatch(r"[0-9a-f]{32}", rid) and rid not in out:
            out.append(rid)
    return out


def attested_facts(client: Any, registry: TrustedRegistry | None, plan: ExperimentPlan, result: Mapping[str, Any], *,
                   sha: str, workflow_run_id: int, attempt: int = 1,
                   server: bool = True) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """role -> facts of each run the report names (reused runs: the metrics attested earlier;
    runs trained by this job: as they are now, checked against the plan), and the problems."""
    from pipelines.trusted.job_identity import is_job_experiment

    by_role: dict[str, list[dict[str, Any]]] = {"candidate": [], "baseline": []}
    problems: list[str] = []
    champion = _champion_run(client) if "baseline" not in plan.facts else None
    for role, key in (("candidate", "candidate_runs"), ("baseline", "baseline_runs")):
        expected = plan.facts.get(role) or {}
        for rid in _ids(result, key):
            if role == "baseline" and champion is not None:  # `baseline: champion`: the promoted run only
                if rid == champion:
                    earlier = registry.runs_by_training_run(rid) if registry is not None else []
                    by_role[role].append({**(earlier[0] if earlier else training_run_facts(client, rid)), "reused": True})
                else:
                    problems.append(f"run {rid} is not the champion's training run")
                continue
            if rid in plan.reuse.get(role, ()) and registry is not None:
                earlier = [r for c in configurations(expected)
                           for r in registry.runs(code_version=c["code_version"], spec_hash=c["spec_hash"])
                           if r.get("training_run_id") == rid]
                if earlier:
                    by_role[role].append({**earlier[0], "reused": True})
                    continue
            facts = training_run_facts(client, rid)
            run = client.get_run(rid)
            tags = run.data.tags
            # One of the configurations the plan computed (a sweep's: any trial's, as its winner).
            same_code = [c for c in configurations(expected) if c["code_version"] == facts.get("code_version")]
            own = check_run_facts(facts, code_version=str((same_code or configurations(expected) or [{}])[0]
                                                          .get("code_version")),
                                  spec_hashes={str(c["spec_hash"]) for c in same_code})
            own += data_digest_problems(facts, plan)
            # This launch's: in its own job experiment (made by the trusted job-identity job, only
            # this launch's identity can write there). A tag naming the workflow run is the job's
            # to write, so on a server it proves nothing; a local store has one identity.
            exp_name = client.get_experiment(run.info.experiment_id).name
            in_job = is_job_experiment(exp_name, plan.experiment, workflow_run_id, attempt)
            if not server:
                in_job = in_job or tags.get("pipeline.github_run_id") == str(workflow_run_id)
            if tags.get("pipeline.git_sha") != sha or not in_job:
                own.append(f"run {rid} was not trained by this job (commit {sha[:12]}, workflow run {workflow_run_id})")
            problems += own
            if not own:
                by_role[role].append({**facts, "role": role})
    judged = {str(f.get("spec_hash")) for f in by_role["candidate"]}
    if len(judged) > 1:  # a sweep's verdict judges its one winner: several winners is a best of k
        problems.append(f"the report names candidate runs of {len(judged)} configurations; the verdict judges one "
                        "(the sweep's winner): no candidate run counts")
        by_role["candidate"] = []
    return by_role, problems


def _champion_run(client: Any) -> str | None:
    """The training run behind the registered model's `champion` alias (the attestor reads it)."""
    from validation.spec import CHAMPION

    try:
        version = client.get_model_version_by_alias(os.environ.get("PIPELINE_REGISTRY_MODEL", "gitops-train"), CHAMPION)
    except Exception:  # noqa: BLE001 - no model or no alias yet: no champion to compare with
        return None
    run_id = (version.tags or {}).get("pipeline.training_run_id") or version.run_id
    return str(run_id) if run_id else None


def trusted_verdict(plan: ExperimentPlan, facts: Mapping[str, list[dict[str, Any]]], hypothesis: Mapping[str, Any],
                    reported: str | None) -> TrustedVerdict:
    """The verdict from attested metrics against the registration the plan carries (pure):
    the candidate's runs decide only on the registration's seeds (`reports.prereg`)."""
    from reports import prereg
    from reports.compare import HypothesisView
    from reports.records import RunRecord
    from reports.report import make_report

    try:
        import numpy  # noqa: F401
        import scipy.stats  # noqa: F401
    except ImportError:  # fail closed: no attestation with the report's own verdict in its place
        raise UsageError("the trusted verdict needs numpy and scipy in this job's environment "
                         "(constraints/github-jobs.in)") from None
    registration = plan.registration
    view = HypothesisView.of({**hypothesis, **((registration or {}).get("hypothesis") or {})})

    def records(role: str) -> list[RunRecord]:
        out = []
        key = prereg.CLAIM_PREFIX + plan.claim
        regs: dict[str, Any] = {}
        if role == "candidate" and plan.kind == PILOT:
            regs = {key: {"kind": PILOT, "seed_list": list(plan.seeds), "claim": plan.claim, "registered_at_s": 0.0}}
        elif role == "candidate" and registration is not None:
            regs = {key: {**registration, "results_existed": False}}
        for f in facts.get(role, ()):
            out.append(RunRecord(str(f.get("training_run_id")), plan.experiment if role == "candidate" else "baseline",
                                 int(f["seed"]) if str(f.get("seed", "")).lstrip("-").isdigit() else None, "finished",
                                 {k: float(v) for k, v in (f.get("metrics") or {}).items()}, registrations=regs))
        return out

    candidates = records("candidate")
    trials = int((plan.facts.get("sweep") or {}).get("trials") or 0)
    judged = {str(f.get("spec_hash")) for f in facts.get("candidate", ())}
    winner = next((str(c.get("trial", "")) for c in configurations(plan.facts.get("candidate") or {})
                   if c["spec_hash"] in judged), "") if trials else ""
    seeds = tuple(sorted({r.seed for r in candidates if r.seed is not None}))
    winner = winner if _NAME.match(winner) else ""
    others = tuple(int(n) for n in plan.facts.get("other_prs") or () if str(n).isdigit())
    if not candidates:
        return TrustedVerdict("inconclusive", "no attested candidate run", plan.kind, reported, seeds, trials, winner,
                              others)
    report = make_report(candidates, records("baseline"), view, experiment=plan.experiment, claim=plan.claim)
    return TrustedVerdict(report.verdict.outcome, report.verdict.reason, plan.kind, reported, seeds, trials, winner,
                          others)


def attested_verdict(client: Any, store: str, *, experiment: str, sha: str, workflow_run_id: int) -> TrustedVerdict | None:
    """The verdict the attest job of this workflow run recorded for `experiment` at `sha`
    (None when it recorded none, or recorded the report's own: no plan was given)."""
    assert _SHA.match(sha) and _NAME.match(experiment), "validated values only: they go into a filter string"
    runs = client.search_runs([store], filter_string=(
        f"tags.`pipeline.sha` = '{sha}' and tags.`pipeline.experiment` = '{experiment}' and "
        f"tags.`pipeline.github_run_id` = '{int(workflow_run_id)}' and tags.`pipeline.attested_by` = '{ATTESTED_BY}' "
        "and tags.`pipeline.verdict_by` = 'trusted'"), order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        return None
    tags = runs[0].data.tags
    outcome, reported = tags.get("pipeline.verdict", ""), tags.get("pipeline.reported_verdict") or None
    kind = tags.get("pipeline.launch_kind", "")
    if outcome not in VERDICTS or (reported is not None and reported not in VERDICTS) or \
            kind not in (CONFIRMATORY, EXPLORATORY, PILOT):
        return None
    seeds = tuple(int(p) for p in tags.get("pipeline.attested_seeds", "").split(",") if p.lstrip("-").isdigit())
    trials, winner = tags.get("pipeline.sweep_trials", ""), tags.get("pipeline.sweep_winner", "")
    others = tuple(int(p) for p in tags.get("pipeline.other_prs", "").split(",") if p.isdigit())
    return TrustedVerdict(outcome, "", kind, reported, seeds=seeds, sweep_trials=int(trials) if trials.isdigit() else 0,
                          winner=winner if _NAME.match(winner) else "", other_prs=others)


def verdict_tags(verdict: TrustedVerdict) -> dict[str, str]:
    """What the attestation records of the trusted verdict besides its outcome (`attested_verdict`
    reads them back for the headline)."""
    return {"pipeline.attested_seeds": ",".join(map(str, verdict.seeds)),
            "pipeline.sweep_trials": str(verdict.sweep_trials), "pipeline.sweep_winner": verdict.winner,
            "pipeline.other_prs": ",".join(map(str, verdict.other_prs))}


def compose_report_body(verdict: TrustedVerdict | None, report_md: str) -> str:
    """The report job's comment body: the attested verdict's headline above the report the
    trained commit wrote (or a line saying there is no attested verdict)."""
    top = verdict.headline() if verdict is not None else (
        "**Verdict: not attested.** The verdict below was computed by the pull request's own code; "
        "promotion does not use it.")
    return f"{top}\n\n{report_md}"


def record_attested(registry: TrustedRegistry, plan: ExperimentPlan, facts: Mapping[str, list[dict[str, Any]]], *,
                    pr: int, sha: str, attestation_run_id: str | None, trusted_code: bool) -> None:
    """The launch into the registry: its registration (if new), its seeds, and a reusable
    `run` record per run this job trained (reused runs have theirs)."""
    fresh = [f for role in ("candidate", "baseline") for f in facts.get(role, ()) if not f.get("reused")]
    registry.record_launch(plan, pr=pr, sha=sha, attestation_run_id=attestation_run_id, runs=fresh,
                           trusted_code=trusted_code, tree=str(plan.facts.get("code_tree", "")))


# --------------------------------------------------------------------------- the trusted command


def plan_launch(checkout: Path, experiments: Sequence[str], *, registry: TrustedRegistry | None, sha: str, pr: int,
                now: float | None = None) -> LaunchPlan:
    """The launch plan for `experiments` at the approved commit, checked out as data in
    `checkout` (its experiment files are parsed, its git trees hashed; none of its code runs).
    Without a registry (no provenance store) every claim is unregistered and nothing is reused."""
    from dataclasses import replace

    from pipelines.github.chatops import experiment_file
    from pipelines.identity import code_version
    from validation.resolved import resolve
    from validation.spec import foreign_plugins_allowed

    now = time.time() if now is None else now
    tree = code_tree(checkout)
    codes: dict[tuple[str, str], str] = {}
    planned: list[ExperimentPlan] = []
    for name in experiments:
        path = experiment_file(checkout, name)
        if path is None:
            raise UsageError(f"{name}: no single experiments/{name}.yaml at {sha[:12]}")
        with foreign_plugins_allowed():  # the PR's own architectures are data here, never imported
            resolved = resolve(path, checkout)
            # A sweep is planned like any experiment: its claim is the search (the sweep spec
            # hashes with its `sweep` section) against its baseline, its seeds the ones its
            # winner is judged on; the winner may be any of its trials' configurations.
            plan = plan_claim(registry, resolved.spec, resolved.seeds, pr=pr, now=now)
            candidate = resolve(path, checkout, seeds=list(plan.seeds))
            configurations = _sweep_winners(candidate) if candidate.spec.sweep is not None else [("", {}, candidate)]
            baseline = (resolve(Path(candidate.baseline.file), checkout, seeds=list(plan.seeds))
                        if candidate.baseline.file is not None else None)
        facts: dict[str, Any] = {**plan.facts, "code_tree": tree}
        reuse: dict[str, tuple[str, ...]] = {}
        for role, choices in (("candidate", configurations), ("baseline", [("", {}, baseline)] if baseline else [])):
            found: list[dict[str, Any]] = []
            ids: list[str] = []
            for trial, overrides, res in choices:
                key = (res.spec.model.model_type, res.spec.train.optimizer.name)
                if key not in codes:  # git trees: once per architecture and optimizer
                    codes[key] = code_version(checkout, *key).tree
                code = codes[key]
                found.append({"code_version": code, "spec_hash": res.spec_hash,
                              **({"trial": trial, "overrides": overrides} if trial else {})})
                if registry is not None:
                    ids += reusable(registry.runs(code_version=code, spec_hash=res.spec_hash), code_version=code,
                                    spec_hash=res.spec_hash, seeds=plan.seeds, code_tree=tree)
            if not found:
                continue
            facts[role] = {"code_version": found[0]["code_version"], "spec_hash": found[0]["spec_hash"]}
            if role == "candidate" and candidate.spec.sweep is not None:
                facts[role]["configurations"] = found
                facts["sweep"] = {"trials": len(found)}
            if registry is not None:
                reuse[role] = tuple(dict.fromkeys(ids))
        planned.append(replace(plan, reuse=reuse, facts=facts))
    return LaunchPlan(sha=sha, pr=pr, created_at_s=now, experiments=tuple(planned))


def _sweep_winners(resolved: Any) -> list[tuple[str, dict[str, Any], Any]]:
    """(trial name, overrides, resolved winner) for every trial of a sweep: the configuration
    its job trains again on the plan's seeds if that trial wins (`pipelines.sweep`, pure)."""
    from pipelines import sweep

    return [(t.name, dict(t.overrides), sweep.winner_experiment(resolved, t)) for t in sweep.expand_trials(resolved)]


def configurations(expected: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The (code version, spec hash) pairs a role's runs may have: one for an experiment, one
    per trial for a sweep's candidate (the winner is any of them)."""
    found = expected.get("configurations") or [expected]
    return [dict(c) for c in found if isinstance(c, Mapping) and c.get("code_version") and c.get("spec_hash")]


def open_registry(tracking_uri: str | None, provenance_id: str | None) -> TrustedRegistry | None:
    """The provenance store as a registry, or None when there is none (a laptop, a small team)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    if provenance_id:  # by id when configured (the deployment), else by name (tests, a laptop)
        store: str | None = str(client.get_experiment(provenance_id).experiment_id)
    else:
        exp = client.get_experiment_by_name(PROVENANCE_EXPERIMENT)
        store = None if exp is None else str(exp.experiment_id)
    return None if store is None else TrustedRegistry(client, store)


# --------------------------------------------------------------------------- data by content


def trusted_data_digests(registry: TrustedRegistry, spec_hashes: set[str]) -> dict[str, str]:
    """data version -> the content digest attested runs of these configurations trained on,
    from runs made by code equal to the default branch's (`trusted_code`): that preparation ran
    trusted code, so its bytes are the version's. The earliest record wins; a later record of
    other bytes under the same version is ignored (it is what a rewritten cache would give)."""
    found: dict[str, str] = {}
    for spec_hash in sorted(spec_hashes):
        for run in registry._records("run", spec_hash=spec_hash):  # oldest first
            tags = run.data.tags
            if tags.get("pipeline.trusted_code") != "true":
                continue
            version, digest = tags.get("pipeline.data_version"), tags.get("pipeline.data_digest")
            if version and digest and _HEX.match(digest):
                found.setdefault(version, digest)
    return found


def with_data_digests(plan: LaunchPlan, registry: TrustedRegistry | None) -> LaunchPlan:
    """The plan with each experiment's `facts["data_digests"]`: what the training job checks the
    shared data cache against, and the attest job checks the trained runs against."""
    from dataclasses import replace

    if registry is None:
        return plan
    out = []
    for entry in plan.experiments:
        hashes = {str(c["spec_hash"]) for role in ("candidate", "baseline")
                  for c in configurations(entry.facts.get(role) or {})}
        digests = trusted_data_digests(registry, hashes)
        out.append(replace(entry, facts={**entry.facts, "data_digests": digests}) if digests else entry)
    return replace(plan, experiments=tuple(out))


def data_digest_problems(facts: Mapping[str, Any], plan: ExperimentPlan) -> list[str]:
    """Why a trained run's data is not the attested content of its version ([] = it is)."""
    expected = (plan.facts.get("data_digests") or {}).get(str(facts.get("data_version")))
    if expected and facts.get("data_digest") != expected:
        return [f"run {facts.get('training_run_id')} trained on data version {facts.get('data_version')} with content "
                f"{str(facts.get('data_digest'))[:16]}, not the attested {str(expected)[:16]}"]
    return []


# --------------------------------------------------------------------------- a lost runner's checkpoint


def resume_points(client: Any, plan: ExperimentPlan, *, sha: str) -> dict[str, dict[str, dict[str, Any]]]:
    """role -> seed -> the checkpoint an earlier launch of this commit recorded for that run and
    did not finish (its runner was lost): `{"path", "manifest_sha256", "step", "run_id"}`.

    Only what that launch's own identity wrote counts: a run in a job experiment made by the
    trusted `job-identity` job (`<experiment>/job-<run>-<attempt>`, tagged by the admin), made
    from this commit, with the plan's code version, spec hash and a planned seed, and the
    `pipeline.checkpoint` tag its trainer set (path and sha256 of the checkpoint's manifest).
    The training job resumes from that path only when its manifest still hashes to the digest,
    so a checkpoint planted on the shared storage by anyone else is never loaded."""
    import re as _re

    if not _NAME.match(plan.experiment) or not _SHA.match(sha):
        return {}
    expected = {role: {(c["code_version"], c["spec_hash"]) for c in configurations(plan.facts.get(role) or {})}
                for role in ("candidate", "baseline")}
    found: dict[str, dict[str, dict[str, Any]]] = {}
    pattern = _re.compile(rf"{_re.escape(plan.experiment)}/job-[0-9]+-[0-9]+")
    exps = [e for e in client.search_experiments(filter_string=f"name LIKE '{plan.experiment}/job-%'",
                                                 max_results=1000)
            if pattern.fullmatch(e.name) and e.tags.get("pipeline.job_user")]
    for exp in exps:
        for run in client.search_runs([exp.experiment_id], f"tags.`pipeline.git_sha` = '{sha}'", max_results=1000):
            tags = run.data.tags
            if run.info.status == "FINISHED" or "pipeline.checkpoint" not in tags:
                continue
            role = tags.get("pipeline.role", "")
            if (tags.get("pipeline.code_version"), tags.get("pipeline.spec_hash")) not in expected.get(role, set()):
                continue
            seed = tags.get("pipeline.seed", "")
            if not seed.lstrip("-").isdigit() or int(seed) not in plan.seeds:
                continue
            try:
                point = json.loads(tags["pipeline.checkpoint"])
                entry = {"path": str(point["path"]), "manifest_sha256": str(point["manifest_sha256"]),
                         "step": int(point["step"]), "run_id": run.info.run_id,
                         "code_version": tags["pipeline.code_version"], "spec_hash": tags["pipeline.spec_hash"]}
            except (ValueError, KeyError, TypeError):
                continue
            if not _re.fullmatch(r"[0-9a-f]{64}", entry["manifest_sha256"]):
                continue
            best = found.setdefault(role, {}).get(seed)
            if best is None or entry["step"] > best["step"]:
                found[role][seed] = entry
    return found


def with_resume_points(plan: LaunchPlan, client: Any) -> LaunchPlan:
    """The plan with each experiment's `facts["resume"]` (see `resume_points`)."""
    from dataclasses import replace

    out = []
    for entry in plan.experiments:
        points = resume_points(client, entry, sha=plan.sha)
        out.append(replace(entry, facts={**entry.facts, "resume": points}) if points else entry)
    return replace(plan, experiments=tuple(out))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pipelines.trusted.registry plan --checkout DIR --experiment NAME... --sha SHA --pr N --out FILE`."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pipelines.trusted.registry", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="the launch plan (trusted job, before any PR code runs)")
    plan.add_argument("--checkout", type=Path, required=True, help="the approved commit, checked out as data")
    plan.add_argument("--experiment", action="append", required=True)
    plan.add_argument("--sha", required=True)
    plan.add_argument("--pr", type=int, required=True)
    plan.add_argument("--out", type=Path, required=True)
    head = sub.add_parser("headline", help="the report job's comment body: the attested verdict above the report")
    head.add_argument("--experiment", required=True)
    head.add_argument("--sha", required=True)
    head.add_argument("--workflow-run-id", type=int, required=True)
    head.add_argument("--report", type=Path, required=True)
    head.add_argument("--out", type=Path, required=True)
    seeds = sub.add_parser("record-seeds", help="a launch that attested nothing (training failed): its "
                                                "registration and seeds still count as used")
    seeds.add_argument("--plan", type=Path, required=True)
    seeds.add_argument("--experiment", required=True)
    args = parser.parse_args(argv)
    from basics.errors import PipelineError
    from basics.files import atomic_write_text

    try:
        registry = open_registry(os.environ.get("MLFLOW_TRACKING_URI"),
                                 os.environ.get("MLFLOW_PROVENANCE_EXPERIMENT_ID") or None)
        if args.command == "headline":
            found = None if registry is None else attested_verdict(
                registry.client, registry.store_id, experiment=args.experiment, sha=args.sha,
                workflow_run_id=args.workflow_run_id)
            report = args.report.read_text(encoding="utf-8") if args.report.is_file() else ""
            atomic_write_text(args.out, compose_report_body(found, report))
            print(f"{args.experiment}: attested verdict {found.outcome if found else 'none'}")
            return 0
        if args.command == "record-seeds":
            given = launch_plan({PLAN_ENV: str(args.plan)})
            planned = given.for_experiment(args.experiment) if given is not None else None
            if registry is None or given is None or planned is None:
                print(f"nothing recorded: no provenance store, or no plan for {args.experiment}", file=sys.stderr)
                return 0
            registry.record_launch(planned, pr=given.pr, sha=given.sha, attestation_run_id=None, runs=[],
                                   trusted_code=False, tree=str(planned.facts.get("code_tree", "")))
            print(f"{planned.experiment}: seeds {_seeds(planned.seeds)} of claim {planned.claim} recorded as used")
            return 0
        if not _SHA.match(args.sha):
            raise UsageError(f"--sha {args.sha!r}: not a full 40-hex commit SHA")
        if not (args.checkout / ".git").exists():
            raise UsageError(f"--checkout {args.checkout}: not a git checkout of the approved commit")
        try:
            done = with_data_digests(plan_launch(args.checkout, args.experiment, registry=registry, sha=args.sha,
                                                 pr=args.pr), registry)
            if registry is not None:
                done = with_resume_points(done, registry.client)
        except subprocess.CalledProcessError as exc:
            raise UsageError(f"--checkout {args.checkout}: git failed ({' '.join(map(str, exc.cmd[3:]))}, "
                             f"exit {exc.returncode})") from None
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    atomic_write_text(args.out, done.to_json() + "\n")
    for e in done.experiments:
        reused = ", ".join(f"{role} {len(ids)}" for role, ids in e.reuse.items()) or "none"
        print(f"{e.experiment}: {e.kind} on seeds {_seeds(e.seeds)}; attested runs reusable: {reused}; {e.reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
