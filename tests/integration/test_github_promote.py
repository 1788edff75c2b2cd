"""Promotion on merge through PyGithub (emulator) and a real MLflow registry (sqlite store):
alias `champion` moves, `previous-champion` kept.
Runs count only through an attestation (pipelines/trusted/provenance.py; the trust boundary
itself is tested against an auth-enabled server in test_github_provenance.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.github.client import PyGithubHost
from pipelines.github.events import PullRequestEvent, PullRequestRef
from pipelines.trusted.promote import (
    CHAMPION,
    PREVIOUS,
    MlflowPromotion,
    TrainingRecord,
    promote_merged,
)
from pipelines.trusted.provenance import ProvenanceLookup
from tests.infra.github_emulator import REPO, SHA_A, SHA_B, GitHubEmulator, emulated_repo, emulator_config

EXP = "rope-theta"


# --------------------------------------------------------------------------- flow with MLflow


@pytest.fixture
def gh() -> Iterator[GitHubEmulator]:
    with GitHubEmulator() as emulator:
        yield emulator


@pytest.fixture(scope="module")
def tracking(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One sqlite store for the module (creating its tables is the slow part); each test
    uses its own experiment and registered-model names."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


TRAIN_RUN_ID = 9001  # the train workflow's run that made the MLflow runs (registered in the emulator)


def train_run(uri: str, tmp: Path, sha: str, outcome: str | None, status: str = "FINISHED", exp_name: str = EXP,
              pr: int = 1, run_id: int | None = TRAIN_RUN_ID, planned: bool = True) -> str:
    """Runs as the trainer and the reporter leave them (identity tags, the PR and the train
    workflow's run id, model/, report/result.json): the candidate and its baseline on three
    seeds, whose metrics make the trusted verdict `outcome` (supported: 10 % lower loss on
    every seed; refuted: 10 % higher; inconclusive: one seed). The attest job of that workflow
    run vouches for them under a launch plan (`planned`), or, without one, records the report's
    own verdict, which promotion does not accept. Returns the first candidate run."""
    from mlflow.tracking import MlflowClient

    from pipelines.identity import CodeVersion, RunIdentity
    from pipelines.launch_plan import CONFIRMATORY, ExperimentPlan

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(exp_name)
    exp_id = exp.experiment_id if exp else client.create_experiment(exp_name, artifact_location=(tmp / "art").as_uri())
    seeds = (1,) if outcome == "inconclusive" else (1, 2)
    ratio = {"supported": 0.9, "refuted": 1.1}.get(outcome or "", 1.0)
    code = CodeVersion(sha, "c0de", False, "")
    ids: dict[str, list[str]] = {"candidate": [], "baseline": []}
    for role, spec_hash in (("candidate", "5bec"), ("baseline", "ba5e")):
        for seed in seeds:
            tags = {"pipeline.git_sha": sha, "pipeline.dirty": "false", "pipeline.experiment": exp_name,
                    "pipeline.pr": str(pr), "pipeline.identity": RunIdentity("", seed, code, spec_hash, "da7a").key,
                    "pipeline.code_version": "c0de", "pipeline.spec_hash": spec_hash, "pipeline.data_version": "da7a",
                    "pipeline.seed": str(seed), "pipeline.role": role}
            if run_id is not None:
                tags["pipeline.github_run_id"] = str(run_id)
            run = client.create_run(exp_id, tags=tags)
            loss = 3.5 * (ratio * (1 + 0.002 * (seed % 2)) if role == "candidate" else 1 + 0.001 * seed)
            client.log_metric(run.info.run_id, "eval/loss", loss)
            ids[role].append(run.info.run_id)
    first = ids["candidate"][0]
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    client.log_artifacts(first, str(model), "model")
    hypothesis = {"statement": "A larger RoPE base lowers code eval loss.", "metric": "eval/loss",
                  "direction": "decrease", "min_effect": 0.01, "alpha": 0.05, "seeds": len(seeds)}
    if outcome is not None:
        report = tmp / "report"
        report.mkdir(exist_ok=True)
        (report / "result.json").write_text(json.dumps({"verdict": {"outcome": outcome}, "hypothesis": hypothesis}))
        client.log_artifact(first, str(report / "result.json"), "report")
    for rid in ids["candidate"] + ids["baseline"]:
        client.set_terminated(rid, status)
    if run_id is not None:  # the trusted attest job of that workflow run vouches for it
        from pipelines.trusted.provenance import attest

        registration = {"claim": "c1a1", "experiment": exp_name, "kind": "confirmatory", "seed_list": list(seeds),
                        "registered_at_s": 1.0, "hypothesis": {k: hypothesis[k] for k in (
                            "metric", "direction", "min_effect", "alpha", "seeds")}}
        plan = ExperimentPlan(exp_name, "c1a1", CONFIRMATORY, seeds, registration, new_registration=True,
                              facts={"code_tree": "t", "candidate": {"code_version": "c0de", "spec_hash": "5bec"},
                                     "baseline": {"code_version": "c0de", "spec_hash": "ba5e"}})
        attest(tracking_uri=uri, pr=pr, sha=sha, experiment=exp_name, workflow_run_id=run_id,
               plan=plan if planned else None,
               result={"candidate_runs": [{"mlflow_run_id": r} for r in ids["candidate"]],
                       "baseline_runs": [{"mlflow_run_id": r} for r in ids["baseline"]],
                       "verdict": {"outcome": outcome}, "hypothesis": hypothesis})
    return first


def merged_event(n: int) -> PullRequestEvent:
    ref = PullRequestRef(number=n, title="", body="", author="dana", head_sha=SHA_A, head_ref="exp", head_repo=REPO,
                         base_repo=REPO, base_ref="main", state="closed", merged=True, draft=False, labels=())
    return PullRequestEvent(action="closed", pull_request=ref, repo=REPO, sender="erin")


def run_promotion(gh: GitHubEmulator, uri: str, n: int, model: str = "lm") -> list:
    gh.add_workflow_run(REPO, TRAIN_RUN_ID, path=".github/workflows/experiment-train.yml", event="issue_comment")
    ml = MlflowPromotion(uri, model)
    return promote_merged(merged_event(n), PyGithubHost(emulator_config(gh)), ProvenanceLookup(uri), ml, model_name=model,
                          required_approvals=1, bot_login=gh.bot_login, sleep=lambda s: None)


def test_merge_promotes_and_keeps_the_previous_champion(gh: GitHubEmulator, tracking: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    first = train_run(tracking, tmp_path, SHA_B, "supported")
    client = MlflowClient(tracking)
    client.create_registered_model("lm")
    v1 = client.create_model_version("lm", f"{client.get_run(first).info.artifact_uri}/model", run_id=first).version
    client.set_registered_model_alias("lm", CHAMPION, v1)

    n = emulated_repo(gh)
    run_id = train_run(tracking, tmp_path, SHA_A, "supported")
    gh.add_review(REPO, n, user="erin", state="APPROVED")
    gh.merge(REPO, n, merged_by="mia")
    (outcome,) = run_promotion(gh, tracking, n)
    assert outcome.gate.ok and outcome.promotion.changed
    champion = client.get_model_version_by_alias("lm", CHAMPION)
    assert champion.tags["pipeline.training_run_id"] == run_id  # the version belongs to its attestation run
    assert client.get_model_version_by_alias("lm", PREVIOUS).version == v1
    assert champion.tags["pipeline.sha"] == SHA_A and champion.tags["pipeline.pr"] == str(n)
    assert champion.tags["pipeline.verdict"] == "supported" and "RoPE" in champion.tags["pipeline.hypothesis"]
    (sticky,) = gh.comments(REPO, n)
    assert "Promoted" in sticky["body"] and "@erin" in sticky["body"]

    # Idempotent: a second delivery changes nothing and still leaves one comment.
    (again,) = run_promotion(gh, tracking, n)
    assert not again.promotion.changed and again.promotion.version == str(champion.version)
    assert len(client.search_model_versions("name = 'lm'")) == 2
    assert len(gh.comments(REPO, n)) == 1


def test_refusals_say_why_and_register_nothing(gh: GitHubEmulator, tracking: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    n = emulated_repo(gh, files=("experiments/refused-exp.yaml",))
    train_run(tracking, tmp_path, SHA_A, "inconclusive", exp_name="refused-exp")
    gh.add_review(REPO, n, user="dana", state="APPROVED")  # the author's own approval
    gh.add_review(REPO, n, user="erin", state="APPROVED", commit_id=SHA_B)  # an older commit
    gh.merge(REPO, n, merged_by="mia")
    (outcome,) = run_promotion(gh, tracking, n, "lm-refused")
    assert outcome.promotion is None
    assert len(outcome.gate.reasons) == 2
    (sticky,) = gh.comments(REPO, n)
    assert "Not promoted" in sticky["body"] and "inconclusive" in sticky["body"]
    assert "0 approving review(s)" in sticky["body"]
    assert MlflowClient(tracking).search_registered_models("name = 'lm-refused'") == []

    # A reviewer approves the final commit and a maintainer applies the override label.
    gh.add_review(REPO, n, user="erin", state="APPROVED")
    gh.add_label(REPO, n, "promote-override", actor="mia")
    (outcome,) = run_promotion(gh, tracking, n, "lm-refused")
    assert outcome.promotion is not None and outcome.gate.override_by == "mia"
    (sticky,) = gh.comments(REPO, n)
    assert "Promoted" in sticky["body"] and "Not promoted" not in sticky["body"]


def test_training_on_another_sha_does_not_count(gh: GitHubEmulator, tracking: str, tmp_path: Path) -> None:
    n = emulated_repo(gh, files=("experiments/other-sha.yaml",))
    train_run(tracking, tmp_path, SHA_B, "supported", exp_name="other-sha")
    gh.add_review(REPO, n, user="erin", state="APPROVED")
    gh.merge(REPO, n, merged_by="mia")
    (outcome,) = run_promotion(gh, tracking, n, "lm-other")
    assert outcome.promotion is None and "no training run" in outcome.gate.reasons[0]


class Unused:
    """Lookup and registry that must not be reached."""

    def training_record(self, experiment: str, sha: str, accept: object = None) -> None:
        raise AssertionError("no lookup expected")

    def promote(self, record: TrainingRecord, tags: object) -> None:
        raise AssertionError("no promotion expected")


def test_unmerged_close_does_nothing(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    event = merged_event(n)
    closed = PullRequestEvent(action="closed", pull_request=PullRequestRef(**{**event.pull_request.__dict__,
                                                                              "merged": False}), repo=REPO, sender="x")
    assert promote_merged(closed, PyGithubHost(emulator_config(gh)), Unused(), Unused(), model_name="lm",
                          bot_login=None) == []
    assert gh.requests_made() == []


# --------------------------------------------------------------------------- reviews as GitHub counts them (issue 19 item 4)


def test_a_writer_who_pushed_to_someone_elses_pr_cannot_approve_it(gh: GitHubEmulator, tracking: str,
                                                                   tmp_path: Path) -> None:
    """erin pushes the last commit to dana's PR, then approves it: through the API (PR commits,
    force-push events) promotion sees that erin pushed the head; erin's approval is not counted."""
    n = emulated_repo(gh, files=("experiments/pushed-exp.yaml",), head_sha=SHA_B)
    gh.push(REPO, n, SHA_A, pusher="erin", force=True)
    train_run(tracking, tmp_path, SHA_A, "supported", exp_name="pushed-exp", pr=n)
    gh.add_review(REPO, n, user="erin", state="APPROVED")
    gh.merge(REPO, n, merged_by="mia")
    assert PyGithubHost(emulator_config(gh)).head_pushers(n) == ("erin",)
    (outcome,) = run_promotion(gh, tracking, n, "lm-pushed")
    assert outcome.promotion is None and "0 approving review(s)" in " ".join(outcome.gate.reasons)
    gh.add_review(REPO, n, user="mia", state="APPROVED")
    (outcome,) = run_promotion(gh, tracking, n, "lm-pushed")
    assert outcome.promotion is not None and outcome.gate.approvals == ("mia",)


# --------------------------------------------------------------------------- whose verdict (issue 36)


def test_a_verdict_the_attest_job_did_not_compute_is_not_promoted(gh: GitHubEmulator, tracking: str,
                                                                    tmp_path: Path) -> None:
    """The review's finding: a sweep had no plan entry, so its attestation carried the pull
    request's own verdict, and promotion took its `supported` like a trusted one. Now such an
    attestation says who computed it (`report`) and promotion refuses it, saying why; the
    override label still applies."""
    n = emulated_repo(gh, files=("experiments/lr-sweep.yaml",))
    train_run(tracking, tmp_path, SHA_A, "supported", exp_name="lr-sweep", pr=n, planned=False)
    gh.add_review(REPO, n, user="erin", state="APPROVED")
    gh.merge(REPO, n, merged_by="mia")
    record = ProvenanceLookup(tracking).training_record("lr-sweep", SHA_A)
    assert record is not None and record.verdict == "supported" and record.verdict_by == "report"
    (outcome,) = run_promotion(gh, tracking, n, "lm-untrusted")
    assert outcome.promotion is None
    assert outcome.gate.reasons == ("the verdict `supported` was computed by the pull request's own code, not by the "
                                    "trusted attest job (no launch plan for it), so it does not count; a reviewer "
                                    "with write access can apply the `promote-override` label to promote anyway",)
    (sticky,) = gh.comments(REPO, n)
    assert "pull request's own code" in sticky["body"]
