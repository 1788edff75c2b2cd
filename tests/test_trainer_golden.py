"""Golden losses: the per-step training losses of a tiny deterministic CPU run (fp32, 20 steps)
are committed in `tests/golden/losses_tiny.json`; any change to them fails this test.

A change of the losses is a change of behaviour (data order, loss normalisation, init,
optimizer, schedule). When it is deliberate, re-record and commit the new file:

    PIPELINE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_trainer_golden.py

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
import random
from pathlib import Path
from typing import Any

import pytest

from validation.environment import scoped_environ

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "losses_tiny.json"
UPDATE_ENV = "PIPELINE_UPDATE_GOLDEN"
STEPS = 20
# Another CPU or torch build: same algorithm, different float summation order (measured
# differences of that kind stay below 1e-5 over 20 steps); a behaviour change moves the
# losses by far more (a changed seed, batch or normalisation: > 1e-2 from step 1).
OTHER_MACHINE_ABS_TOL = 2e-4

WORDS = {
    "prose": ("the model reads a line of text and learns which word comes next in the sentence while "
              "every batch holds rows from two sources mixed by weight so the loss falls slowly").split(),
    "code": ("def for in range return if else while import from class self value index list dict "
             "x y z i j k = + - * ( ) : [ ] 0 1 2").split(),
}


def _write_corpus(root: Path) -> dict[str, Path]:
    """Two seeded synthetic sources (400 documents each): identical bytes on every machine."""
    rng = random.Random(1234)
    paths = {}
    root.mkdir(parents=True, exist_ok=True)
    for name, words in WORDS.items():
        path = root / f"{name}.jsonl"
        with open(path, "w", encoding="utf-8") as fh:
            for i in range(400):
                text = " ".join(rng.choice(words) for _ in range(rng.randint(30, 90)))
                fh.write(json.dumps({"id": f"{name}-{i}", "text": f"{name} {i}: {text}"}) + "\n")
        paths[name] = path
    return paths


def tiny_spec(corpus: dict[str, Path]) -> dict[str, Any]:
    return {
        "name": "golden-tiny",
        "owner": "ml-platform",
        "hypothesis": {
            "statement": "A tiny llama trained for twenty steps lowers its loss on the synthetic mixture.",
            "metric": "eval/loss", "direction": "decrease", "min_effect": 0.01, "baseline": "champion",
        },
        "model": {"model_type": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                  "intermediate_size": 64, "vocab_size": 320, "max_position_embeddings": 64},
        "data": {
            "sources": [{"name": "prose", "path": str(corpus["prose"]), "weight": 0.6},
                        {"name": "code", "path": str(corpus["code"]), "weight": 0.4}],
            "seq_len": 32, "tokenizer": {"vocab_size": 256},
        },
        "train": {"lr": 1e-2, "warmup_steps": 2, "max_steps": STEPS, "micro_batch_size": 4, "grad_accum_steps": 1,
                  "log_interval": 1, "eval_interval": 1000, "eval_batches": 1, "checkpoint_interval": 1000,
                  "keep_last": 1, "seed": 11, "precision": "fp32", "deterministic": True},
        "resource": {"cpu_processes": 1},
    }


def train_losses(run_dir: Path) -> dict[int, float]:
    """train/loss per step from metrics.jsonl (each (key, step) is recorded once)."""
    out: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        point = json.loads(line)
        if point["key"] == "train/loss":
            out[int(point["step"])] = float(point["value"])
    return out


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

    corpus = _write_corpus(tmp / "corpus")
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


@pytest.mark.integration
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
            "what": "train/loss per step of tests/test_trainer_golden.py::tiny_spec (fp32, CPU, 1 thread)",
            "rerecord": f"{UPDATE_ENV}=1 .venv/bin/python -m pytest tests/test_trainer_golden.py",
            "recorded_on": _machine(),
            "losses": {str(k): v for k, v in sorted(losses.items())},
        }, indent=2) + "\n")
        pytest.skip(f"re-recorded {GOLDEN.relative_to(REPO)}; review the diff and commit it")
    assert GOLDEN.is_file(), f"{GOLDEN} missing; record it with {UPDATE_ENV}=1"
    golden = json.loads(GOLDEN.read_text())
    want = {int(k): v for k, v in golden["losses"].items()}
    same_machine = golden["recorded_on"] == _machine()
    how = (f"If this change of the training losses is deliberate, re-record them with "
           f"`{UPDATE_ENV}=1 .venv/bin/python -m pytest tests/test_trainer_golden.py` and commit "
           f"{GOLDEN.relative_to(REPO)} with the reason in the commit message.")
    for step in sorted(want):
        got = losses[step]
        if same_machine:
            assert got == want[step], f"step {step}: loss {got!r} != golden {want[step]!r} (bitwise). {how}"
        else:
            assert abs(got - want[step]) <= OTHER_MACHINE_ABS_TOL, (
                f"step {step}: loss {got!r} vs golden {want[step]!r} (recorded on {golden['recorded_on']}, "
                f"tolerance {OTHER_MACHINE_ABS_TOL} on another machine). {how}")
