"""User text made safe for the comment's markdown (pure; `render` and `headline` both use it)."""

from __future__ import annotations

import html


def escape_text(text: str) -> str:
    """User text for markdown: no raw HTML, no table breaks, no @-mentions, one line."""
    text = html.escape(" ".join(str(text).split()), quote=False)
    return text.replace("|", "\\|").replace("@", "@\u200b").replace("`", "'")
