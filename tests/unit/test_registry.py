"""The trusted registry's decisions (pipelines.trusted.registry), pure: which seeds a claim gets, which
attested runs a launch may reuse, which trained runs may be recorded as reusable, and the plan
handed to the GPU job as data."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import scipy.stats  # noqa: F401 - the verdict's lazy import, paid at collection rather than inside a test

from basics.errors import UsageError
from pipelines.identity import CodeVersion, RunIdentity
from pipelines.orchestrate import ExperimentFlow, RunOptions
from pipelines.trusted.registry import (
    CONFIRMATORY,
    EXPLORATORY,
    PILOT,
    ExperimentPlan,
    LaunchPlan,
    TrustedRegistry,
    check_run_facts,
    decide,
    launch_plan,
    plan_claim,
    reusable,
    trusted_verdict,
)
from reports import prereg
from reports.records import RunRecord
from reports.report import make_report


def _spec(name: str = "higher-lr", **edit):
    from tests.infra.report_runs import SPEC
    from validation.spec import ExperimentSpec

    data = {**json.loads(json.dumps(SPEC)), "name": name}
    for path, value in edit.items():
        section, key = path.split("__")
        data[section][key] = value
    return ExperimentSpec.model_validate(data)


def _plan(spec, *, registration=None, seen=frozenset(), now=100.0) -> ExperimentPlan:
    seeds = [spec.train.seed + i for i in range(spec.hypothesis.seeds)]
    claim = prereg.claim_key(spec)
    entry = prereg.claim_entry(claim, spec.name, spec.hypothesis, seeds, pilot=spec.hypothesis.pilot, now=now)
    return decide(experiment=spec.name, claim=claim, pilot=spec.hypothesis.pilot, base_seed=spec.train.seed,
                  n_seeds=spec.hypothesis.seeds, spec_seeds=seeds, entry=entry, registration=registration,
                  seen=set(seen))


def test_a_first_registration_is_confirmatory_on_seeds_no_run_of_the_claim_used():
    plan = _plan(_spec(train__seed=0), seen={0, 1})  # a pilot trained seeds 0 and 1
    assert plan.kind == CONFIRMATORY and plan.new_registration
    assert plan.seeds == (2, 3, 4) and plan.registration["seed_list"] == [2, 3, 4]
    assert plan.registration["kind"] == "confirmatory" and plan.registration["registered_at_s"] == 100.0


def test_rename_and_new_seeds_after_an_inconclusive_registration_is_exploratory_not_a_new_headline():
    first = _plan(_spec(train__seed=0))
    registration = first.registration
    # The same configuration under another name, on another base seed: the same claim.
    renamed = _spec("higher-lr-take-two", train__seed=500)
    assert prereg.claim_key(renamed) == first.claim
    plan = _plan(renamed, registration=registration, seen={0, 1, 2}, now=200.0)
    assert plan.kind == EXPLORATORY and not plan.new_registration and plan.seeds == (500, 501, 502)
    assert plan.registration == registration and "higher-lr" in plan.reason and "exploratory" in plan.reason

    # The GPU job binds its runs to the registration the plan carries (orchestrate._register_claim):
    # the report decides on the registered seeds only; the renamed run's seeds decide nothing.
    key = prereg.CLAIM_PREFIX + plan.claim
    base = [RunRecord(f"b{s}", "base", s, "finished", {"eval/loss": 3.5}) for s in plan.seeds]
    cands = [RunRecord(f"c{s}", renamed.name, s, "finished", {"eval/loss": 3.0},  # a "clear win"
                       registrations={key: {**plan.registration, "results_existed": False}}) for s in plan.seeds]
    report = make_report(cands, base, renamed.hypothesis, experiment=renamed.name, claim=plan.claim)
    assert report.decided_seeds == () and report.verdict.outcome == "inconclusive"
    assert "registered seeds [0, 1, 2]" in report.verdict.reason


def test_a_retry_on_the_registered_seeds_continues_the_registration_and_a_pilot_stays_a_pilot():
    first = _plan(_spec(train__seed=0))
    again = _plan(_spec(train__seed=0), registration=first.registration, seen={0, 1, 2})
    assert again.kind == CONFIRMATORY and not again.new_registration and again.seeds == (0, 1, 2)
    pilot_spec = _spec(train__seed=0)
    pilot_spec = pilot_spec.model_copy(update={"hypothesis": pilot_spec.hypothesis.model_copy(update={"pilot": True})})
    assert _plan(pilot_spec).kind == PILOT


def test_only_attested_runs_of_this_identity_made_by_trusted_or_this_code_are_reused():
    record = {"training_run_id": "a" * 32, "code_version": "c1", "spec_hash": "s1", "seed": "0",
              "trusted_code": "true", "code_tree": "t-main"}
    pr_code = {**record, "training_run_id": "b" * 32, "seed": "1", "trusted_code": "false", "code_tree": "t-pr"}
    records = [record, pr_code, {**record, "training_run_id": "c" * 32, "spec_hash": "s2"},
               {**record, "training_run_id": "d" * 32, "seed": "9"}]
    assert reusable(records, code_version="c1", spec_hash="s1", seeds=(0, 1), code_tree="t-other") == ("a" * 32,)
    # A run made by a PR that changed code outside the identity: reused only by that same code.
    assert reusable(records, code_version="c1", spec_hash="s1", seeds=(0, 1), code_tree="t-pr") == ("a" * 32, "b" * 32)
    assert reusable(records, code_version="c2", spec_hash="s1", seeds=(0, 1), code_tree="t-main") == ()


def test_a_trained_run_is_recorded_only_with_the_identity_the_plan_computed():
    code = CodeVersion("f" * 40, "c0de", False, "t")
    key = RunIdentity("x", 3, code, "5bec", "da7a").key
    facts = {"training_run_id": "r1", "identity": key, "code_version": "c0de", "spec_hash": "5bec",
             "data_version": "da7a", "seed": "3"}
    assert check_run_facts(facts, code_version="c0de", spec_hashes={"5bec"}) == []
    assert check_run_facts({**facts, "code_version": "other"}, code_version="c0de", spec_hashes={"5bec"})
    assert check_run_facts(facts, code_version="c0de", spec_hashes={"another"})
    forged = {**facts, "identity": "0123456789abcdef"}  # planted to be reused by someone else's launch
    assert any("not the hash of its parts" in p for p in check_run_facts(forged, code_version="c0de",
                                                                          spec_hashes={"5bec"}))


def test_the_plan_travels_as_data_and_a_broken_plan_is_one_line(tmp_path: Path):
    plan = LaunchPlan("a" * 40, 7, 100.0, (_plan(_spec(train__seed=0)),))
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    loaded = launch_plan({"PIPELINE_LAUNCH_PLAN": str(path)})
    assert loaded == plan and loaded.for_experiment("higher-lr").seeds == (0, 1, 2)
    assert launch_plan({}) is None
    path.write_text("{}")
    with pytest.raises(UsageError, match="not a launch plan"):
        launch_plan({"PIPELINE_LAUNCH_PLAN": str(path)})


def test_with_a_plan_the_job_reuses_or_resumes_only_what_the_plan_names(tmp_path: Path, monkeypatch):
    """runs/ on shared storage is written by every job's code: a planted finished run, or
    another job's checkpoints, are neither reused nor resumed by a planned launch."""
    planted, allowed = tmp_path / "a" / "train" / "seed-1", tmp_path / "b" / "train" / "seed-1"
    for d, run_id in ((planted, "f" * 32), (allowed, "a" * 32)):
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps({"status": "finished", "mlflow_run_id": run_id}))
    flow = ExperimentFlow(tmp_path, RunOptions(tracking_uri="none"))
    assert flow._reusable_local(planted) == planted  # a laptop: no plan, runs/ is the user's own
    plan = LaunchPlan("a" * 40, 7, 1.0, (ExperimentPlan("x", "c", CONFIRMATORY, (1,), None,
                                                       reuse={"baseline": ("a" * 32,)}),))
    (tmp_path / "plan.json").write_text(plan.to_json())
    monkeypatch.setenv("PIPELINE_LAUNCH_PLAN", str(tmp_path / "plan.json"))
    assert flow._reusable_local(planted) is None and flow._reusable_local(allowed) == allowed
    flow._set_aside_unplanned("x", planted)
    assert not planted.exists() and len(list(planted.parent.glob("seed-1.unplanned-*"))) == 1


def test_runs_and_prepared_data_go_to_shared_storage_when_configured(tmp_path: Path, monkeypatch):
    from pipelines.rundir import data_cache_root, runs_root

    monkeypatch.delenv("PIPELINE_RUNS_DIR", raising=False)
    monkeypatch.delenv("PIPELINE_DATA_CACHE", raising=False)
    assert runs_root(tmp_path) == tmp_path / "runs" and data_cache_root(tmp_path) == tmp_path / "data" / "cache"
    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(tmp_path / "shared" / "runs"))
    monkeypatch.setenv("PIPELINE_DATA_CACHE", str(tmp_path / "shared" / "data"))
    assert runs_root(tmp_path) == tmp_path / "shared" / "runs"
    assert data_cache_root(tmp_path) == tmp_path / "shared" / "data"


# --------------------------------------------------------------------------- claims across pull requests (issue 36)


class FakeMlflow:
    """The part of `MlflowClient` the trusted registry uses, in memory: runs with tags and
    metrics, and `search_runs` over the registry's own filter strings (tags and the status compared
    with `=`, joined by `and`), oldest first."""

    _CLAUSE = re.compile(r"^(?:tags\.`([^`]+)`|attributes\.(status)) = '([^']*)'$")

    def __init__(self) -> None:
        self.runs: list[SimpleNamespace] = []

    def create_run(self, experiment_id: str, tags: dict[str, str], run_name: str = "") -> SimpleNamespace:
        run = SimpleNamespace(info=SimpleNamespace(run_id=f"{len(self.runs):032x}", status="RUNNING",
                                                   experiment_id=experiment_id),
                              data=SimpleNamespace(tags=dict(tags), metrics={}))
        self.runs.append(run)
        return run

    def log_metric(self, run_id: str, key: str, value: float) -> None:
        self._run(run_id).data.metrics[key] = value

    def set_terminated(self, run_id: str, status: str = "FINISHED") -> None:
        self._run(run_id).info.status = status

    def search_runs(self, experiment_ids: list[str], filter_string: str, max_results: int = 1000,
                    order_by: list[str] | None = None) -> list[SimpleNamespace]:
        clauses = [self._CLAUSE.match(c.strip()) for c in filter_string.split(" and ")]
        assert all(clauses), filter_string
        out = [r for r in self.runs if r.info.experiment_id in experiment_ids and all(
            (r.info.status if m[2] else r.data.tags.get(m[1])) == m[3] for m in clauses if m is not None)]
        return out[:max_results]

    def _run(self, run_id: str) -> SimpleNamespace:
        return next(r for r in self.runs if r.info.run_id == run_id)


def _with_hypothesis(spec, **fields):
    return spec.model_copy(update={"hypothesis": spec.hypothesis.model_copy(update=fields)})


def _facts(seeds, *, effect: float) -> dict:
    """Attested facts of paired runs: the candidate `effect` lower than the baseline on every
    seed, with a little seed noise (0.1 %)."""
    noise = {s: 1 + 0.001 * (i % 3 - 1) for i, s in enumerate(seeds)}
    return {"baseline": [{"training_run_id": f"b{s}", "seed": str(s), "metrics": {"eval/loss": 3.5 * noise[s]}}
                         for s in seeds],
            "candidate": [{"training_run_id": f"c{s}", "seed": str(s),
                           "metrics": {"eval/loss": 3.5 * (1 - effect) * noise[s] * (1 + 0.0007 * (s % 2))}}
                          for s in seeds]}


def test_another_pull_requests_registration_never_sets_this_ones_rule():
    """The review's claim squatting: a YAML-only PR (9) registers PR 4's public configuration
    first with its own rule (min_effect 0.5 %). PR 4's own plan registers PR 4's rule (5 %) on
    seeds the squatter did not use, so a 1 % effect is refuted for PR 4, as its author's rule
    says, and supported only in the squatter's own pull request."""
    registry = TrustedRegistry(FakeMlflow(), "store")
    author = _with_hypothesis(_spec(train__seed=0), min_effect=0.05)
    squatter = _with_hypothesis(_spec("copied", train__seed=0), min_effect=0.005)
    assert prereg.claim_key(squatter) == prereg.claim_key(author)  # the same configuration and baseline
    seeds = [0, 1, 2]

    squat = plan_claim(registry, squatter, seeds, pr=9, now=50.0)
    assert squat.kind == CONFIRMATORY and squat.new_registration and squat.seeds == (0, 1, 2)
    registry.record_launch(squat, pr=9, sha="9" * 40, attestation_run_id=None, runs=[], trusted_code=False, tree="t")

    mine = plan_claim(registry, author, seeds, pr=4, now=100.0)
    assert mine.kind == CONFIRMATORY and mine.new_registration
    assert mine.registration["hypothesis"]["min_effect"] == 0.05
    assert set(mine.seeds).isdisjoint(squat.seeds) and mine.seeds == (3, 4, 5)  # seeds used stay used
    hypothesis = author.hypothesis.model_dump(mode="json")
    assert trusted_verdict(mine, _facts(mine.seeds, effect=0.01), hypothesis, None).outcome == "refuted"
    # Under the squatter's rule the same effect is supported: that verdict is PR 9's alone.
    squatted = trusted_verdict(squat, _facts(squat.seeds, effect=0.01), squatter.hypothesis.model_dump(mode="json"),
                               None)
    assert squatted.outcome == "supported"


def test_a_rename_or_more_seeds_in_the_same_pull_request_stays_exploratory_and_seeds_stay_used_across_prs(
        tmp_path: Path):
    registry = TrustedRegistry(FakeMlflow(), "store")
    first = plan_claim(registry, _spec(train__seed=0), [0, 1, 2], pr=4, now=100.0)
    registry.record_launch(first, pr=4, sha="4" * 40, attestation_run_id=None, runs=[], trusted_code=False, tree="t")
    renamed = plan_claim(registry, _spec("higher-lr-v2", train__seed=500), [500, 501, 502], pr=4, now=200.0)
    assert renamed.kind == EXPLORATORY and renamed.registration == first.registration
    registry.record_launch(renamed, pr=4, sha="5" * 40, attestation_run_id=None, runs=[], trusted_code=False,
                           tree="t")
    more = plan_claim(registry, _spec(train__seed=0), [0, 1, 2, 3], pr=4, now=300.0)
    assert more.kind == EXPLORATORY and more.registration["seed_list"] == [0, 1, 2]

    # Another pull request with the same configuration: its own rule, never on a seed any look used.
    other = plan_claim(registry, _spec(train__seed=500), [500, 501, 502], pr=8, now=400.0)
    assert other.kind == CONFIRMATORY and other.new_registration and other.seeds == (503, 504, 505)
    assert "#4 registered this configuration too" in other.reason and other.facts == {"other_prs": [4]}
    # The comment names it too: a configuration tried in several pull requests is visible to reviewers.
    facts = _facts(other.seeds, effect=0.01)
    headline = trusted_verdict(other, facts, _spec().hypothesis.model_dump(mode="json"), None).headline()
    assert "Pull request(s) #4 registered this configuration too" in headline
    assert registry.registration(first.claim, pr=4) == first.registration
    assert registry.registration(first.claim, pr=8) is None  # until PR 8's attest job records it

    # The training job's copy on runs/ shared between runners: one registration per pull request.
    assert prereg.register_confirmatory(tmp_path, first.registration) == first.registration
    assert prereg.register_confirmatory(tmp_path, other.registration) == other.registration
    assert prereg.register_confirmatory(tmp_path, {**other.registration, "seed_list": [9]}) == other.registration


def test_the_headline_says_what_was_attested():
    from pipelines.trusted.registry import TrustedVerdict, compose_report_body

    single = TrustedVerdict("refuted", "", CONFIRMATORY, "supported", seeds=(3, 4, 5))
    assert single.headline().startswith("**Verdict (trusted, from attested metrics): refuted**\n\n"
                                        "Attested by this launch's trusted attest job from the metrics of the "
                                        "candidate's runs on seed(s) 3, 4, 5, against the baseline on the same seeds")
    assert "own report says `supported`" in single.headline()
    sweep = TrustedVerdict("supported", "", EXPLORATORY, "supported", seeds=(0,), sweep_trials=4, winner="lr-sweep-t2")
    assert sweep.headline().startswith("**Verdict (trusted, from attested metrics): supported** (this launch was "
                                       "exploratory")
    assert "the sweep's winner `lr-sweep-t2` of 4 trials, trained again: the candidate's runs on seed(s) 0" in \
        sweep.headline() and "own report" not in sweep.headline()
    # No attested verdict: the comment says the one below is the PR's own, which promotion does not use.
    assert compose_report_body(None, "r").startswith("**Verdict: not attested.**")
