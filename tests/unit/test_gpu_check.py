"""bench/gpu_check.py's pure parts: the plans of both profiles, the time budget, the goals and the
RESULTS.md section (the whole run is rehearsed in tests/integration/test_gpu_check_rehearsal.py);
and the benches' rotary buffers after `to_empty` (`init_rope_buffers`, issue 41 item 4)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from validation.spec import ExperimentSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import gpu_check  # noqa: E402
from bench_parallel_memory import init_rope_buffers  # noqa: E402


@pytest.mark.parametrize("profile", sorted(gpu_check.PROFILES))
def test_every_part_has_a_valid_spec_and_the_limits_fit_the_budget(profile: str) -> None:
    p = gpu_check.PROFILES[profile]
    specs = {key: ExperimentSpec.model_validate(spec) for key, spec in gpu_check.part_specs(p).items()}
    parts = gpu_check.part_list(p)
    assert [part["name"] for part in parts][0] == "device"  # the fork check comes first
    needed = {"throughput-mid", "throughput-large", "compile", "resume", "export"} | {
        f"memory-{layout}" for layout in gpu_check.MEMORY_LAYOUTS}
    assert needed <= set(specs)
    assert sum(part["min_s"] for part in parts) < p["budget_s"]  # every part gets its minimum
    if profile == "gpu":
        assert p["budget_s"] <= 480  # 8 minutes: the device allows 10 per command, 15 per session
        params = {role: specs[f"throughput-{role}"].model.parameter_count() for role in ("mid", "large")}
        assert 3.3e8 < params["mid"] < 4e8 and 1.2e9 < params["large"] < 1.5e9  # ~350M and ~1.3B
        assert {specs[f"memory-{layout}"].train.activation_checkpointing for layout in gpu_check.MEMORY_LAYOUTS} == {
            "none", "selective", "full"}
        assert all(s.train.precision == "bf16" and s.resource.gpus_per_node == 1 for s in specs.values())


def test_each_part_is_cut_to_what_the_budget_leaves_after_the_later_minimums() -> None:
    parts = [{"limit_s": 60, "min_s": 10}, {"limit_s": 100, "min_s": 30}, {"limit_s": 100, "min_s": 20}]
    assert gpu_check.part_timeout(parts, 0, 480) == 60
    assert gpu_check.part_timeout(parts, 1, 70) == 50  # 70 left, 20 kept for the last part
    assert gpu_check.part_timeout(parts, 1, 45) is None  # 25 < its own minimum of 30: skipped
    assert gpu_check.part_timeout(parts, 2, 25) == 25


def report(**parts: Any) -> dict[str, Any]:
    plan = {"precision": "bf16"}
    results = {name: {"status": "ok", "seconds": 12.0, "limit_s": 60.0, "figures": f} for name, f in parts.items()}
    return gpu_check.build_report(plan | {"profile": "gpu"}, results, "fork", 300.0, 480.0, None, []) | {
        "goals": gpu_check.goals(plan, results)}


THROUGHPUT = {"params": 1_364_000_000, "seq_len": 2048, "micro_batch_size": 8,
              "systems": {"bare": {"tokens_per_s": 40000.0, "mfu": 0.42, "repeats": 2, "runs": [{"init_s": 1.0}]},
                          "trainer": {"tokens_per_s": 39000.0, "mfu": 0.41, "repeats": 2, "runs": [{"init_s": 9.0}]},
                          "hf": {"error": "RuntimeError: boom", "repeats": 0, "runs": []}},
              "ratios": {"trainer/bare": 0.975, "trainer/hf": None}}


def test_goals_are_judged_on_the_figures_and_unmeasured_ones_say_so() -> None:
    memory = {"layout": "none", "comparison": {"analytic/allocated": 1.04, "analytic_total/device_used": 0.85}}
    goals = {g["goal"]: g for g in report(**{"throughput-large": THROUGHPUT, "memory-none": memory})["goals"]}
    assert goals["trainer/bare >= 0.97 (1.36B)"]["met"] is True
    assert goals["trainer/hf >= 1 (1.36B)"]["met"] is None  # HF failed: not measured, not "no"
    assert goals["trainer MFU >= 40% (1.36B, bf16)"]["met"] is True
    assert goals["plan within 10% of the real peak: analytic/allocated (none)"]["met"] is True
    assert goals["plan within 10% of the real peak: analytic_total/device_used (none)"]["met"] is False
    assert goals["trainer/bare >= 0.97 (mid)"]["met"] is None  # that part did not run


def test_the_section_renders_partial_and_failed_parts() -> None:
    r = report(**{"throughput-large": THROUGHPUT, "compile": {"error": "TimeoutError: x", "backend": "inductor"}})
    r["parts"]["compile"]["status"] = "timeout"
    r["parts"]["memory-none"] = {"status": "skipped", "seconds": 0, "limit_s": 0, "figures": {}}
    text = gpu_check.render_markdown(r)
    assert text.startswith("\n## GPU acceptance (bench/gpu_check.py, profile gpu)")
    assert "| compile | timeout: TimeoutError: x |" in text and "| memory-none | skipped |" in text
    assert "| 1.36B, seq 2048 x 8 | trainer | 39,000 | 41.0 % |" in text
    assert "(error: RuntimeError: boom)" in text
    assert "| trainer MFU >= 40% (1.36B, bf16) | 0.410 | yes |" in text


def test_init_rope_buffers_restores_what_to_empty_leaves_uninitialised() -> None:
    config = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         vocab_size=16, max_position_embeddings=8)
    reference = LlamaForCausalLM(config).model.rotary_emb.inv_freq.clone()
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.to_empty(device="cpu")
    rotary = model.model.rotary_emb
    with torch.no_grad():  # whatever the allocator left there (transformers' _init_weights is not called)
        rotary.inv_freq.fill_(float("nan"))
        rotary.original_inv_freq.fill_(float("nan"))
    init_rope_buffers(model)
    assert torch.equal(rotary.inv_freq, reference) and torch.equal(rotary.original_inv_freq, reference)
