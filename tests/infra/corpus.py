"""The demo corpus, built once per test process for each size and copied where a test wants it.

`build_demo_corpus` parses standard-library modules (1-5 s for a capped test corpus, a minute
for the full one) and its output depends only on the interpreter and the cap, so every test that
needs the same cap gets a byte-identical copy of one build. Builds live in one temporary
directory removed when the process exits.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path


@functools.cache
def _builds() -> Path:
    root = Path(tempfile.mkdtemp(prefix="pipeline-test-corpus-"))
    atexit.register(shutil.rmtree, root, True)
    return root


@functools.cache
def _built(max_bytes: int | None) -> Path:
    from pipelines.dataprep.demo_corpus import build_demo_corpus

    out = _builds() / f"max-{max_bytes or 'default'}"
    build_demo_corpus(out, max_bytes)
    return out


def demo_corpus(dest: Path, max_bytes: int | None = None) -> Path:
    """`dest/{code,docs,reference}.jsonl`, as `build_demo_corpus(dest, max_bytes)` writes them."""
    dest = Path(dest)
    shutil.copytree(_built(max_bytes), dest, dirs_exist_ok=True)
    return dest
