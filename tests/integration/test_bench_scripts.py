"""The benchmark scripts that cannot be measured here still run (their CPU dry runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_fsdp_bench_dry_run_trains_both_systems():
    # FSDP2 over a 1-rank gloo group and the HF Trainer on a tiny Llama, on the CPU.
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_fsdp_bench.py"), "--dry-run"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout[proc.stdout.index("{\n"):])
    assert figures["dry_run"] and figures["size"] == "tiny"
    assert figures["fsdp2_tokens_per_s"] > 0 and figures["hf_tokens_per_s"] > 0
    assert 0 < figures["fsdp2_mfu"] < 1
    # A random tiny model starts near ln(vocab) = ln(512) = 6.24.
    assert abs(figures["loss"]["first"] - 6.24) < 0.3
