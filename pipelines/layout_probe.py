"""Layout probe, the smoke's second half for sharded layouts: a 2-process CPU step of the
experiment's layout kind.

The one-process smoke (`trainer.smoke.run_smoke`) never builds a sharded model, so a tensor-
parallel plan that does not fit the architecture (reproduced: a gated attention whose gate was
missing from the plan passed validate, plan and smoke, then crashed after `/train` with `size
of tensor a (64) must match b (128)` and was relaunched four times) slipped through. When the
experiment's layout is sharded, this runs the same tiny model with the same kind of layout
(FSDP: dp 2; TP: tp 2) on 2 gloo processes through the local launcher: a few steps, one
sharded (DCP) checkpoint, its export. A failure names its first error line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from validation.resolved import ResolvedExperiment, rebuild, resolve_spec

PROBE_STEPS = 4


def sharded_layout(resolved: ResolvedExperiment) -> dict[str, Any] | None:
    """The 2-process layout of the experiment's kind, or None when it is not sharded."""
    layout = resolved.layout
    if layout.tp > 1:
        return {"dp": 1, "tp": 2}
    if layout.fsdp:
        return {"dp": 2, "fsdp": True}
    return None


def run_layout_probe(resolved: ResolvedExperiment, prepared: Any, run_dir: Path) -> dict[str, Any] | None:
    """Train the smoke model for a few steps on 2 CPU processes in the experiment's layout kind;
    None when the layout is not sharded. Returns the checks, like `run_smoke`."""
    from pipelines.launchers import get_launcher, job_from_spec, run_with_retries
    from trainer.smoke import smoke_spec

    layout = sharded_layout(resolved)
    if layout is None:
        return None
    run_dir = Path(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier probe's files (its own directory)
    run_dir.mkdir(parents=True)
    small = smoke_spec(resolved.spec, prepared.vocab_size, steps=PROBE_STEPS)
    small = rebuild(small, {"parallel": layout, "resource.cpu_processes": 2, "train.checkpoint_interval": 2,
                            "train.max_restarts": 0, "train.micro_batch_size": 2})
    seeded = resolve_spec(small, resolved.repo_root, seeds=[small.train.seed]).for_seed(small.train.seed)
    spec_path = run_dir / "spec.resolved.json"
    seeded.write(spec_path)
    job = job_from_spec(seeded.spec, spec_path=spec_path, run_dir=run_dir, data_dir=prepared.path,
                        tracking_uri="none", max_restarts=0, time_limit_minutes=10)
    outcome = run_with_retries(get_launcher("local"), job)
    result = _read(run_dir / "result.json")
    finished = result.get("status") == "finished"
    sharded = bool(result.get("layout", {}).get("sharded"))
    return {
        "status": "passed" if finished and sharded else "failed",
        "layout": layout,
        "checks": {"sharded_finished": finished, "really_sharded": sharded},
        "steps": result.get("steps"),
        "error": None if finished else (result.get("reason") or outcome.state.detail or "no result.json"),
        "run_dir": str(run_dir),
    }


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
