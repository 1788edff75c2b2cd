"""The sticky comment without the API: the dry-run host keeps it in a file and edits it in
place, an invalid experiment name never becomes a marker, and untrusted text pings nobody
and loads no outside image."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.github.client import DryRunCodeHost
from pipelines.github.comment import StickyComment


def test_dry_run_host_writes_the_comment_to_a_file_and_edits_it(tmp_path: Path) -> None:
    host = DryRunCodeHost(tmp_path)
    s = StickyComment.for_experiment(host, 5, "rope-theta", author=host.bot_login)
    first = s.upsert("## one")
    second = StickyComment.for_experiment(DryRunCodeHost(tmp_path), 5, "rope-theta", author=host.bot_login).upsert("## two")
    assert first.id == second.id
    assert host.path_of(second).read_text().endswith("## two")
    assert len(list(tmp_path.glob("pr-5-comment-*.md"))) == 1


def test_invalid_experiment_names_never_become_markers() -> None:
    from basics.errors import UsageError

    with pytest.raises(UsageError):
        StickyComment.for_experiment(DryRunCodeHost.__new__(DryRunCodeHost), 1, "x --> <script>", author=None)


# --------------------------------------------------------------------------- issue 19 item 5: untrusted text


def test_untrusted_text_pings_nobody_and_loads_no_outside_image() -> None:
    from pipelines.github.comment import ZWSP, neutralize_untrusted

    text = ("cc @acme/ml-platform and @erin; mail a@b.com; `@code`\n"
            "![loss](https://tracker.example/p.png?who=you) ![ok](smoke-loss.png)\n"
            '<img src="http://tracker.example/x.gif">\n[t]: https://tracker.example/t.png\n')
    out = neutralize_untrusted(text)
    assert "@acme" not in out and f"@{ZWSP}acme/ml-platform" in out and f"@{ZWSP}erin" in out
    assert "a@b.com" in out and "`@code`" in out
    assert "tracker.example" not in out and "![ok](smoke-loss.png)" in out
