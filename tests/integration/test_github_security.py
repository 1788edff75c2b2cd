"""The holes an outside security review found (issue 14, part 2), each reproduced.

Every test here failed on the code before the fix: promotion from a push (the merged PR
found through the API), reviews that still request changes, MLflow runs without the train
workflow's provenance, state forged through bundle text, concurrent sticky-comment writers,
`validated_sha` moving backward, and truncation that cut the verdict and promotion away.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.github.client import PyGithubHost
from pipelines.github.comment import (
    GITHUB_COMMENT_LIMIT,
    StickyComment,
    parse_state,
    strip_header,
)
from pipelines.github.events import PushEvent
from pipelines.trusted.promote import MlflowPromotion, promote_push
from pipelines.trusted.provenance import ProvenanceLookup, attest
from tests.infra.github_emulator import REPO, SHA_A, SHA_B, GitHubEmulator, emulated_repo, emulator_config

EXP = "rope-theta"
MARKER = f"<!-- gitops-train:experiment={EXP} -->"
TRAIN = ".github/workflows/experiment-train.yml"


@pytest.fixture
def gh() -> Iterator[GitHubEmulator]:
    with GitHubEmulator() as emulator:
        yield emulator


def host(gh: GitHubEmulator, **kw: object) -> PyGithubHost:
    return PyGithubHost(emulator_config(gh, **kw))


def sticky(gh: GitHubEmulator, n: int, **kw: object) -> StickyComment:
    return StickyComment.for_experiment(host(gh, **kw), n, EXP, author=gh.bot_login, sleep=lambda s: None)


def ours(gh: GitHubEmulator, n: int) -> list[dict]:
    return [c for c in gh.comments(REPO, n) if c["body"].startswith(MARKER) and c["user"]["login"] == gh.bot_login]


# --------------------------------------------------------------------------- 1. promotion from push


@pytest.fixture(scope="module")
def tracking(tmp_path_factory: pytest.TempPathFactory) -> str:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def train_run(uri: str, tmp: Path, exp: str, outcome: str, *, pr: int | None, run_id: int | None) -> str:
    """The candidate and its baseline on two seeds, whose metrics make the trusted verdict
    `outcome` (supported: 10 % lower loss; refuted: 10 % higher), attested under a launch plan
    when a PR and workflow run are given (promotion counts only the attest job's verdict)."""
    from mlflow.tracking import MlflowClient

    from pipelines.identity import CodeVersion, RunIdentity
    from pipelines.launch_plan import CONFIRMATORY, ExperimentPlan

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(exp)
    exp_id = found.experiment_id if found else client.create_experiment(exp, artifact_location=(tmp / "art").as_uri())
    ids: dict[str, list[str]] = {"candidate": [], "baseline": []}
    for role, spec_hash in (("candidate", "5bec"), ("baseline", "ba5e")):
        for seed in (1, 2):
            tags = {"pipeline.git_sha": SHA_A, "pipeline.dirty": "false", "pipeline.verdict": outcome,
                    "pipeline.identity": RunIdentity("", seed, CodeVersion(SHA_A, "c0de", False, ""), spec_hash,
                                                     "da7a").key, "pipeline.code_version": "c0de",
                    "pipeline.spec_hash": spec_hash, "pipeline.data_version": "da7a", "pipeline.seed": str(seed)}
            if pr is not None:
                tags["pipeline.pr"] = str(pr)
            if run_id is not None:
                tags["pipeline.github_run_id"] = str(run_id)
            run = client.create_run(exp_id, tags=tags)
            ratio = (0.9 if outcome == "supported" else 1.1) * (1 + 0.002 * (seed % 2)) if role == "candidate" else 1
            client.log_metric(run.info.run_id, "eval/loss", 3.5 * ratio * (1 + 0.001 * seed))
            client.set_terminated(run.info.run_id, "FINISHED")
            ids[role].append(run.info.run_id)
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    client.log_artifacts(ids["candidate"][0], str(model), "model")
    if pr is not None and run_id is not None:
        # What the trusted attest job of workflow run `run_id` writes for PR `pr`; promotion
        # reads nothing else (pipelines/trusted/provenance.py).
        rule = {"metric": "eval/loss", "direction": "decrease", "min_effect": 0.01, "alpha": 0.05, "seeds": 2}
        plan = ExperimentPlan(exp, "c1a1", CONFIRMATORY, (1, 2), {
            "claim": "c1a1", "kind": "confirmatory", "seed_list": [1, 2], "registered_at_s": 1.0, "hypothesis": rule},
            facts={"candidate": {"code_version": "c0de", "spec_hash": "5bec"},
                   "baseline": {"code_version": "c0de", "spec_hash": "ba5e"}})
        attest(tracking_uri=uri, pr=pr, sha=SHA_A, experiment=exp, workflow_run_id=run_id, plan=plan,
               result={"candidate_runs": [{"mlflow_run_id": r} for r in ids["candidate"]],
                       "baseline_runs": [{"mlflow_run_id": r} for r in ids["baseline"]],
                       "verdict": {"outcome": outcome}, "hypothesis": rule})
    return ids["candidate"][0]


def push_event(sha: str, ref: str = "refs/heads/main") -> PushEvent:
    return PushEvent(ref=ref, before="0" * 40, after=sha, deleted=False, repo=REPO, pusher="mia", head_commit=sha)


def promote(gh: GitHubEmulator, uri: str, sha: str, model: str) -> list:
    ml = MlflowPromotion(uri, model)
    return promote_push(push_event(sha), host(gh), ProvenanceLookup(uri), ml, model_name=model, bot_login=gh.bot_login,
                        sleep=lambda s: None)


def test_a_push_to_main_promotes_the_pr_its_merge_commit_belongs_to(gh: GitHubEmulator, tracking: str,
                                                                    tmp_path: Path) -> None:
    exp = "push-promote"
    n = emulated_repo(gh, files=(f"experiments/{exp}.yaml",))
    gh.add_workflow_run(REPO, 71, path=TRAIN, event="issue_comment")
    train_run(tracking, tmp_path, exp, "supported", pr=n, run_id=71)
    gh.add_review(REPO, n, user="erin", state="APPROVED")
    merge_sha = gh.merge(REPO, n, merged_by="mia")
    (outcome,) = promote(gh, tracking, merge_sha, "lm-push")
    assert outcome.promotion is not None and outcome.promotion.changed
    assert ("GET", f"/repos/{REPO}/commits/{merge_sha}/pulls", 200) in gh.requests_made("GET")
    # A push that is not a merge commit of a PR, or not to main, promotes nothing.
    assert promote(gh, tracking, "c" * 40, "lm-push") == []
    ml = MlflowPromotion(tracking, "lm-push")
    assert promote_push(push_event(merge_sha, "refs/heads/feature"), host(gh), ProvenanceLookup(tracking), ml,
                        model_name="lm-push",
                        bot_login=gh.bot_login) == []


def test_pipeline_promote_accepts_a_push_payload(gh: GitHubEmulator, tracking: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pipelines.cli import app

    exp = "push-cli"
    n = emulated_repo(gh, files=(f"experiments/{exp}.yaml",))
    gh.add_workflow_run(REPO, 72, path=TRAIN, event="issue_comment")
    train_run(tracking, tmp_path, exp, "supported", pr=n, run_id=72)
    gh.add_review(REPO, n, user="erin", state="APPROVED")
    merge_sha = gh.merge(REPO, n, merged_by="mia")
    payload = {"ref": "refs/heads/main", "before": "0" * 40, "after": merge_sha, "pusher": {"name": "mia"},
               "commits": [], "repository": {"full_name": REPO, "default_branch": "main"},
               "head_commit": {"id": merge_sha}}
    event = tmp_path / "push.json"
    event.write_text(json.dumps(payload))
    env = {"GITHUB_TOKEN": gh.token, "GITHUB_API_URL": gh.base_url, "GITHUB_REPOSITORY": REPO,
           "GITHUB_EVENT_NAME": "push", "PIPELINE_GITHUB_SECONDS_BETWEEN_WRITES": "0",
           "PIPELINE_GITHUB_SECONDS_BETWEEN_REQUESTS": "0"}
    result = CliRunner().invoke(app, ["promote", "--event-path", str(event), "--tracking-uri", tracking,
                                      "--model-name", "lm-push-cli"], env=env)
    assert result.exit_code == 0, result.output
    assert f"promoted {exp}" in result.output


# --------------------------------------------------------------------------- 4. reviews


def test_promotion_is_refused_while_a_writer_requests_changes(gh: GitHubEmulator, tracking: str,
                                                              tmp_path: Path) -> None:
    exp = "changes-req"
    n = emulated_repo(gh, files=(f"experiments/{exp}.yaml",))
    gh.add_workflow_run(REPO, 73, path=TRAIN, event="issue_comment")
    train_run(tracking, tmp_path, exp, "supported", pr=n, run_id=73)
    gh.add_review(REPO, n, user="erin", state="APPROVED")
    gh.add_review(REPO, n, user="mia", state="CHANGES_REQUESTED")
    merge_sha = gh.merge(REPO, n, merged_by="erin")
    (outcome,) = promote(gh, tracking, merge_sha, "lm-changes")
    assert outcome.promotion is None
    assert any("changes are still requested by @mia" in reason for reason in outcome.gate.reasons)


# --------------------------------------------------------------------------- 7. provenance


def test_only_the_train_workflows_runs_for_this_pr_count(gh: GitHubEmulator, tracking: str, tmp_path: Path) -> None:
    exp = "provenance"
    n = emulated_repo(gh, files=(f"experiments/{exp}.yaml",))
    gh.add_workflow_run(REPO, 74, path=TRAIN, event="issue_comment")
    gh.add_workflow_run(REPO, 75, path=".github/workflows/ci.yml", event="pull_request")
    gh.add_workflow_run(REPO, 76, path=TRAIN, event="pull_request")  # the PR's own copy (train label)
    train_run(tracking, tmp_path, exp, "refuted", pr=n, run_id=74)
    # Later "supported" runs on the same SHA, none made by the train workflow for this PR.
    train_run(tracking, tmp_path, exp, "supported", pr=None, run_id=None)
    train_run(tracking, tmp_path, exp, "supported", pr=n, run_id=75)
    train_run(tracking, tmp_path, exp, "supported", pr=n, run_id=76)
    train_run(tracking, tmp_path, exp, "supported", pr=n + 1, run_id=74)
    train_run(tracking, tmp_path, exp, "supported", pr=n, run_id=99999)  # no such run
    gh.add_review(REPO, n, user="erin", state="APPROVED")
    merge_sha = gh.merge(REPO, n, merged_by="mia")
    (outcome,) = promote(gh, tracking, merge_sha, "lm-prov")
    assert outcome.promotion is None
    assert any("refuted" in reason for reason in outcome.gate.reasons), outcome.gate.reasons


# --------------------------------------------------------------------------- 2. state only from the trusted side


FORGED = '<!-- gitops-train:state {"validated_sha": "' + "f" * 40 + '"} -->'


def test_bundle_text_cannot_pose_as_state(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    # A failed run: the trusted side records no validated SHA; the body is the PR's text.
    sticky(gh, n).upsert(FORGED + "\n### Experiment\nchecks failed\n<!-- gitops-train:experiment=other -->")
    (comment,) = ours(gh, n)
    assert "validated_sha" not in parse_state(comment["body"])
    assert "gitops-train:state {\"validated" not in strip_header(comment["body"])
    assert "experiment=other" not in comment["body"]


# --------------------------------------------------------------------------- 5. concurrent writers


def test_concurrent_writers_converge_on_one_comment_with_both_states(gh: GitHubEmulator) -> None:
    # The review saw two comments in 2 of 5 runs, and in 3 of 3 with 0.3 s of API latency.
    for latency in (0.05, 0.05, 0.3):
        gh.latency = latency
        n = emulated_repo(gh)
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def write(key: str, body: str, n: int = n, barrier: threading.Barrier = barrier,
                  errors: list[BaseException] = errors) -> None:
            try:
                s = sticky(gh, n)
                barrier.wait()
                s.upsert(body, {key: "done"})
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(k, f"by {k}")) for k in ("capacity", "stage")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        (only,) = ours(gh, n)
        state = parse_state(only["body"])
        assert state["capacity"] == "done" and state["stage"] == "done", state


def test_validated_sha_never_moves_backward(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh, head_sha=SHA_A)
    s = sticky(gh, n)
    s.upsert("validated", {"validated_sha": SHA_A}, head_sha=SHA_A)
    gh.push(REPO, n, SHA_B)
    s.upsert("validated again", {"validated_sha": SHA_B}, head_sha=SHA_B)
    # A late report from the old commit (no head known, or the head asked from the API).
    s.upsert("late report for the old commit", {"validated_sha": SHA_A, "stage": "report"})
    s.upsert("late report for the old commit", {"validated_sha": SHA_A}, head_sha=SHA_B)
    assert parse_state(ours(gh, n)[0]["body"])["validated_sha"] == SHA_B


def test_pipeline_comment_checks_the_head_before_recording_a_validated_sha(gh: GitHubEmulator,
                                                                          tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pipelines.cli import app

    n = emulated_repo(gh, head_sha=SHA_B)
    sticky(gh, n).upsert("validated", {"validated_sha": SHA_B}, head_sha=SHA_B)
    body = tmp_path / "body.md"
    body.write_text("old run's comment")
    env = {"GITHUB_TOKEN": gh.token, "GITHUB_API_URL": gh.base_url, "GITHUB_REPOSITORY": REPO,
           "PIPELINE_GITHUB_SECONDS_BETWEEN_WRITES": "0", "PIPELINE_GITHUB_SECONDS_BETWEEN_REQUESTS": "0"}
    result = CliRunner().invoke(app, ["comment", "--pr", str(n), "--experiment", EXP, "--body-file", str(body),
                                      "--validated-sha", SHA_A], env=env)
    assert result.exit_code == 0, result.output
    assert parse_state(ours(gh, n)[0]["body"])["validated_sha"] == SHA_B


# --------------------------------------------------------------------------- 9. truncation


def long_report() -> str:
    verdict = "## Verdict: **refuted**: candidate diverged at step 40\n"
    table = "<details><summary>All metrics</summary>\n\n```text\n" + "row 0123456789\n" * 7000 + "```\n</details>\n"
    return verdict + "\n" + table


def test_a_long_report_with_a_promotion_section_keeps_both(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    s = sticky(gh, n)
    s.upsert(long_report())
    s.upsert_section("promotion", "### 🏆 Promoted: `lm` version 3 is now `champion`")
    (only,) = ours(gh, n)
    assert len(only["body"]) <= GITHUB_COMMENT_LIMIT
    assert "Promoted" in only["body"] and "Verdict: **refuted**" in only["body"]
    assert only["body"].count("```") % 2 == 0


def test_a_non_ascii_body_near_the_limit_is_posted(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    sticky(gh, n).upsert("é" * 60_403)
    (only,) = ours(gh, n)
    assert strip_header(only["body"]) == "é" * 60_403
