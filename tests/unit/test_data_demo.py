"""The demo corpus: deterministic, capped, and three distinct sources."""

from __future__ import annotations

import json
from pathlib import Path

from pipelines.dataprep.demo_corpus import build_demo_corpus


def test_demo_corpus_is_deterministic_and_capped(tmp_path: Path) -> None:
    a = build_demo_corpus(tmp_path / "a", 40_000)
    b = build_demo_corpus(tmp_path / "b", 40_000)
    for name in ("code", "docs", "reference"):
        assert a.paths[name].read_bytes() == b.paths[name].read_bytes()
        assert a.documents[name] > 3
    records = [json.loads(line) for line in a.paths["code"].read_text().splitlines()]
    assert all(r["text"].lstrip().startswith(("def ", "class ", "async def ", "@")) for r in records)
    docs = [json.loads(line)["text"] for line in a.paths["docs"].read_text().splitlines()]
    assert not any(d.lstrip().startswith(("def ", "class ")) for d in docs)
    assert not list(tmp_path.glob("a/.*tmp*"))
