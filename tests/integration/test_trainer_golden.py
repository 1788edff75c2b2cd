"""Golden losses: the per-step training losses of a tiny deterministic CPU run (fp32, 20 steps)
are committed in `tests/golden/losses_tiny.json`; any change to them fails this test.

A change of the losses is a change of behaviour (data order, loss normalisation, init,
optimizer, schedule). When it is deliberate, re-record and commit the new file:

    PIPELINE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/integration/test_trainer_golden.py

The corpus is synthetic and seeded (not the interpreter's standard library, which differs
between Python versions), so the data version is the same on every machine. On the machine
and library versions that recorded the file the losses must be bitwise equal; elsewhere
(another CPU's vector width, another torch) float summation order may differ, so a small
tolerance applies there. Losses are read from `metrics.jsonl` (the run's metric record),
never from log text.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from basics.environment import scoped_environ
from tests.infra.golden_run import REPO, STEPS, tiny_spec, train_losses, write_corpus

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "losses_tiny.json"
UPDATE_ENV = "PIPELINE_UPDATE_GOLDEN"
# Another CPU or torch build: same algorithm, different float summation order (measured
# differences of that kind stay below 1e-5 over 20 steps); a behaviour change moves the
# losses by far more (a changed seed, batch or normalisation: > 1e-2 from step 1).
OTHER_MACHINE_ABS_TOL = 2e-4


def _machine() -> dict[str, str]:
    import platform

    import torch

    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {"torch": torch.__version__, "python": platform.python_version(), "cpu": cpu,
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def run_tiny(tmp: Path) -> dict[int, float]:
    from pipelines.dataprep.prepare import prepare_data
    from trainer.entry import main
    from validation.spec import DataSpec

    corpus = write_corpus(tmp / "corpus")
    spec = tiny_spec(corpus)
    with scoped_environ(PIPELINE_DATA_ROOTS=str(tmp / "corpus")):
        prepared = prepare_data(DataSpec.model_validate(spec["data"]), REPO, tmp / "cache", progress=False)
    run_dir = tmp / "run"
    run_dir.mkdir()
    (run_dir / "spec.resolved.json").write_text(json.dumps(spec))
    code = main(["--spec", str(run_dir / "spec.resolved.json"), "--run-dir", str(run_dir),
                 "--data-dir", str(prepared.path), "--tracking-uri", "none"])
    assert code == 0, (run_dir / "logs" / "rank0.log").read_text()[-3000:]
    return train_losses(run_dir)


def test_tiny_run_reproduces_the_golden_losses(tmp_path: Path) -> None:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the recording's thread count: intra-op splits change summation order
    try:
        losses = run_tiny(tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert sorted(losses) == list(range(1, STEPS + 1))
    if os.environ.get(UPDATE_ENV) == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps({
            "what": "train/loss per step of tests/infra/golden_run.py::tiny_spec (fp32, CPU, 1 thread)",
            "rerecord": f"{UPDATE_ENV}=1 .venv/bin/python -m pytest tests/integration/test_trainer_golden.py",
            "recorded_on": _machine(),
            "losses": {str(k): v for k, v in sorted(losses.items())},
        }, indent=2) + "\n")
        pytest.skip(f"re-recorded {GOLDEN.relative_to(REPO)}; review the diff and commit it")
    assert GOLDEN.is_file(), f"{GOLDEN} missing; record it with {UPDATE_ENV}=1"
    golden = json.loads(GOLDEN.read_text())
    want = {int(k): v for k, v in golden["losses"].items()}
    same_machine = golden["recorded_on"] == _machine()
    how = (f"If this change of the training losses is deliberate, re-record them with "
           f"`{UPDATE_ENV}=1 .venv/bin/python -m pytest tests/integration/test_trainer_golden.py` and commit "
           f"{GOLDEN.relative_to(REPO)} with the reason in the commit message.")
    for step in sorted(want):
        got = losses[step]
        if same_machine:
            assert got == want[step], f"step {step}: loss {got!r} != golden {want[step]!r} (bitwise). {how}"
        else:
            assert abs(got - want[step]) <= OTHER_MACHINE_ABS_TOL, (
                f"step {step}: loss {got!r} vs golden {want[step]!r} (recorded on {golden['recorded_on']}, "
                f"tolerance {OTHER_MACHINE_ABS_TOL} on another machine). {how}")
