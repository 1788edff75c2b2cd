"""Runs as the reports layer reads them: seed run directories on disk and `RunRecord`s in memory.

`write_run` writes a seed run directory in the trainer's documented format (result.json,
metrics.jsonl, alerts.jsonl, spec.resolved.json, identity.json with the plan's estimate recorded
at launch), laid out as the
orchestrator lays them out: `<experiment run>/train/seed-<n>/`, for the experiment `SPEC`
with another name, learning rate or mixture. `record` builds the `RunRecord` a report is
made of without any files.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from reports.records import RunRecord
from validation.spec import ExperimentSpec

SPEC = {
    "name": "higher-lr",
    "owner": "ml-platform",
    "hypothesis": {
        "statement": "Doubling the peak learning rate lowers the held-out loss by at least two percent.",
        "metric": "eval/loss", "direction": "decrease", "min_effect": 0.02, "baseline": "base", "seeds": 3,
    },
    "model": {"model_type": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "vocab_size": 256,
              "max_position_embeddings": 64},
    "data": {"sources": [{"name": "code", "path": "data/demo/code.jsonl", "weight": 0.6},
                         {"name": "docs", "path": "data/demo/docs.jsonl", "weight": 0.4}],
             "seq_len": 32, "tokenizer": {"vocab_size": 256}},
    "train": {"lr": 6e-3, "max_steps": 100, "micro_batch_size": 4},
}


def _spec_for(name: str, lr: float, seed: int, code_weight: float = 0.6) -> dict:
    data = json.loads(json.dumps(SPEC))
    data["name"], data["train"]["lr"], data["train"]["seed"] = name, lr, seed
    data["data"]["sources"][0]["weight"], data["data"]["sources"][1]["weight"] = code_weight, round(1 - code_weight, 6)
    return ExperimentSpec.model_validate(data).resolved_dict()


def _launch_estimate() -> dict:
    """What the orchestrator records in identity.json at launch: the plan's estimate of one run
    (`reports.records.launch_estimate`, of the spec as a file gives it)."""
    from reports.records import launch_estimate

    return launch_estimate(ExperimentSpec.model_validate(SPEC))


def write_run(root: Path, name: str, seed: int, *, final_loss: float, lr: float, code_weight: float = 0.6,
              env: dict | None = None, trainer: str = "trainer-aaaa", alerts: list[dict] | None = None,
              check_ok: bool | None = True, status: str = "finished") -> Path:
    """A seed run directory shaped like the trainer's; losses decay to `final_loss`."""
    exp_dir = root / name
    run_dir = exp_dir / "train" / f"seed-{seed}"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.resolved.json").write_text(json.dumps(_spec_for(name, lr, seed, code_weight)))
    (run_dir / "identity.json").write_text(json.dumps({
        "run_id": f"{name}-s{seed}", "experiment": name, "seed": seed, "code_version": "c0de", "dirty": False,
        "spec_hash": "abc", "data_version": f"data-{code_weight}", "identity": f"id-{name}-{seed}",
        "trainer_version": trainer, "pr": 7, "launcher": "local", **_launch_estimate()}))
    lines = []
    for step in range(10, 101, 10):
        loss = final_loss + 2.0 * math.exp(-step / 30)
        lines.append({"step": step, "key": "train/loss", "value": loss + 0.1})
        if step % 50 == 0:
            lines.append({"step": step, "key": "eval/loss", "value": loss})
        lines.append({"step": step, "key": "data/mix/code", "value": code_weight + 0.01})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 1')  # torn last line
    (run_dir / "alerts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in alerts or []))
    if check_ok is not None:  # as validation.data.checks and the orchestrator's check stage write them
        (exp_dir / "stages").mkdir(exist_ok=True)
        (exp_dir / "check").mkdir(exist_ok=True)
        outcomes = [{"check": "min_documents", "source": "code", "observed": 80.0, "expected": "at least 50",
                     "passed": True, "message": ""},
                    {"check": "max_js_divergence", "source": "docs", "observed": 0.3, "expected": "at most 0.15",
                     "passed": check_ok, "message": "drifted"}]
        (exp_dir / "check" / "data_check.json").write_text(json.dumps(
            {"experiment": name, "success": check_ok, "total": 2, "failed": 0 if check_ok else 1, "outcomes": outcomes}))
        (exp_dir / "stages" / "check.json").write_text(json.dumps(
            {"stage": "check", "identity": "x", "status": "ok", "started_at": 0, "finished_at": 1,
             "outputs": {"ok": check_ok, "json": str(exp_dir / "check" / "data_check.json")}}))
    (run_dir / "result.json").write_text(json.dumps({
        "status": status, "mlflow_run_id": None, "steps": 100, "tokens": 12800, "wall_s": 36.0,
        "final_metrics": {"eval/loss": final_loss, "train/loss": final_loss + 0.1, "perf/tokens_per_s": 5000.0 + seed,
                          "perf/mfu": 0.01, "perf/peak_mem_gb": 0.5},
        "env": env or {"python": "3.11", "torch": "2.13.0"}, "alerts": len(alerts or [])}))
    return run_dir


def _curve(final: float, steps: int, every: int = 1) -> list[tuple[int, float]]:
    return [(s, final + 3.0 * math.exp(-s / (steps / 5))) for s in range(every, steps + 1, every)]


def record(name: str, seed: int, final: float, *, steps: int = 400, **changes) -> RunRecord:
    base = RunRecord(
        run_id=f"{name}-s{seed}", experiment=name, seed=seed, status="finished",
        final_metrics={"eval/loss": final, "train/loss": final + 0.1, "perf/tokens_per_s": 5000.0 + seed},
        history={"train/loss": _curve(final + 0.1, steps), "eval/loss": _curve(final, steps, every=50)},
        params={"train.lr": 6e-3 if name != "base" else 3e-3, "model.hidden_size": 64},
        tags={"trainer_version": "t1"}, env={"torch": "2.13.0", "python": "3.11.2"}, mlflow_run_id=f"mlflow{seed}",
    )
    return replace(base, **changes)
