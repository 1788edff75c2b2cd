"""Markdown as GitHub shows it: `cmarkgfm` (bindings to cmark-gfm, GitHub's own Markdown engine)
with raw HTML allowed (GitHub keeps `<details>`/`<summary>`) and the GFM tag filter on."""

from __future__ import annotations


def to_html(markdown: str) -> str:
    import cmarkgfm
    from cmarkgfm.cmark import Options

    return cmarkgfm.github_flavored_markdown_to_html(markdown, options=Options.CMARK_OPT_UNSAFE)
