"""`pipeline validate`'s check of a local tokenizer against the model's embedding reads
tokenizer.json as JSON: no torch is imported (checked in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.infra.tokenizer_fit_repo import REPO, spec_file, write_tokenizer


def test_the_check_imports_no_torch(tmp_path: Path):
    write_tokenizer(tmp_path / "data" / "tok", 4096)
    path = spec_file(tmp_path, 2048)
    code = (f"import sys; from validation.loader import check_spec; s, i = check_spec({str(path)!r}, "
            f"repo_root={str(tmp_path)!r}); assert i; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.strip() == "False"
