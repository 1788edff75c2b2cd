"""Every architecture under models/ keeps the contract where checking it takes a fresh
interpreter (parametrized over what `models.architectures()` discovers, so a new file is
tested the moment it exists):

- importing its config half loads no torch (`pipeline validate` must stay torch-free);
- the declared activation bytes are within 25 % of the tensors one block really saves.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import models
from tests.infra.model_variants import variants

REPO = Path(__file__).resolve().parents[2]
ARCHS = sorted(models.architectures())




@pytest.mark.parametrize("model_type", ARCHS)
def test_config_half_imports_no_torch(model_type: str):
    code = (f"import sys, models.{model_type}, validation.spec, validation.loader; "
            "bad = sorted(m for m in ('torch', 'transformers', 'accelerate') if m in sys.modules); "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"models/{model_type}.py imports {proc.stdout.strip() or proc.stderr[-400:]}"


@pytest.mark.parametrize("model_type", ARCHS)
def test_declared_activation_bytes_are_within_25_percent_of_the_saved_tensors(model_type: str):
    # Measured in a fresh interpreter: what a block saves depends on process-wide torch state
    # (attention backends, grad mode) that an earlier in-process test may have changed.
    configs = [arch.model_dump(mode="json") for arch in variants(model_type)]
    code = ("import json, sys; from validation.spec import model_spec; from trainer.measure import "
            "saved_activation_bytes; print(json.dumps([saved_activation_bytes(model_spec(c), 64, 2).mean "
            "for c in json.loads(sys.argv[1])]))")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(configs)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-1000:]
    measured_all = json.loads(proc.stdout.strip().splitlines()[-1])
    for arch, measured in zip(variants(model_type), measured_all, strict=True):
        declared = arch.activation_bytes_per_layer(64, 2, 4)
        assert abs(declared / measured - 1) <= 0.25, f"{arch}: declared {declared}, saved {measured:.0f}"
