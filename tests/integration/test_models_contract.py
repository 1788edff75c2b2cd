"""Every architecture under models/ keeps the contract where checking it takes a fresh
interpreter (parametrized over what `models.architectures()` discovers, so a new file is
tested the moment it exists):

- importing its config half loads no torch (`pipeline validate` must stay torch-free);
- the declared activation bytes are within 25 % of the tensors one block really saves.

Each check's fresh interpreter is shared by every architecture (a module fixture: one process
per check, not one per architecture; what a process costs is its imports). An architecture
whose import check could not be judged there (an earlier one had loaded torch) gets its own.
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


BAD = ("torch", "transformers", "accelerate")
IMPORTS = f"""import json, sys, traceback
import validation.spec, validation.loader
out = {{}}
for model_type in sys.argv[1:]:
    if any(m in sys.modules for m in {BAD!r}):
        out[model_type] = None  # an earlier import loaded torch: this one is judged in its own process
        continue
    try:
        __import__("models." + model_type)
    except Exception:
        out[model_type] = {{"error": traceback.format_exc()[-400:]}}
        continue
    out[model_type] = {{"loaded": sorted(m for m in {BAD!r} if m in sys.modules)}}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def config_imports() -> dict[str, dict[str, object] | None]:
    """What importing each architecture's config half (after validation.spec and .loader) loaded,
    each in turn in one fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", IMPORTS, *ARCHS], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-1000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model_type", ARCHS)
def test_config_half_imports_no_torch(model_type: str, config_imports: dict[str, dict[str, object] | None]):
    seen = config_imports[model_type]
    if seen is None:  # not judged in the shared interpreter: its own, as every one used to be
        code = (f"import sys, models.{model_type}, validation.spec, validation.loader; "
                f"bad = sorted(m for m in {BAD!r} if m in sys.modules); "
                "print(','.join(bad)); sys.exit(1 if bad else 0)")
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"models/{model_type}.py imports {proc.stdout.strip() or proc.stderr[-400:]}"
        return
    assert "error" not in seen, f"models/{model_type}.py: {seen['error']}"
    assert seen["loaded"] == [], f"models/{model_type}.py imports {','.join(seen['loaded'])}"


MEASURE = """import json, sys, traceback
from validation.spec import model_spec
from trainer.measure import saved_activation_bytes
out = {}
for model_type, configs in json.loads(sys.argv[1]).items():
    try:
        out[model_type] = [saved_activation_bytes(model_spec(c), 64, 2).mean for c in configs]
    except Exception:
        out[model_type] = traceback.format_exc()[-1000:]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def saved_bytes() -> dict[str, list[float] | str]:
    """The mean bytes one block's forward saves, for each variant of each architecture (seq 64,
    micro-batch 2), measured in one fresh interpreter: what a block saves depends on process-wide
    torch state (attention backends, grad mode) that an earlier in-process test may have changed;
    the measurement itself changes none (it seeds, hooks and unhooks)."""
    configs = {t: [arch.model_dump(mode="json") for arch in variants(t)] for t in ARCHS}
    proc = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(configs)], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-1000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model_type", ARCHS)
def test_declared_activation_bytes_are_within_25_percent_of_the_saved_tensors(
        model_type: str, saved_bytes: dict[str, list[float] | str]):
    measured_all = saved_bytes[model_type]
    assert not isinstance(measured_all, str), measured_all
    for arch, measured in zip(variants(model_type), measured_all, strict=True):
        declared = arch.activation_bytes_per_layer(64, 2, 4)
        assert abs(declared / measured - 1) <= 0.25, f"{arch}: declared {declared}, saved {measured:.0f}"
