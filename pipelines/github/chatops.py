"""ChatOps: `/train [experiment]`, `/cancel`, `/retry` in PR comments, decided safely.

Rules (each one closes a hole that has been used against real projects):

* A command counts only where GitHub renders it as the start of a line of a top-level
  paragraph: the comment is parsed by cmark-gfm (GitHub's own Markdown engine, through
  `cmarkgfm`), so code fences of any length, indented code, HTML comments, quotes and
  their lazy continuation lines, lists and inline code never carry a command. One command
  per comment, the first one; the line must be exactly `/verb` or `/verb <experiment>`.
* The optional argument must match the experiment-name pattern; anything else is
  refused. Nothing from a comment, a title or a branch name is ever interpolated into a
  reply, an output or a command: replies are built only from validated names, logins,
  SHAs and numbers.
* Who may trigger is asked of the API (`collaborators/{user}/permission`: admin,
  maintain or write), never taken from the payload's `author_association`.
* The launch is bound to the PR's head SHA *as the API reports it now*, and only if that
  SHA is the one whose validation passed (the `validated_sha` recorded in the sticky
  comment's state). A push before the command is refused here until the checks pass on
  the new commit. A push *after* it (while the train job waits for the environment's
  reviewers) is caught by the train job's first step, `.github/scripts/train_gate.py head`,
  which asks the API for the head again before any PR code runs; the sticky comment's
  `training` section names the commit the reviewers approve.
* PRs from forks: a comment never starts training, whoever writes it. A maintainer
  (role maintain or admin) starts it explicitly by running the train workflow by hand
  (`workflow_dispatch`) with inputs `pr`, `sha` (the head commit they reviewed) and
  optionally `experiment`; the SHA must still be the PR's head. For a same-repository PR
  `sha` may be left out: the current (validated) head is used.
* Before a launch the experiment files are validated again, by this (default-branch)
  code, at the exact SHA, read as data through the contents API: the PR's own workflow
  run decided the "validated" conclusion, and a same-repository PR can edit that workflow.
* A stranger (no write access) gets one polite reply per pull request, edited in place,
  however many commands they post.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Literal, Protocol

from pipelines.github.client import (
    WRITE_ROLES,
    CodeHost,
    Comment,
    PullRequestInfo,
    RepoContentHost,
    ReviewHost,
)
from pipelines.github.comment import StickyComment, parse_state
from pipelines.github.events import CommentEvent, Event, WorkflowDispatchEvent
from validation.spec import NAME_PATTERN

VERBS = ("train", "cancel", "retry")
MAINTAINER_ROLES = frozenset({"admin", "maintain"})
_COMMAND_LINE = re.compile(r"^/(train|cancel|retry)(?=[ \t]|$)(.*)$")
_OPAQUE = "\x00"  # stands for text GitHub shows inside code, links, emphasis or raw HTML
_EXPERIMENT_FILE = re.compile(r"^experiments/([a-z0-9][a-z0-9_-]{2,63})\.ya?ml$")
_LOGIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?$")
_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Command:
    verb: str
    experiment: str | None = None


@dataclass(frozen=True)
class InvalidCommand:
    verb: str
    reason: str


@dataclass(frozen=True)
class Decision:
    """What to do; `reply` is a comment to post (refusals), built from validated parts only."""

    action: Literal["launch", "cancel", "refuse", "ignore"]
    reason: str
    experiments: tuple[str, ...] = ()
    sha: str = ""
    pr: int = 0
    retry: bool = False
    reply: str | None = None

    def outputs(self) -> dict[str, str]:
        """Step outputs for GitHub Actions (single-line values; no user text)."""
        return {
            "action": self.action,
            "launch": "true" if self.action == "launch" else "false",
            "experiments": json.dumps(list(self.experiments)),
            "experiment": self.experiments[0] if self.experiments else "",
            "sha": self.sha,
            "pr": str(self.pr) if self.pr else "",
            "retry": "true" if self.retry else "false",
            "reason": self.reason,
        }


class _TopLevelText(HTMLParser):
    """Lines of the top-level paragraphs of cmark-gfm's HTML; text inside any inline element
    (code, link, emphasis) or raw HTML becomes `_OPAQUE`, so such a line is no command."""

    _VOID = frozenset({"br", "img", "input", "hr", "wbr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth = 0
        self.in_paragraph = False
        self.inline_depth = 0
        self.paragraphs: list[list[str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._VOID:
            if self.in_paragraph and tag != "br":
                self.paragraphs[-1].append(_OPAQUE)
            return
        if self.depth == 0 and tag == "p":
            self.in_paragraph = True
            self.paragraphs.append([])
        elif self.in_paragraph:
            self.inline_depth += 1
        self.depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in self._VOID:
            return
        self.depth = max(0, self.depth - 1)
        if self.in_paragraph:
            if self.depth == 0:
                self.in_paragraph = False
                self.inline_depth = 0
            else:
                self.inline_depth = max(0, self.inline_depth - 1)

    def handle_data(self, data: str) -> None:
        if self.in_paragraph:
            self.paragraphs[-1].append(_OPAQUE if self.inline_depth else data)

    def handle_comment(self, data: str) -> None:  # raw HTML, shown as omitted by GitHub
        if self.in_paragraph:
            self.paragraphs[-1].append(_OPAQUE)


def command_lines(body: str) -> list[str]:
    """The lines of `body` that GitHub renders at the start of a line of a top-level paragraph."""
    import cmarkgfm

    # Safe mode (the default) replaces raw HTML with a comment, as GitHub hides it.
    html = cmarkgfm.github_flavored_markdown_to_html(body.replace("\r\n", "\n").replace("\r", "\n"))
    walker = _TopLevelText()
    walker.feed(html)
    walker.close()
    return [line.strip(" \t") for paragraph in walker.paragraphs for line in "".join(paragraph).split("\n")]


def parse_commands(body: str) -> list[Command | InvalidCommand]:
    """Every command line in a comment body (pure; see the module docstring for the rules)."""
    found: list[Command | InvalidCommand] = []
    for line in command_lines(body):
        m = _COMMAND_LINE.match(line)
        if not m:
            continue
        verb, args = m.group(1), m.group(2).split()
        if not args:
            found.append(Command(verb))
        elif len(args) == 1 and re.fullmatch(NAME_PATTERN, args[0]):
            found.append(Command(verb, args[0]))
        else:
            found.append(InvalidCommand(verb, "the argument must be one experiment name "
                                              "(lower-case letters, digits, '-' and '_', 3 to 64 characters)"))
    return found


def experiments_in(files: Iterable[str]) -> tuple[str, ...]:
    """Experiment names changed by a PR: `experiments/<name>.yaml` (not removed)."""
    names = []
    for f in files:
        m = _EXPERIMENT_FILE.match(f)
        if m and m.group(1) not in names:
            names.append(m.group(1))
    return tuple(names)


# At most this many experiments per pull request are commented on and trained (the same cap
# as .github/scripts/result_bundle.py MAX_EXPERIMENTS): one PR cannot start a thousand jobs.
MAX_EXPERIMENTS_PER_PR = 10


def experiment_file(root: Path, name: str) -> Path | None:
    """The one experiment-file rule of every job (and of .github/scripts/train_gate.py):
    `experiments/<name>.yaml` or `.yml`, a regular file, not a symlink, not both."""
    if not re.fullmatch(NAME_PATTERN, name) or (root / "experiments").is_symlink():
        return None
    found = []
    for ext in (".yaml", ".yml"):
        path = root / "experiments" / f"{name}{ext}"
        if path.is_symlink():
            return None
        if path.is_file():
            found.append(path)
    return found[0] if len(found) == 1 else None


def validated_shas(comments: Sequence[Comment], experiments: Iterable[str], author: str | None) -> dict[str, str]:
    """experiment -> head SHA whose validation passed, from the sticky comments' state."""
    out: dict[str, str] = {}
    for exp in experiments:
        marker = f"<!-- gitops-train:experiment={exp} -->"
        ours = sorted((c for c in comments if c.body.startswith(marker) and (author is None or c.author == author)),
                      key=lambda c: c.id)
        if ours:
            sha = parse_state(ours[0].body).get("validated_sha")
            if isinstance(sha, str) and _SHA.match(sha):
                out[exp] = sha
    return out


def _hello(login: str) -> str:
    return f"@{login}" if _LOGIN.match(login) else "there"


def decide(
    command: Command | InvalidCommand,
    *,
    actor: str,
    permission: str,
    pr: PullRequestInfo,
    validated: dict[str, str],
    via_dispatch: bool = False,
    dispatch_sha: str | None = None,
) -> Decision:
    """The ChatOps decision (pure): launch, cancel or a polite refusal saying why."""
    hi = _hello(actor)
    who = actor if _LOGIN.match(actor) else "someone"
    n = pr.number

    def refuse(reason: str, text: str) -> Decision:
        return Decision("refuse", reason, pr=n, reply=f"Hi {hi}, {text}\n\nNothing was started.")

    # Permission first: a stranger gets the same single reply whatever they typed.
    if permission not in WRITE_ROLES:
        return refuse(
            "no write access",
            f"thanks for the interest! Only people with write access to this repository can use `/{command.verb}`. "
            "A maintainer will have a look and can start it.",
        )
    if isinstance(command, InvalidCommand):
        return refuse("invalid command", f"I could not read that `/{command.verb}` command: {command.reason}.")
    if pr.state != "open":
        return refuse("pull request not open", f"pull request #{n} is not open any more.")
    if pr.is_fork:
        if not via_dispatch:
            return refuse(
                "fork pull request",
                "this pull request comes from a fork, so comments cannot start training on our runners. "
                "A maintainer can start it explicitly by running the *experiment-train* workflow by hand "
                f"with `pr={n}` and the `sha` of the head commit they reviewed.",
            )
        if permission not in MAINTAINER_ROLES:
            return refuse("fork needs a maintainer", "training a fork's pull request needs a maintainer or admin.")
    if via_dispatch and not dispatch_sha and not pr.is_fork:
        dispatch_sha = pr.head_sha  # a same-repository PR: its current head (it must still be validated)
    if via_dispatch and dispatch_sha != pr.head_sha:
        return refuse("sha is not the head", f"the given commit is not the head of #{n} any more "
                                             f"(head is `{pr.head_sha[:12]}`); review the new commit and run it again.")
    in_pr = experiments_in(pr.files)
    if command.experiment is not None:
        if command.experiment not in in_pr:
            return refuse("experiment not in pull request",
                          f"`{command.experiment}` is not an experiment this pull request adds or changes "
                          f"({', '.join(f'`{e}`' for e in in_pr) or 'none'}).")
        chosen: tuple[str, ...] = (command.experiment,)
    else:
        chosen = in_pr
    if not chosen:
        return refuse("no experiments", "this pull request changes no `experiments/<name>.yaml` file.")
    if len(chosen) > MAX_EXPERIMENTS_PER_PR and command.verb != "cancel":
        return refuse("too many experiments",
                      f"this pull request changes {len(chosen)} experiments; at most {MAX_EXPERIMENTS_PER_PR} "
                      "are handled per pull request. Split it, or name one: `/train <experiment>`.")
    if command.verb == "cancel":
        return Decision("cancel", f"cancel requested by {who}", experiments=chosen, sha=pr.head_sha, pr=n)
    stale = [e for e in chosen if validated.get(e) != pr.head_sha]
    if stale:
        return refuse(
            "head not validated",
            f"the latest commit `{pr.head_sha[:12]}` has not passed validation yet for "
            f"{', '.join(f'`{e}`' for e in stale)} (a newer push resets the approval). "
            f"Wait for the checks to pass on it, then comment `/{command.verb}` again.",
        )
    return Decision("launch", f"{command.verb} by {who} at {pr.head_sha[:12]}", experiments=chosen,
                    sha=pr.head_sha, pr=n, retry=command.verb == "retry")


class ChatOpsHost(CodeHost, ReviewHost, RepoContentHost, Protocol):
    """The PyGithub adapter implements all three."""


def revalidate(host: RepoContentHost, sha: str, experiments: Sequence[str]) -> dict[str, int]:
    """experiment -> number of problems `pipeline validate` (this, the default branch's code)
    finds in its file at `sha`. The files are read through the API as data, never checked out."""
    from validation.loader import check_spec
    from validation.spec import foreign_plugins_allowed

    tree = host.files_at("experiments", sha)
    problems: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="revalidate-") as tmp:
        root = Path(tmp)
        for name, data in tree.items():
            target = (root / name).resolve()
            if not name.startswith("experiments/") or root.resolve() not in target.parents:
                continue  # not a path inside experiments/ (the API never sends one; data is data)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        for exp in experiments:
            path = experiment_file(root, exp)
            if path is None:
                problems[exp] = 1
                continue
            # An architecture or optimizer the PR adds (models/<name>.py) is PR code: never
            # imported here; its own fields were validated by the PR check that ran it.
            with foreign_plugins_allowed():
                _, issues = check_spec(path, repo_root=root)
            if issues:
                problems[exp] = len(issues)
    return problems


def handle_event(event: Event, host: ChatOpsHost, *, bot_login: str | None) -> Decision:
    """Adapter flow: read the command, ask the API for facts, decide, post a refusal once."""
    if isinstance(event, CommentEvent):
        if event.action != "created":
            return Decision("ignore", f"comment {event.action}, not created")
        if not event.is_pull_request:
            return Decision("ignore", "comment on an issue, not a pull request")
        if event.author.endswith("[bot]") or event.author == bot_login:
            return Decision("ignore", "comment by a bot")
        commands = parse_commands(event.body)
        if not commands:
            return Decision("ignore", "no command in the comment")
        command, actor, number, sha, via_dispatch = commands[0], event.author, event.issue_number, None, False
        reply_key = f"reply={event.comment_id}"
    elif isinstance(event, WorkflowDispatchEvent):
        inputs = event.inputs
        verb = inputs.get("command") or "train"
        pr_text = inputs.get("pr", "")
        if not pr_text.isdigit() or verb not in VERBS:
            return Decision("refuse", "workflow_dispatch needs inputs pr (a number) and command in train/cancel/retry")
        experiment = inputs.get("experiment") or None
        if experiment is not None and not re.fullmatch(NAME_PATTERN, experiment):
            command = InvalidCommand(verb, "the experiment input must be one experiment name")
        else:
            command = Command(verb, experiment)
        actor, number, sha, via_dispatch = event.sender, int(pr_text), inputs.get("sha", ""), True
        reply_key = None
    else:
        # No label trigger: a `pull_request` event runs the PR's own copy of the workflow
        # (docs/operations.md); only comments and manual dispatches carry commands.
        return Decision("ignore", f"{event.name} events carry no commands")

    pr = host.pull_request(number)
    permission = host.permission(actor) if _LOGIN.match(actor) else "none"
    comments = host.list_comments(number)
    validated = validated_shas(comments, experiments_in(pr.files), bot_login)
    decision = decide(command, actor=actor, permission=permission, pr=pr, validated=validated,
                      via_dispatch=via_dispatch, dispatch_sha=sha)
    if decision.action == "launch":
        failing = revalidate(host, decision.sha, decision.experiments)
        if failing:
            names = ", ".join(f"`{e}`" for e in decision.experiments if e in failing)
            decision = Decision(
                "refuse", "experiment files do not validate at the head", pr=number,
                reply=f"Hi {_hello(actor)}, {names} does not pass `pipeline validate` (the default branch's) at "
                      f"`{decision.sha[:12]}`. Fix the experiment file and wait for the checks, then comment "
                      f"`/{command.verb}` again.\n\nNothing was started.")
    if decision.action == "launch":
        # What the `gpu-training` environment's reviewers approve: this exact commit. The train
        # job checks again, before any PR code, that it is still the head (train_gate.py head).
        for exp in decision.experiments:
            StickyComment.for_experiment(host, number, exp, author=bot_login).upsert_section(
                "training", launch_notice(decision, exp))
    if decision.reply and reply_key:
        if decision.reason == "no write access" and _LOGIN.match(actor):
            # One reply per stranger and PR, edited in place, however many commands they post.
            reply_key = f"refused={actor}"
        # Otherwise keyed by the command's comment id: a re-run of the job edits, never duplicates.
        StickyComment(host, number, reply_key, author=bot_login).upsert(decision.reply)
    return decision


def launch_notice(decision: Decision, experiment: str) -> str:
    """The sticky comment's `training` section on launch (validated names and a SHA only)."""
    return (f"### ⏳ `{experiment}`: training commit `{decision.sha}`\n\n"
            f"`/{'retry' if decision.retry else 'train'}` was accepted for exactly this commit; the `gpu-training` "
            "environment's reviewers approve it. If the pull request's head is another commit when the training "
            "job starts, nothing trains and this comment says so: comment `/train` again on the new head.")


def write_outputs(decision: Decision, path: str | Path | None) -> None:
    """Append the decision to $GITHUB_OUTPUT (no-op without one)."""
    if not path:
        return
    with open(path, "a", encoding="utf-8") as fh:
        for key, value in decision.outputs().items():
            assert "\n" not in value and "\r" not in value, key
            fh.write(f"{key}={value}\n")
