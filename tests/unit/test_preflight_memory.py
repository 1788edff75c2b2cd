"""The planner's memory estimate agrees with what each rank really holds (issue 12, part 4).

The measured figures come from `bench/bench_parallel_memory.py` (2 CPU ranks, a 48.9M-parameter
Llama, DDP / FSDP2 / FSDP+TP built by the trainer's own trainer/parallel.py), stored with their
machine in bench/results/parallel_memory.json;
`make bench` re-measures them. These tests recompute the estimate with today's estimator and
hold it to the agreement rule, so an estimator change that drifts from the executor fails here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from basics.errors import SpecError
from validation import plan as preflight
from validation.capability import AXES, ExecutionCapability
from validation.spec import ExperimentSpec

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import bench_parallel_memory as bench  # noqa: E402

MEASURED: dict[str, Any] = json.loads(bench.RESULTS_JSON.read_text())
MIB = 2**20

# Every layout is modelled term by term (states, DDP buckets / FSDP working set, activations,
# logits; TP as the trainer runs it: decoder layers split, embeddings, logits and 10 of 34
# activation bytes not), so each is held to +-10 % as well.
TIGHT = {"ddp": 0.10, "fsdp": 0.10, "fsdp_tp_1x2": 0.10, "fsdp_tp_2x1": 0.10}


def _estimate(layout: str) -> preflight.MemoryEstimate:
    spec = bench.bench_spec(layout, MEASURED["micro"], MEASURED["seq"])
    return preflight.estimate_memory(spec, spec.parallel_layout())


def test_every_layout_was_measured():
    assert {row["layout"] for row in MEASURED["rows"]} >= {"ddp", "fsdp", "fsdp_tp_1x2", "fsdp_tp_2x1"}
    assert MEASURED["machine"]["cpu"] and MEASURED["machine"]["torch"]


@pytest.mark.parametrize("row", MEASURED["rows"], ids=lambda row: row["layout"])
def test_estimate_within_30_percent_of_the_measured_peak(row: dict[str, Any]):
    est = _estimate(row["layout"])
    # The import baseline (interpreter, torch, gloo) is what the overhead constant stands for.
    ratio = (est.total_bytes - est.overhead_bytes) / (row["peak_above_mib"] * MIB)
    assert abs(ratio - 1) <= bench.AGREEMENT, f"{row['layout']}: estimate/measured {ratio:.2f}"
    ratio_total = est.total_bytes / (row["peak_abs_mib"] * MIB)
    assert abs(ratio_total - 1) <= bench.AGREEMENT, f"{row['layout']}: estimate/measured total {ratio_total:.2f}"


@pytest.mark.parametrize("layout", sorted(TIGHT))
def test_every_layout_is_modelled_term_by_term(layout: str):
    # Before DDP's gradient buckets and FSDP's unsharded group were counted both were 13-14 % low;
    # with sequence parallelism assumed for TP the 1x2 estimate was 34 % low.
    (row,) = [r for r in MEASURED["rows"] if r["layout"] == layout]
    est = _estimate(layout)
    ratio = (est.total_bytes - est.overhead_bytes) / (row["peak_above_mib"] * MIB)
    assert abs(ratio - 1) <= TIGHT[layout], f"{layout}: estimate/measured {ratio:.2f}"


def test_fsdp_shards_what_the_estimate_says():
    rows = {r["layout"]: r for r in MEASURED["rows"]}
    total = bench.bench_spec("ddp", MEASURED["micro"], MEASURED["seq"]).model.parameter_count()
    assert max(rows["ddp"]["local_params"]) == total
    for layout in ("fsdp", "fsdp_tp_1x2", "fsdp_tp_2x1"):
        # TP splits only the decoder layers: 1x2 holds 32.8M of 48.9M (embedding and LM head whole).
        assert max(rows[layout]["local_params"]) == pytest.approx(_estimate(layout).parameters_per_device, rel=0.01)


# --------------------------------------------------------------------------- auto layout


CPU_FSDP = ExecutionCapability(gpu=frozenset(AXES), cpu=frozenset({"dp", "fsdp"}))


def _auto_spec(gpu_memory_gb: float) -> ExperimentSpec:
    data = bench.bench_spec("ddp", MEASURED["micro"], MEASURED["seq"]).model_dump(mode="json", by_alias=True)
    data.update(parallel="auto", resource={"cpu_processes": 2, "gpu_memory_gb": gpu_memory_gb})
    data.pop("$schema", None)
    return ExperimentSpec.model_validate(data)


def test_auto_picks_fsdp_when_the_model_does_not_fit_replicated_and_says_why():
    # 48.9M params on 2 CPU processes: replicated ~1.8 GiB per process at its peak (2.0 GiB when every
    # category was summed whatever the phase; the dry run showed no gradient where activations peak).
    spec = _auto_spec(1.6)
    plan = preflight.make_plan(spec, capability=CPU_FSDP)
    assert (plan.parallel.dp, plan.parallel.fsdp) == (2, True)
    assert plan.parallel.rejected and plan.parallel.rejected[0].startswith("dp=2 tp=1 pp=1:")
    text = preflight.render_plan_text(plan)
    assert "dp=2 tp=1 pp=1 fsdp (auto)" in text
    why = next(line for line in text.splitlines() if line.strip().startswith("why"))
    assert "first layout that fits 1.6 GiB per device" in why and "dp=2 tp=1 pp=1: 1.8 GiB" in why
    assert "largest group unsharded" in text


def test_auto_stays_replicated_when_it_fits_and_says_why():
    plan = preflight.make_plan(_auto_spec(8), capability=CPU_FSDP)
    assert (plan.parallel.dp, plan.parallel.fsdp) == (2, False)
    assert "plain data parallelism is the cheapest layout" in preflight.render_plan_text(plan)
    assert "DDP gradient buckets" in preflight.render_plan_text(plan)


def test_without_fsdp_in_the_capability_checkpointing_fits_it_and_below_that_nothing_does():
    dp_only = ExecutionCapability(gpu=frozenset(AXES), cpu=frozenset({"dp"}))
    plan = preflight.make_plan(_auto_spec(1.6), capability=dp_only)  # replicated, blocks recomputed
    assert (plan.parallel.dp, plan.parallel.fsdp, plan.parallel.activation_checkpointing) == (2, False, "full")
    with pytest.raises(SpecError, match="no parallel layout fits"):
        preflight.make_plan(_auto_spec(1.0), capability=dp_only)
