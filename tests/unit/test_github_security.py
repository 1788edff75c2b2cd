"""The holes an outside security review found (issue 14, part 2), each reproduced.

Every test here failed on the code before the fix: reviews that still request changes,
state forged through bundle text, and truncation that cut the verdict and promotion away.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.github.client import Review
from pipelines.github.comment import (
    GITHUB_COMMENT_LIMIT,
    fit_markdown,
)
from pipelines.trusted.promote import outstanding_change_requests
from tests.infra.github_emulator import SHA_A, SHA_B

EXP = "rope-theta"


# --------------------------------------------------------------------------- 4. reviews


def test_another_writers_outstanding_change_request_blocks() -> None:
    perms = {"erin": "write", "mia": "maintain", "frank": "read"}

    def r(user: str, state: str, at: str, sha: str = SHA_A) -> Review:
        return Review(user=user, state=state, commit_id=sha, submitted_at=at)

    reviews = [r("erin", "APPROVED", "10"), r("mia", "CHANGES_REQUESTED", "09", SHA_B), r("mia", "COMMENTED", "11"),
               r("frank", "CHANGES_REQUESTED", "12")]
    # mia's request (on an older commit, followed only by a comment) still stands; frank cannot block.
    assert outstanding_change_requests(reviews, author="dana", permissions=perms) == ("mia",)
    # Once mia approves, or her request is dismissed, nothing blocks.
    assert outstanding_change_requests([*reviews, r("mia", "APPROVED", "13")], author="dana", permissions=perms) == ()
    dismissed = [x if x.user != "mia" or x.state != "CHANGES_REQUESTED" else r("mia", "DISMISSED", "09", SHA_B)
                 for x in reviews]
    assert outstanding_change_requests(dismissed, author="dana", permissions=perms) == ()


# --------------------------------------------------------------------------- 2. state only from the trusted side


FORGED = '<!-- gitops-train:state {"validated_sha": "' + "f" * 40 + '"} -->'


def test_verify_rejects_markers_in_bundle_text(tmp_path: Path) -> None:
    import importlib.util
    import sys

    # Standalone (issue 19 item 8): the script's dataclasses look their module up in
    # sys.modules, so register it before executing it, as an import would; the path is
    # the repository's, whatever the working directory.
    rb = sys.modules.get("result_bundle")
    if rb is None:
        script = Path(__file__).resolve().parents[2] / ".github" / "scripts" / "result_bundle.py"
        spec = importlib.util.spec_from_file_location("result_bundle", script)
        assert spec and spec.loader
        rb = importlib.util.module_from_spec(spec)
        sys.modules["result_bundle"] = rb
        spec.loader.exec_module(rb)
    (tmp_path / "pr-number").write_text("7\n")
    (tmp_path / "head-sha").write_text(SHA_A + "\n")
    (tmp_path / "experiments").write_text(EXP + "\n")
    (tmp_path / EXP).mkdir()
    (tmp_path / EXP / "comment.md").write_text("### ok\n" + FORGED + "\n")
    with pytest.raises(rb.BundleRejected, match="gitops-train marker"):
        rb.read_bundle(tmp_path, SHA_A)
    # Characters, not bytes: a 60,403-character non-ASCII body is within GitHub's limit.
    (tmp_path / EXP / "comment.md").write_text("é" * 60_403, encoding="utf-8")
    assert rb.read_bundle(tmp_path, SHA_A).experiments == [EXP]
    (tmp_path / EXP / "comment.md").write_text("é" * (GITHUB_COMMENT_LIMIT + 1), encoding="utf-8")
    with pytest.raises(rb.BundleRejected, match="65536-character"):
        rb.read_bundle(tmp_path, SHA_A)


# --------------------------------------------------------------------------- 9. truncation


def long_report() -> str:
    verdict = "## Verdict: **refuted**: candidate diverged at step 40\n"
    table = "<details><summary>All metrics</summary>\n\n```text\n" + "row 0123456789\n" * 7000 + "```\n</details>\n"
    return verdict + "\n" + table


def test_truncation_is_structural() -> None:
    body = long_report() + "\n<!-- gitops-train:section=promotion -->\n### 🚫 Not promoted\n\n- refuted"
    assert len(body) > 91_000
    out = fit_markdown(body, GITHUB_COMMENT_LIMIT - 200, url="https://example.invalid/run/1")
    assert len(out) <= GITHUB_COMMENT_LIMIT - 200
    # Promotion status and verdict survive, in that order, before the cut table.
    assert out.index("Not promoted") < out.index("Verdict: **refuted**")
    # The cut code block and <details> are closed; the note links the full report.
    assert out.count("```") % 2 == 0
    assert out.count("<details>") == out.count("</details>")
    assert "https://example.invalid/run/1" in out
