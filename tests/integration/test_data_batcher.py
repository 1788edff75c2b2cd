"""The trainer-facing data API (`trainer.batches`, the data checks, `pipeline data`, the
preparation) imports no torch, checked in a fresh interpreter."""

from __future__ import annotations

from pathlib import Path


def test_trainer_facing_api_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, trainer.batches, validation.data.checks, pipelines.cmd_data, pipelines.dataprep.prepare; " \
           "print(sorted(m for m in ('torch', 'transformers', 'great_expectations', 'pandas') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
