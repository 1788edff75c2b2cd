"""State shared between jobs through one tracking server (a real `mlflow server`, started once
for the module):

- two fresh checkouts: the second reuses the baseline and candidate runs the first trained,
  fetched from MLflow, and trains nothing (`pipelines.tracked_runs`);
- two launches through the trusted registry (the approved commit checked out as data): the
  plan decides seeds and reuse before any PR code runs, the attest step computes the verdict
  from attested metrics and records the launch, and the next plan reuses the attested runs
  (`pipelines.trusted.registry`)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.identity import CodeVersion, RunIdentity
from pipelines.orchestrate import ExperimentFlow, Reporter, RunOptions
from pipelines.rundir import finished_training_runs, read_json
from pipelines.tracked_runs import FETCHED_FILE, RECORD_TAG
from pipelines.trusted.provenance import PROVENANCE_EXPERIMENT, attest
from pipelines.trusted.registry import (
    CONFIRMATORY,
    EXPLORATORY,
    LaunchPlan,
    TrustedRegistry,
    launch_plan,
    main,
    plan_launch,
)
from tests.infra.mlflow_server import MlflowServer
from tests.infra.tiny_experiments import BASE, CANDIDATE

RUN_ID = 77


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    with MlflowServer(tmp_path_factory.mktemp("mlflow")) as running:
        yield running

class Recorder(Reporter):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    def stage(self, experiment: str, stage: str, event: str, detail: str = "") -> None:
        self.events.append((experiment, stage, event, detail))

    def training(self, label: str, run_dir: Path, total_steps: int):
        self.events.append((label, "training", str(total_steps), ""))
        return lambda: None


def _checkout(root: Path) -> Path:
    from tests.infra.corpus import demo_corpus

    root.mkdir()
    (root / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    (root / "experiments").mkdir()
    # Four steps, one evaluation at the end: the flow, not the model, is under test.
    base = BASE.replace("max_steps: 8", "max_steps: 4")
    (root / "experiments" / "tiny-base.yaml").write_text(base)
    (root / "experiments" / "tiny-lr.yaml").write_text(CANDIDATE.format(name="tiny-lr", lr=0.006))
    demo_corpus(root / "data" / "demo", 60_000)
    return root


def _run(repo: Path, uri: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Recorder, object, object]:
    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(repo / "runs"))
    rec = Recorder()
    candidate, baseline = ExperimentFlow(repo, RunOptions(tracking_uri=uri, smoke=False), rec).run(
        repo / "experiments" / "tiny-lr.yaml")
    return rec, candidate, baseline


def test_a_second_checkout_reuses_the_runs_the_first_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: MlflowServer) -> None:
    first = _checkout(tmp_path / "clone-1")
    rec1, cand1, base1 = _run(first, server.uri, monkeypatch)
    assert [e[0] for e in rec1.events if e[1] == "training"] == ["tiny-base seed 1234", "tiny-lr seed 1234"]

    # A fresh clone: its own runs/ and data cache, the same tracking server.
    second = tmp_path / "clone-2"
    shutil.copytree(first, second, ignore=shutil.ignore_patterns("runs", "cache", "mlflow.db", "mlruns"))
    rec2, cand2, base2 = _run(second, server.uri, monkeypatch)

    assert not [e for e in rec2.events if e[1] == "training"], "the second checkout trains nothing"
    reused = [e for e in rec2.events if e[1:3] == ("train", "reused")]
    assert [e[0] for e in reused] == ["tiny-base", "tiny-lr"] and all("MLflow run" in e[3] for e in reused)
    for mine, theirs in ((cand2, cand1), (base2, base1)):
        (seed_dir,) = mine.seed_dirs
        assert seed_dir.is_relative_to(second / "runs") and (seed_dir / FETCHED_FILE).is_file()
        ours, recorded = read_json(seed_dir / "result.json"), read_json(theirs.seed_dirs[0] / "result.json")
        assert ours["final_metrics"] == recorded["final_metrics"]
        assert ours["mlflow_run_id"] == recorded["mlflow_run_id"]
    # The report and its verdict are the first checkout's, computed from the fetched records.
    assert cand2.verdict == cand1.verdict
    report1 = json.loads((cand1.report_dir / "result.json").read_text())
    report2 = json.loads((cand2.report_dir / "result.json").read_text())
    assert report2["verdict"] == report1["verdict"]
    # Fetched once, found locally after that.
    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(second / "runs"))
    assert set(finished_training_runs(second).values()) == {cand2.seed_dirs[0], base2.seed_dirs[0]}


def test_a_run_without_a_complete_record_is_trained_not_reused(tmp_path: Path, server: MlflowServer) -> None:
    """The marker tag comes last: a run whose record upload did not finish is not found."""
    from mlflow.tracking import MlflowClient

    from pipelines.tracked_runs import fetch_finished

    uri = server.uri
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("half-recorded")
    run = client.create_run(exp, tags={"pipeline.identity": "0123456789abcdee"})
    client.set_terminated(run.info.run_id)
    dest = tmp_path / "runs" / "seed-1"
    assert fetch_finished(client, "0123456789abcdee", dest, tracking_uri=uri) is None
    client.set_tag(run.info.run_id, RECORD_TAG, "1")  # marked, but no record artifact: refused
    assert fetch_finished(client, "0123456789abcdee", dest, tracking_uri=uri) is None
    assert not dest.exists() and not list(dest.parent.iterdir())


# --------------------------------------------------------------------------- the trusted registry


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, files: dict[str, str]) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "c")
    return _git(repo, "rev-parse", "HEAD")


def _train(client, plan, sha: str, *, role: str, experiment: str, loss: float, facts: dict | None = None) -> str:
    """What the GPU job's trainer leaves in MLflow for one seed (tags from identity.json);
    `facts`: the configuration trained (default: the plan's for the role)."""
    facts = facts or plan.facts[role]
    seed = plan.seeds[0]
    key = RunIdentity(experiment, seed, CodeVersion(sha, facts["code_version"], False, ""), facts["spec_hash"],
                      "da7a").key
    # Every run the GPU job trains goes to its launch's own job experiment (job_identity).
    job_experiment = f"{plan.experiment}/job-{RUN_ID}-1"
    exp = client.get_experiment_by_name(job_experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(job_experiment)
    run = client.create_run(exp_id, tags={
        "pipeline.identity": key, "pipeline.code_version": facts["code_version"], "pipeline.spec_hash": facts["spec_hash"],
        "pipeline.data_version": "da7a", "pipeline.seed": str(seed), "pipeline.role": role, "pipeline.git_sha": sha,
        "pipeline.dirty": "False", "pipeline.github_run_id": str(RUN_ID)})
    client.log_metric(run.info.run_id, "eval/loss", loss)
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def test_two_launches_share_the_trusted_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                server: MlflowServer) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    _git(checkout, "init", "-q")
    sha = _commit(checkout, {"pyproject.toml": "[project]\nname = 'x'\n", "trainer/loop.py": "# trainer\n",
                             "validation/x.py": "# rules\n", "experiments/tiny-base.yaml": BASE,
                             "experiments/tiny-lr.yaml": CANDIDATE.format(name="tiny-lr", lr=0.006),
                             "data/demo/code.jsonl": '{"text": "x"}\n', "data/demo/docs.jsonl": '{"text": "y"}\n'})
    monkeypatch.chdir(checkout)  # the attest job's working directory: the default branch (here: the same code)
    uri = server.uri
    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(PROVENANCE_EXPERIMENT)  # the module's server: any test may come first
    store = found.experiment_id if found else client.create_experiment(PROVENANCE_EXPERIMENT)
    registry = TrustedRegistry(client, store)

    # The trusted `plan` job's command, then the plan file the GPU and attest jobs are given.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    plan_file = tmp_path / "plan.json"
    assert main(["plan", "--checkout", str(checkout), "--experiment", "tiny-lr", "--sha", sha, "--pr", "5",
                 "--out", str(plan_file)]) == 0
    monkeypatch.setenv("PIPELINE_LAUNCH_PLAN", str(plan_file))
    (first,) = launch_plan().experiments
    assert first.kind == CONFIRMATORY and first.new_registration and first.seeds == (1234,)
    assert first.reuse == {"candidate": (), "baseline": ()}

    # The GPU job trains both; its own report claims "supported" with numbers it made up.
    cand = _train(client, first, sha, role="candidate", experiment="tiny-lr", loss=3.6)
    base = _train(client, first, sha, role="baseline", experiment="tiny-base", loss=3.5)
    result = {"candidate_runs": [{"mlflow_run_id": cand}], "baseline_runs": [{"mlflow_run_id": base}],
              "verdict": {"outcome": "supported"}, "hypothesis": {"statement": "s", "metric": "eval/loss",
                                                                   "direction": "decrease", "min_effect": 0.01}}
    done = attest(tracking_uri=uri, pr=5, sha=sha, experiment="tiny-lr", workflow_run_id=RUN_ID, result=result)
    assert done.verdict == "inconclusive"  # one worse seed decides nothing, whatever the PR's report says
    tags = client.get_run(done.run_id).data.tags
    assert tags["pipeline.reported_verdict"] == "supported" and tags["pipeline.verdict_by"] == "trusted"
    assert registry.registration(first.claim, pr=5)["seed_list"] == [1234] and registry.seen_seeds(first.claim) == {1234}
    monkeypatch.delenv("PIPELINE_LAUNCH_PLAN")
    # The report job's comment: the attested verdict on top, saying the PR's own differs.
    (tmp_path / "report.md").write_text("## tiny-lr\n\n**supported**\n")
    assert main(["headline", "--experiment", "tiny-lr", "--sha", sha, "--workflow-run-id", str(RUN_ID),
                 "--report", str(tmp_path / "report.md"), "--out", str(tmp_path / "body.md")]) == 0
    body = (tmp_path / "body.md").read_text()
    assert body.startswith("**Verdict (trusted, from attested metrics): inconclusive**")
    assert "own report says `supported`" in body and body.endswith("**supported**\n")

    # A second /train of the same commit: both runs are reused, nothing is trained.
    (again,) = plan_launch(checkout, ["tiny-lr"], registry=registry, sha=sha, pr=5).experiments
    assert again.kind == CONFIRMATORY and not again.new_registration
    assert again.reuse == {"candidate": (cand,), "baseline": (base,)}
    # The attested metrics are the snapshot, not what the trainer's credential can rewrite later.
    client.log_metric(base, "eval/loss", 9.0)
    (record,) = [r for r in registry.runs(code_version=again.facts["baseline"]["code_version"],
                                          spec_hash=again.facts["baseline"]["spec_hash"])]
    assert record["metrics"]["eval/loss"] == 3.5

    # A rename plus a new base seed of the same configuration in the same pull request:
    # exploratory, baseline still reused only for the seeds it was trained on (none here: a new
    # seed), the registration unchanged.
    renamed = CANDIDATE.format(name="tiny-lr-v2", lr=0.006).replace("train: {lr: 0.006}",
                                                                    "train: {lr: 0.006, seed: 99}")
    sha2 = _commit(checkout, {"experiments/tiny-lr-v2.yaml": renamed})
    (third,) = plan_launch(checkout, ["tiny-lr-v2"], registry=registry, sha=sha2, pr=5).experiments
    assert third.claim == first.claim and third.kind == EXPLORATORY and third.seeds == (99,)
    assert third.registration["seed_list"] == [1234] and third.reuse == {"candidate": (), "baseline": ()}
    # That launch's training failed: nothing to attest, its seeds still count as used.
    plan3 = tmp_path / "plan3.json"
    plan3.write_text(LaunchPlan(sha2, 5, 1.0, (third,)).to_json())
    assert main(["record-seeds", "--plan", str(plan3), "--experiment", "tiny-lr-v2"]) == 0
    assert registry.seen_seeds(first.claim) == {1234, 99}
    assert registry.registration(first.claim, pr=5)["seed_list"] == [1234]
    # Another pull request's launch of the same configuration registers its own rule, on a seed
    # no look at the configuration used (PR 5's registration decides nothing there, nor PR 6's here).
    (fourth,) = plan_launch(checkout, ["tiny-lr-v2"], registry=registry, sha=sha2, pr=6).experiments
    assert fourth.kind == CONFIRMATORY and fourth.new_registration and fourth.seeds == (100,)
    assert fourth.registration["pr"] == 6 and "#5" in fourth.reason


SWEEP = """\
name: lr-sweep
owner: ml-platform
extends: tiny-base.yaml
hypothesis:
  statement: The better of two peak learning rates lowers the held-out loss of the tiny model.
  metric: eval/loss
  direction: decrease
  min_effect: 0.01
  baseline: tiny-base
sweep: {parameters: {train.lr: [0.004, 0.006]}, max_trials: 2, selection_seeds: 1, prune: false}
"""


def test_a_sweep_is_planned_and_attested_like_an_experiment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           server: MlflowServer) -> None:
    """Issue 36: `plan_launch` skipped sweeps, so a sweep's attestation carried the pull request's
    own verdict. Now its claim (the search and its baseline) is registered on the plan's seeds,
    the winner may be any trial's configuration and only one, and the verdict is the attest job's."""
    from mlflow.tracking import MlflowClient

    from pipelines.trusted.provenance import ProvenanceLookup
    from pipelines.trusted.registry import attested_facts

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    _git(checkout, "init", "-q")
    sha = _commit(checkout, {"pyproject.toml": "[project]\nname = 'x'\n", "trainer/loop.py": "# trainer\n",
                             "experiments/tiny-base.yaml": BASE, "experiments/lr-sweep.yaml": SWEEP,
                             "data/demo/code.jsonl": '{"text": "x"}\n', "data/demo/docs.jsonl": '{"text": "y"}\n'})
    monkeypatch.chdir(checkout)
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    client = MlflowClient(tracking_uri=server.uri)
    if client.get_experiment_by_name(PROVENANCE_EXPERIMENT) is None:
        client.create_experiment(PROVENANCE_EXPERIMENT)
    plan_file = tmp_path / "plan.json"
    assert main(["plan", "--checkout", str(checkout), "--experiment", "lr-sweep", "--sha", sha, "--pr", "11",
                 "--out", str(plan_file)]) == 0
    monkeypatch.setenv("PIPELINE_LAUNCH_PLAN", str(plan_file))
    (plan,) = launch_plan().experiments
    assert plan.kind == CONFIRMATORY and plan.new_registration and plan.seeds == (1234,)
    winners = plan.facts["candidate"]["configurations"]
    assert [w["trial"] for w in winners] == ["lr-sweep-t1", "lr-sweep-t2"] and plan.facts["sweep"] == {"trials": 2}
    assert len({w["spec_hash"] for w in winners}) == 2 and plan.facts["baseline"]["spec_hash"] not in {
        w["spec_hash"] for w in winners}

    # The GPU job: trial 2 won; its configuration trained again on the plan's seed, the baseline too.
    cand = _train(client, plan, sha, role="candidate", experiment="lr-sweep", loss=3.6, facts=winners[1])
    base = _train(client, plan, sha, role="baseline", experiment="tiny-base", loss=3.5)
    result = {"candidate_runs": [{"mlflow_run_id": cand}], "baseline_runs": [{"mlflow_run_id": base}],
              "verdict": {"outcome": "supported"}, "hypothesis": {"statement": "s", "metric": "eval/loss",
                                                                   "direction": "decrease", "min_effect": 0.01}}
    # A report naming the winners of two trials judges a best of two: no candidate run counts.
    other = _train(client, plan, sha, role="candidate", experiment="lr-sweep", loss=3.0, facts=winners[0])
    two = {**result, "candidate_runs": [{"mlflow_run_id": cand}, {"mlflow_run_id": other}]}
    facts, problems = attested_facts(client, None, plan, two, sha=sha, workflow_run_id=RUN_ID)
    assert facts["candidate"] == [] and any("2 configurations" in p for p in problems)

    done = attest(tracking_uri=server.uri, pr=11, sha=sha, experiment="lr-sweep", workflow_run_id=RUN_ID,
                  result=result)
    assert done.verdict == "inconclusive"  # the attest job's (one seed), not the report's "supported"
    tags = client.get_run(done.run_id).data.tags
    assert tags["pipeline.verdict_by"] == "trusted" and tags["pipeline.reported_verdict"] == "supported"
    assert tags["pipeline.sweep_winner"] == "lr-sweep-t2" and tags["pipeline.record_problems"] == ""
    record = ProvenanceLookup(server.uri).training_record("lr-sweep", sha)
    assert record is not None and record.verdict_by == "trusted" and record.verdict == "inconclusive"
    (tmp_path / "report.md").write_text("## lr-sweep\n")
    assert main(["headline", "--experiment", "lr-sweep", "--sha", sha, "--workflow-run-id", str(RUN_ID),
                 "--report", str(tmp_path / "report.md"), "--out", str(tmp_path / "body.md")]) == 0
    body = (tmp_path / "body.md").read_text()
    assert body.startswith("**Verdict (trusted, from attested metrics): inconclusive**")
    assert "the sweep's winner `lr-sweep-t2` of 2 trials, trained again: the candidate's runs on seed(s) 1234" in body

    # The next launch of the sweep in this pull request continues its registration.
    (again,) = plan_launch(checkout, ["lr-sweep"], registry=TrustedRegistry(client, client.get_experiment_by_name(
        PROVENANCE_EXPERIMENT).experiment_id), sha=sha, pr=11).experiments
    assert again.kind == CONFIRMATORY and not again.new_registration and again.claim == plan.claim
