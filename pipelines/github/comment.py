"""One comment per PR and experiment, updated in place (CML's watermark idea).

The comment's first line is a hidden marker, `<!-- gitops-train:experiment=<name> -->`;
a second hidden line carries a little JSON state (the head SHA that passed validation,
the stage) that ChatOps reads back. Only comments written by the pipeline's own login and
starting with the marker count, so a user quoting the marker cannot hijack the state.

Idempotence, even when a create request timed out after GitHub applied it: `upsert`
lists first, edits when found, and after a failed create lists again before creating
again. If two copies exist anyway (two jobs raced), the oldest is kept and edited and the
others are deleted.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from pipelines.github.client import CodeHost, Comment, TransientGitHubError
from validation.errors import UsageError
from validation.spec import NAME_PATTERN

GITHUB_COMMENT_LIMIT = 65536
_STATE_RE = re.compile(r"^<!-- gitops-train:state (\{.*\}) -->$")
_KEY_RE = re.compile(r"^(experiment=[a-z0-9][a-z0-9_-]{2,63}|reply=\d{1,20})$")
TRUNCATION_NOTE = "\n\n> **Note:** this comment was truncated to fit GitHub's 65,536-character limit."


def experiment_marker(experiment: str) -> str:
    if not re.match(NAME_PATTERN, experiment):
        raise UsageError(f"experiment name {experiment!r} does not match {NAME_PATTERN}")
    return f"<!-- gitops-train:experiment={experiment} -->"


class StickyComment:
    """The one comment keyed by `key` on PR `number` (`experiment=<name>` or `reply=<id>`)."""

    def __init__(
        self,
        host: CodeHost,
        number: int,
        key: str,
        *,
        author: str | None,
        attempts: int = 4,
        sleep: Callable[[float], None] = time.sleep,
        max_wait: float = 60.0,
    ):
        assert _KEY_RE.match(key), key
        self.host = host
        self.number = number
        self.marker = f"<!-- gitops-train:{key} -->"
        self.author = author
        self.attempts = attempts
        self.sleep = sleep
        self.max_wait = max_wait

    @classmethod
    def for_experiment(cls, host: CodeHost, number: int, experiment: str, **kw: Any) -> StickyComment:
        experiment_marker(experiment)  # validates the name
        return cls(host, number, f"experiment={experiment}", **kw)

    # ----------------------------------------------------------------- reading

    def _ours(self, c: Comment) -> bool:
        return c.body.startswith(self.marker) and (self.author is None or c.author == self.author)

    def find(self) -> Comment | None:
        """The oldest matching comment (without deleting duplicates)."""
        found = [c for c in self.host.list_comments(self.number) if self._ours(c)]
        return min(found, key=lambda c: c.id) if found else None

    def state(self) -> dict[str, Any]:
        """The hidden JSON state of the comment ({} when there is none)."""
        found = self.find()
        return parse_state(found.body) if found else {}

    # ----------------------------------------------------------------- writing

    def compose(self, body: str, state: dict[str, Any] | None) -> str:
        """Marker + state + body, cut to GitHub's limit with a note that says so."""
        head = self.marker + "\n"
        if state:
            # ">" only occurs inside JSON strings; escaping it keeps "-->" out of the HTML comment.
            encoded = json.dumps(state, sort_keys=True).replace(">", "\\u003e")
            head += f"<!-- gitops-train:state {encoded} -->\n"
        text = head + body
        if len(text) > GITHUB_COMMENT_LIMIT:
            text = text[: GITHUB_COMMENT_LIMIT - len(TRUNCATION_NOTE)] + TRUNCATION_NOTE
        return text

    def upsert(self, body: str, state: dict[str, Any] | None = None, *, merge_state: bool = True) -> Comment:
        """Create the comment or edit it in place; never leaves two copies behind.

        With `merge_state`, keys of `state` update the state already stored in the comment
        (so a later stage keeps the validated SHA an earlier one recorded)."""
        for attempt in range(1, self.attempts + 1):
            try:
                existing = self._dedupe()
                if existing is not None:
                    merged = {**parse_state(existing.body), **(state or {})} if merge_state else (state or {})
                    text = self.compose(body, merged)
                    if text == existing.body:
                        return existing
                    return self.host.edit_comment(existing.id, text)
                return self.host.create_comment(self.number, self.compose(body, state))
            except TransientGitHubError as exc:
                # The create (or edit) may have been applied: the next loop lists again first.
                if attempt == self.attempts:
                    raise
                wait = exc.retry_after if exc.retry_after is not None else 2.0 ** (attempt - 1)
                self.sleep(min(self.max_wait, wait))
        raise AssertionError("unreachable")

    def upsert_section(self, section: str, text: str, state: dict[str, Any] | None = None) -> Comment:
        """Replace (or append) a trailing section, keeping the rest of the body as it is.

        Used by promotion to add its outcome under the report without re-rendering it."""
        assert re.fullmatch(r"[a-z0-9-]{1,32}", section), section
        existing = self.find()
        base = strip_header(existing.body) if existing else ""
        tag = f"<!-- gitops-train:section={section} -->"
        if tag in base:
            base = base[: base.index(tag)].rstrip()
        return self.upsert((base + "\n\n" if base else "") + tag + "\n" + text, state)

    def _dedupe(self) -> Comment | None:
        found = sorted((c for c in self.host.list_comments(self.number) if self._ours(c)), key=lambda c: c.id)
        for extra in found[1:]:
            self.host.delete_comment(extra.id)
        return found[0] if found else None


def strip_header(body: str) -> str:
    """The body without the marker and state lines."""
    lines = body.split("\n")
    if lines and lines[0].startswith("<!-- gitops-train:"):
        lines = lines[1:]
        if lines and _STATE_RE.match(lines[0]):
            lines = lines[1:]
    return "\n".join(lines)


def parse_state(body: str) -> dict[str, Any]:
    """The JSON state embedded in a sticky comment; {} when absent or not valid JSON."""
    # Only the line right after the marker: a state-looking line inside the body (report text
    # that quotes user input) must never count.
    lines = body.split("\n", 2)
    m = _STATE_RE.match(lines[1]) if len(lines) > 1 and lines[0].startswith("<!-- gitops-train:") else None
    if not m:
        return {}
    try:
        data = json.loads(m.group(1))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
