"""One comment per PR and experiment, updated in place (CML's watermark idea).

The comment's first line is a hidden marker, `<!-- gitops-train:experiment=<name> -->`;
a second hidden line carries a little JSON state (the head SHA that passed validation,
the stage) that ChatOps reads back. Only comments written by the pipeline's own login and
starting with the marker count, so a user quoting the marker cannot hijack the state.

Idempotence, even when a create request timed out after GitHub applied it: `upsert`
lists first, edits when found, and after a failed create lists again before creating
again. If two copies exist anyway (two jobs raced), the oldest is kept and edited and the
others are deleted.

Concurrent writers (optimistic concurrency): GitHub has no compare-and-swap on comments,
so every write carries a `version` (previous + 1) and a random `writer` token in the
state, and the writer reads the comment back afterwards. If the oldest copy does not carry
its token (another writer got in between, or both created a copy), it merges its state
into what is there now and writes again, so the writers converge on one comment holding
every writer's state. This is the only serialisation: the workflows use no concurrency
group (a group's public name would let any workflow run drop a pending writer).

State is composed here, never taken from body text: the state line is always written
(even `{}`), and `<!-- gitops-train:... -->` markers inside a body are removed, so text
from a result bundle cannot pose as state. `validated_sha` only moves to the PR's current
head as the API reports it (`head_sha=`); without a head it may be set once, never
changed, so a late report from an old commit cannot move it backward.

Size: GitHub's limit is 65,536 characters (not bytes) for the whole body. A longer body is
cut structurally (`fit_markdown`): the promotion/capacity sections first, then the report
from the top (its headline and verdict come first) cut at a line, open code fences and
`<details>` closed, and a note linking the full report.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import time
from collections.abc import Callable
from html.parser import HTMLParser
from typing import Any

from basics.errors import TransientGitHubError, UsageError
from pipelines.github.client import CodeHost, Comment
from validation.spec import NAME_PATTERN

GITHUB_COMMENT_LIMIT = 65536
_STATE_RE = re.compile(r"^<!-- gitops-train:state (\{.*\}) -->$")
_KEY_RE = re.compile(r"^(experiment=[a-z0-9][a-z0-9_-]{2,63}|reply=\d{1,20}|refused=[A-Za-z0-9][A-Za-z0-9-]{0,38})$")
TRUNCATION_NOTE = "\n\n> **Note:** this comment was truncated to fit GitHub's 65,536-character limit."
# Our own markers; any other `<!-- gitops-train:... -->` in a body is removed (it could pose as state).
_SECTION_TAG_RE = re.compile(r"^<!-- gitops-train:section=[a-z0-9-]{1,32} -->$", re.M)
_ANY_MARKER_RE = re.compile(r"<!--\s*gitops-train:.*?(?:-->|$)", re.S)
_FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
_BOOKKEEPING = ("version", "writer")


def experiment_marker(experiment: str) -> str:
    if not re.match(NAME_PATTERN, experiment):
        raise UsageError(f"experiment name {experiment!r} does not match {NAME_PATTERN}")
    return f"<!-- gitops-train:experiment={experiment} -->"


class StickyComment:
    """The one comment keyed by `key` on PR `number` (`experiment=<name>`, `reply=<comment id>` or
    `refused=<login>`)."""

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
        """Marker + state + body, the body cleaned of foreign markers and fitted to GitHub's limit.

        The state line is always written (an empty state too): otherwise the body's first
        line would sit where `parse_state` looks."""
        # ">" only occurs inside JSON strings; escaping it keeps "-->" out of the HTML comment.
        encoded = json.dumps(state or {}, sort_keys=True).replace(">", "\\u003e")
        head = f"{self.marker}\n<!-- gitops-train:state {encoded} -->\n"
        return head + fit_markdown(sanitize_body(body), GITHUB_COMMENT_LIMIT - len(head))

    def upsert(self, body: str, state: dict[str, Any] | None = None, *, merge_state: bool = True,
               head_sha: str | None = None, conflicts: int = 8) -> Comment:
        """Create the comment or edit it in place; never leaves two copies behind.

        With `merge_state`, keys of `state` update the state already stored in the comment
        (so a later stage keeps the validated SHA an earlier one recorded). `head_sha`: the
        PR's current head from the API, the only value `validated_sha` may move to.
        After writing, the comment is read back; a concurrent writer's interference makes
        this one merge and write again (at most `conflicts` times)."""
        attempt = 0
        for _ in range(conflicts + 1):
            while True:
                attempt += 1
                try:
                    written = self._write_once(body, state, merge_state=merge_state, head_sha=head_sha)
                    break
                except TransientGitHubError as exc:
                    # The create (or edit) may have been applied: the next loop lists again first.
                    if attempt >= self.attempts:
                        raise
                    wait = exc.retry_after if exc.retry_after is not None else 2.0 ** (attempt - 1)
                    self.sleep(min(self.max_wait, wait))
            comment, token = written
            if token is None:
                return comment  # nothing to change
            try:
                now = self._dedupe()
            except TransientGitHubError:
                return comment  # the write landed; a later writer re-checks
            if now is not None and parse_state(now.body).get("writer") == token:
                return now
            # Someone else wrote in between, or our copy was the younger duplicate: merge again.
            self.sleep(random.uniform(0.02, 0.2))
        raise TransientGitHubError(f"comment on #{self.number}: still contended after {conflicts} retries")

    def _write_once(self, body: str, state: dict[str, Any] | None, *, merge_state: bool,
                    head_sha: str | None) -> tuple[Comment, str | None]:
        existing = self._dedupe()
        old = parse_state(existing.body) if existing is not None else {}
        merged = merge_states(old if merge_state else _keep_validated(old), state or {}, head_sha=head_sha)
        if existing is not None:
            same_state = _without_bookkeeping(old) == merged
            if same_state and strip_header(existing.body) == strip_header(self.compose(body, merged)):
                return existing, None
        token = secrets.token_hex(8)
        merged["version"] = _version(old) + 1
        merged["writer"] = token
        text = self.compose(body, merged)
        if existing is not None:
            return self.host.edit_comment(existing.id, text), token
        return self.host.create_comment(self.number, text), token

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


def merge_states(old: dict[str, Any], new: dict[str, Any], *, head_sha: str | None = None) -> dict[str, Any]:
    """The state after a write (pure): `new` over `old`, except `validated_sha`, which moves
    only to the current head (`head_sha`) and is set without one only when there was none.
    Version bookkeeping is left out (the writer adds its own)."""
    merged = {k: v for k, v in {**old, **new}.items() if k not in ("validated_sha", *_BOOKKEEPING)}
    before, after = old.get("validated_sha"), new.get("validated_sha")
    keep = before if isinstance(before, str) and _SHA_RE.match(before) else None
    if isinstance(after, str) and _SHA_RE.match(after):
        if after == head_sha or (head_sha is None and keep is None):
            keep = after
    if keep is not None:
        merged["validated_sha"] = keep
    return merged


def _keep_validated(state: dict[str, Any]) -> dict[str, Any]:
    return {"validated_sha": state["validated_sha"]} if "validated_sha" in state else {}


def _without_bookkeeping(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k not in _BOOKKEEPING}


def _version(state: dict[str, Any]) -> int:
    v = state.get("version")
    return v if isinstance(v, int) and v >= 0 else 0


def sanitize_body(body: str) -> str:
    """Remove every `<!-- gitops-train:... -->` from a body except our own section tags.

    Bodies carry text written by untrusted code (the PR's result bundle); a marker in it
    could pose as a sticky comment or its state."""
    tags: dict[str, str] = {}

    def keep(m: re.Match[str]) -> str:
        key = f"\x00{len(tags)}\x00"
        tags[key] = m.group(0)
        return key

    text = _SECTION_TAG_RE.sub(keep, body.replace("\x00", ""))
    text = _ANY_MARKER_RE.sub("", text)
    for key, tag in tags.items():
        text = text.replace(key, tag)
    return text


# @login or @org/team, as GitHub links them: not after a word character, an e-mail's local part or a backtick.
_MENTION_RE = re.compile(r"(?<![\w`@/.+-])@(?=[A-Za-z0-9][A-Za-z0-9-]{0,38}(?:/[A-Za-z0-9][\w.-]*)?\b)")
# First pass, cosmetic only (the common spellings keep their alt text and lose the URL); what
# decides is the rendered HTML (`outside_fetches`), whatever the spelling.
_MD_IMAGE_RE = re.compile(r"!\[([^\]\n]{0,500})\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HTML_IMAGE_RE = re.compile(r"<\s*(?:img|picture|source|image|svg)\b[^>]*>", re.I)
_REF_IMAGE_RE = re.compile(r"^ {0,3}\[[^\]\n]+\]:\s*<?(?:https?:)?//\S+.*$", re.M)
# Raw-HTML tags that can fetch something when shown (GitHub keeps some of them).
_FETCHING_TAG_RE = re.compile(r"<(?=(?:img|image|picture|source|video|audio|svg|input|object|embed|iframe|track|use)"
                              r"[\s/>])", re.I)
_FETCH_ATTRS = frozenset({"src", "srcset", "poster", "background", "data", "href", "xlink:href", "lowsrc", "dynsrc"})
_MAX_PROBES = 200
ZWSP = "\u200b"
OUTSIDE_IMAGE_NOTE = "(outside image removed)"


def _outside(url: str) -> bool:
    """Whether a browser would fetch `url` from somewhere else than the page's own site."""
    from urllib.parse import urlsplit

    cleaned = "".join(c for c in url if c > " " and c != "\x7f")  # browsers drop these
    if "\\" in cleaned:
        return True  # `/\host` is `//host` to a browser
    parts = urlsplit(cleaned)
    return bool(parts.scheme or parts.netloc or cleaned.startswith("//"))


class _Fetches(HTMLParser):
    """URLs outside the page that the rendered HTML makes a reader's browser fetch."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("a", "area"):
            return  # links: fetched only when followed
        for name, value in attrs:
            if name in _FETCH_ATTRS and value:
                urls = [c.strip().split(" ")[0] for c in value.split(",")] if name == "srcset" else [value]
                self.found += [u for u in urls if _outside(u)]


def render_github(text: str) -> str:
    """`text` as GitHub renders a comment (cmark-gfm, GitHub's engine; raw HTML kept, as GitHub
    keeps the tags its sanitiser allows)."""
    import cmarkgfm
    from cmarkgfm.cmark import Options

    return str(cmarkgfm.github_flavored_markdown_to_html(text, options=Options.CMARK_OPT_UNSAFE))


def outside_fetches(text: str) -> list[str]:
    """The outside URLs a reader's browser would fetch when GitHub shows `text` (from its rendered HTML)."""
    finder = _Fetches()
    finder.feed(render_github(text))
    finder.close()
    return finder.found


def _defuse(text: str) -> str:
    r"""Each `![` or fetching raw-HTML `<tag` whose escaping removes an outside fetch from the
    rendered HTML is escaped (`!\[`, `&lt;`): the image becomes a plain link or text. Found by
    rendering, so spelling (titles, nested brackets, references, line breaks) does not matter."""
    spots = [m.start() for m in re.finditer(r"!\[", text)] + [m.start() for m in _FETCHING_TAG_RE.finditer(text)]
    if len(spots) > _MAX_PROBES:
        return text
    count = len(outside_fetches(text))
    for pos in sorted(spots, reverse=True):  # from the end: earlier positions stay valid
        if count == 0:
            break
        swapped = text[:pos] + ("!\\[" + text[pos + 2:] if text.startswith("![", pos) else "&lt;" + text[pos + 1:])
        now = len(outside_fetches(swapped))
        if now < count:
            text, count = swapped, now
    return text


def _inert(text: str) -> str:
    """The whole text as a code block (last resort: nothing in it renders)."""
    ticks = max((len(m.group(0)) for m in re.finditer(r"`+", text)), default=0)
    fence = "`" * max(3, ticks + 1)
    return f"> Outside images could not be removed from this text, so it is shown as source.\n\n{fence}text\n{text}\n{fence}"


def neutralize_untrusted(text: str) -> str:
    """Untrusted text (a PR's result bundle, a training report) made safe to post: mentions do
    not notify (`@team` becomes `@` + zero-width space + `team`) and nothing in it makes a
    reader's browser fetch an outside URL, as decided on the HTML that GitHub's own Markdown
    engine renders (`outside_fetches`): images in any spelling, raw `<img>`/`<picture>`/...
    (a relative image stays). A PR cannot page a team or track who reads its comment."""

    def image(m: re.Match[str]) -> str:
        return f"{m.group(1)} {OUTSIDE_IMAGE_NOTE}" if _outside(m.group(2)) else m.group(0)

    text = _MD_IMAGE_RE.sub(image, text)
    text = _HTML_IMAGE_RE.sub(lambda m: OUTSIDE_IMAGE_NOTE if outside_fetches(m.group(0)) else m.group(0), text)
    text = _REF_IMAGE_RE.sub("", text)
    text = _MENTION_RE.sub("@" + ZWSP, text)
    if outside_fetches(text):
        text = _defuse(text)
    return _inert(text) if outside_fetches(text) else text


def full_report_url() -> str | None:
    """The workflow run's page (where the full report is), when running in GitHub Actions."""
    server, repo, run = (os.environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    if server and repo and run and run.isdigit():
        return f"{server.rstrip('/')}/{repo}/actions/runs/{run}"
    return None


def _close_open_blocks(text: str) -> str:
    """Closing lines for the code fences and `<details>` left open at the end of `text`."""
    fence: str | None = None
    details = 0
    for line in text.split("\n"):
        m = _FENCE_RE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)):]:
                fence = None
            continue
        if m:
            fence = m.group(1)
            continue
        details += len(re.findall(r"<details[\s>]", line, re.I)) - len(re.findall(r"</details\s*>", line, re.I))
        details = max(details, 0)
    closers = []
    if fence is not None:
        closers.append(fence)
    closers += ["</details>"] * details
    return ("\n" + "\n".join(closers)) if closers else ""


def _cut(text: str, room: int) -> str:
    """The longest prefix ending at a line break that, with its closers, fits in `room`."""
    if len(text) <= room:
        return text + _close_open_blocks(text)
    cut = text[: max(0, room)]
    while True:
        nl = cut.rfind("\n")
        cut = cut[:nl] if nl > 0 else ""
        closed = cut + _close_open_blocks(cut)
        if len(closed) <= room or not cut:
            return closed if len(closed) <= room else ""


def fit_markdown(body: str, limit: int = GITHUB_COMMENT_LIMIT, *, url: str | None = None) -> str:
    """`body` when it fits in `limit` characters, else a structural cut (pure).

    The trailing sections (`<!-- gitops-train:section=... -->`, promotion and capacity)
    move to the top, the rest is kept from its start (the report puts headline, verdict
    and alerts first) up to a line break, open fences and `<details>` are closed, and a
    note says where the full report is."""
    if len(body) <= limit:
        return body
    url = url or full_report_url()
    note = TRUNCATION_NOTE.rstrip(".") + (f"; the full report is at {url}." if url else
                                          "; the full report is in the workflow run's summary and artifacts.")
    first = _SECTION_TAG_RE.search(body)
    main, sections = (body[: first.start()].rstrip("\n"), body[first.start():]) if first else (body, "")
    room = limit - len(note)
    top = _cut(sections.rstrip("\n"), room // 2 if len(sections) > room // 2 else room) if sections else ""
    rest = room - len(top) - (2 if top else 0)
    kept = _cut(main, rest) if rest > 0 else ""
    out = "\n\n".join(part for part in (top, kept) if part) + note
    assert len(out) <= limit, (len(out), limit)
    return out


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
