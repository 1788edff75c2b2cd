"""The GPU acceptance run rehearsed on the CPU, so that it cannot rot between the rare lendings of
a GPU: `bench/gpu_check.py run --prepare rehearsal` is the script `make gpu-check` runs on the
device, with the same parts in their own forked processes and the same report; only the device
(the CPU, gloo) and the plan's numbers (tiny models, a few steps) differ."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PARTS = ["device", "memory-none", "memory-fsdp-selective", "memory-fsdp-full", "resume", "export",
         "throughput-mid", "throughput-large", "compile"]
SYSTEMS = {"bare", "fsdp2", "trainer", "trainer_fsdp", "hf"}


def test_gpu_check_rehearsal_runs_every_part_on_the_cpu(tmp_path: Path) -> None:
    carry, out = tmp_path / "carry", tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_check.py"), "run", "--prepare", "rehearsal", "--carry", str(carry),
         "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=400,
        env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)))
    assert (out / "gpu_check.json").is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    parts = report["parts"]
    logs = {n: p["log_tail"][-1500:] for n, p in parts.items() if p["status"] != "ok"}
    assert {n: p["status"] for n, p in parts.items()} == dict.fromkeys(PARTS, "ok"), logs
    assert proc.returncode == 0 and report["isolation"] == "fork" and report["profile"] == "rehearsal"

    for role in ("mid", "large"):
        figures = parts[f"throughput-{role}"]["figures"]
        systems = figures["systems"]
        assert set(systems) == SYSTEMS and all(s["tokens_per_s"] > 0 and 0 < s["mfu"] < 1 for s in systems.values())
        # every system trains the same packed rows from a random start: loss near ln(vocab 512)
        assert all(abs(s["runs"][0]["loss_first"] - math.log(512)) < 0.3 for s in systems.values())
        # the trainer's FSDP2 path really ran, over a process group of one rank
        assert all(r["sharded"] and r["world"] == 1 for r in systems["trainer_fsdp"]["runs"])
        assert not any(r["sharded"] for r in systems["trainer"]["runs"])
        # nothing a system built outlives it (at 1.3B a leak would starve the next system)
        assert all(r["live_models"] == 0 for s in systems.values() for r in s["runs"])
        assert figures["ratios"]["trainer/bare"] > 0 and figures["ratios"]["trainer/hf"] > 0
    assert parts["throughput-mid"]["figures"]["systems"]["bare"]["repeats"] == 2  # interleaved repeats

    for layout, checkpointing in (("none", "none"), ("fsdp-selective", "selective"), ("fsdp-full", "full")):
        figures = parts[f"memory-{layout}"]["figures"]
        assert figures["activation_checkpointing"] == checkpointing and figures["steps"] == 2
        assert figures["dry_run"]["tracked_bytes"] > 0 and figures["dry_run"]["analytic_bytes"] > 0
        assert figures["real"]["device_used"] > 0 and figures["comparison"]["analytic_total/device_used"] > 0

    resume = parts["resume"]["figures"]
    assert resume["killed_by_sigkill"] and resume["resumed_from"].endswith("step_000002")
    assert resume["losses_compared"] == 3 and resume["losses_bitwise_equal"] and resume["params_bitwise_equal"]
    assert resume["before_kill_bitwise_equal"]

    export = parts["export"]["figures"]
    assert export["run_status"] == "finished" and "model.safetensors" in export["export_files"]
    assert export["fp32_within"] and export["as_trained_within"] and export["tokenizer_same_ids"]

    compiled = parts["compile"]["figures"]
    assert compiled["backend"] == "aot_eager" and compiled["losses_within"]
    assert compiled["eager"]["tokens_per_s"] > 0 and compiled["compiled"]["tokens_per_s"] > 0

    sys.path.insert(0, str(REPO / "bench"))
    import gpu_check

    markdown = (out / "gpu_check.md").read_text()
    assert markdown == gpu_check.render_markdown(report)
    assert "## GPU acceptance (bench/gpu_check.py, profile rehearsal)" in markdown and "| goal |" in markdown
    assert len(report["goals"]) == 2 * 2 + 1 + 2 * 3
    assert (out / "gpu_check-logs.tar.gz").stat().st_size > 0
    plan = json.loads((carry / "plan.json").read_text())
    assert plan["site"] is None and plan["prepared"]["bytes"] < gpu_check.CARRY_LIMIT_BYTES

