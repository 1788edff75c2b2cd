"""Cross-field rules (`validation.rules`): each names the field to change.

Specs are built in code from the real `experiments/base.yaml` with one change each,
so every rule is tested against a realistic neighbourhood, not a hand-made toy.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from validation import rules
from validation.capability import EVERY_LAYOUT, ExecutionCapability
from validation.loader import load_spec
from validation.spec import ExperimentSpec

REPO = Path(__file__).resolve().parents[2]
BASE: dict[str, Any] = load_spec(REPO / "experiments" / "base.yaml").model_dump(mode="json", by_alias=True)
GPUS = {"resource.gpus_per_node": 4, "resource.gpu_type": "h100", "resource.gpu_memory_gb": 80}


def spec_with(changes: dict[str, Any]) -> ExperimentSpec:
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return ExperimentSpec.model_validate(data)


def violations(changes: dict[str, Any], capability: ExecutionCapability = EVERY_LAYOUT) -> list[tuple[str, str]]:
    """Violations of every rule; layouts are held to the planner's full space unless told otherwise
    (what the trainer executes today is tested on its own, below)."""
    return [(".".join(map(str, v.path)), v.message) for v in rules.check(spec_with(changes), capability)]


def test_base_breaks_no_rule():
    assert violations({}) == []


@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    [
        (
            {**GPUS, "parallel": {"dp": 1, "tp": 3, "pp": 1}, "resource.gpus_per_node": 3},
            "parallel.tp",
            "must divide model.num_heads (4)",
        ),
        (
            {**GPUS, "parallel": {"dp": 2, "tp": 2}, "model.num_heads": 4, "model.num_kv_heads": 1},
            "parallel.tp",
            "num_kv_heads (1)",
        ),
        (
            {**GPUS, "parallel": {"dp": 1, "pp": 3}, "resource.gpus_per_node": 3},
            "parallel.pp",
            "must divide model.num_layers (4)",
        ),
        (
            {"parallel": {"dp": 2}},
            "parallel.dp",
            "= 2 must equal the world size resource.nodes*cpu_processes=1 = 1",
        ),
        ({**GPUS, "parallel": {"dp": 2}}, "parallel.dp", "gpus_per_node=4 = 4"),
        ({"parallel": {"dp": 1, "fsdp": True}}, "parallel.fsdp", "not executable on CPU processes"),
        ({"resource.cpu_processes": 2, "parallel": {"dp": 1, "tp": 2}}, "parallel.tp", "not executable on CPU"),
        ({**GPUS, "parallel": {"dp": 1, "tp": 3}, "resource.gpus_per_node": 4}, "parallel.tp",
         "must divide resource.gpus_per_node (4)"),
        (
            {"train.global_batch_size": 32},
            "train.global_batch_size",
            "32 != micro_batch_size*grad_accum_steps*dp = 16*1*1 = 16",
        ),
        (
            {"data.sources": [{"name": "code", "path": "data/demo/code.jsonl", "weight": 0.5}]},
            "data.sources",
            "must sum to 1, got 0.5",
        ),
        ({"hypothesis.metric": "eval/docz/bpb"}, "hypothesis.metric", "did you mean 'docs'?"),
        (
            {"sweep": {"parameters": {"train.lr": [0.001]}, "metric": "eval/web/loss"}},
            "sweep.metric",
            "source 'web'",
        ),
        (
            {"data.tokenizer": {"vocab_size": 4096}},
            "data.tokenizer.vocab_size",
            "exceeds model.vocab_size (2048)",
        ),
        ({"data.seq_len": 512}, "data.seq_len", "exceeds model.max_position_embeddings (256)"),
        ({"data.tokenizer": {"kind": "local", "vocab_size": 2048}}, "data.tokenizer.path", "needs a path"),
        (
            {"data.tokenizer": {"kind": "bpe", "path": "data/tok"}},
            "data.tokenizer.path",
            "only used with kind: local",
        ),
        ({"hypothesis.baseline": "base"}, "hypothesis.baseline", "its own baseline"),
        ({"train.warmup_steps": 200}, "train.warmup_steps", "less than the total steps (200)"),
        ({"train.precision": "fp16"}, "train.precision", "fp16 needs GPUs"),
        ({"resource.launcher": "static"}, "resource.rendezvous", "needs rendezvous"),
        ({"resource.rendezvous": "node0:29500"}, "resource.rendezvous", "only used by the static launcher"),
        ({"resource.partition": "gpu"}, "resource.partition", "only used by the slurm launcher"),
        ({"resource.nodes": 2}, "resource.nodes", "needs slurm or static"),
        ({"resource.gpus_per_node": 1}, "resource.gpu_type", "set the accelerator type"),
        (
            {"sweep": {"parameters": {"train.learnin_rate": [0.1]}}},
            "sweep.parameters.train.learnin_rate",
            "is not a field",
        ),
        (
            {"sweep": {"parameters": {"model.hidden_size.x": [1]}}},
            "sweep.parameters.model.hidden_size.x",
            "has no sub-fields",
        ),
        (
            {"sweep": {"parameters": {"data.tokenizer": [1]}}},
            "sweep.parameters.data.tokenizer",
            "is a section",
        ),
        (
            {"sweep": {"parameters": {"model.num_heads": [4, 5]}}},
            "sweep.parameters.model.num_heads",
            "value 5 is invalid",
        ),
        (
            {"sweep": {"parameters": {"train.lr": [1e-3, 2e-3, 3e-3], "train.seed": [1, 2, 3]}}},
            "sweep.max_trials",
            "grid has 9 combinations",
        ),
    ],
)
def test_rule_names_the_field_to_change(changes: dict[str, Any], field: str, fragment: str):
    found = violations(changes)
    assert any(f == field and fragment in message for f, message in found), found


def test_weights_within_tolerance_pass_and_beyond_fail():
    sources = copy.deepcopy(BASE["data"]["sources"])
    sources[2]["weight"] = 0.2 + 5e-7
    assert violations({"data.sources": sources}) == []
    sources[2]["weight"] = 0.2 + 5e-6
    assert [f for f, _ in violations({"data.sources": sources})] == ["data.sources"]


def test_valid_layouts_and_sweeps_pass():
    assert violations({**GPUS, "parallel": {"dp": 1, "tp": 2, "pp": 2}, "train.grad_accum_steps": 2}) == []
    assert violations({**GPUS, "parallel": {"dp": 4, "fsdp": True}, "train.global_batch_size": 64}) == []
    assert violations({"sweep": {"parameters": {"train.lr": [1e-3, 2e-3]}, "method": "grid"}}) == []
    assert (
        violations(
            {"resource.launcher": "static", "resource.rendezvous": "10.0.0.1:29500", "resource.nodes": 2}
        )
        == []
    )
    assert (
        violations({"resource.launcher": "slurm", "resource.partition": "debug", "resource.nodes": 2}) == []
    )


def test_token_budget_steps_feed_the_warmup_rule():
    # 16 rows x 128 tokens = 2048 tokens per step: a budget of 20480 tokens is 10 steps.
    found = violations({"train.max_steps": None, "train.token_budget": 20480})
    assert found == [("train.warmup_steps", "20 must be less than the total steps (10)")]


def test_all_rules_run_and_report_together():
    found = violations({"data.seq_len": 512, "train.precision": "fp16", "hypothesis.baseline": "base"})
    assert [f for f, _ in found] == ["data.seq_len", "hypothesis.baseline", "train.precision"]


def test_the_capability_refuses_what_the_trainer_cannot_run_and_says_what_to_change():
    dp_only = ExecutionCapability(gpu=frozenset({"dp"}), cpu=frozenset({"dp"}))
    found = violations({**GPUS, "parallel": {"dp": 2, "tp": 2}}, capability=dp_only)
    assert [f for f, _ in found] == ["parallel.tp"]
    assert "tensor parallelism is not executable on GPUs" in found[0][1]
    assert "set tp: 1 with dp = the world size, or parallel: auto" in found[0][1]
    assert [f for f, _ in violations({**GPUS, "parallel": {"dp": 4, "fsdp": True}}, capability=dp_only)] == [
        "parallel.fsdp"
    ]
    assert violations({**GPUS, "parallel": {"dp": 4}}, capability=dp_only) == []
    # A refused axis is reported once, by the refusal: how tp=3 would divide is moot.
    assert [f for f, _ in violations({**GPUS, "parallel": {"dp": 1, "tp": 3}, "resource.gpus_per_node": 3},
                                     capability=dp_only)] == ["parallel.tp"]
    # The default is what the trainer runs (`TRAINER`): pipeline stages with DDP or FSDP replicas and TP.
    assert rules.check(spec_with({**GPUS, "parallel": {"dp": 2, "pp": 2}, "train.grad_accum_steps": 2})) == []
    assert rules.check(spec_with({**GPUS, "parallel": {"dp": 1, "tp": 2, "pp": 2}, "train.grad_accum_steps": 2})) == []
    one = rules.check(spec_with({**GPUS, "parallel": {"dp": 1, "tp": 2, "pp": 2}, "train.grad_accum_steps": 1}))
    assert [v.path for v in one] == [("train", "grad_accum_steps")] and "needs at least 2" in one[0].message


def test_tp_divisibility_is_the_architectures_own():
    # The architecture file answers (models/<model_type>.py, `tp_problem`): gpt2 (fused qkv) has no
    # tensor-parallel plan and no num_kv_heads field at all; llama's kv heads must divide tp.
    from models.gpt2 import Config as GPT2Config  # the fields gpt2 declares (llama's rope/eps/ffn are not)

    base_model = {k: v for k, v in BASE["model"].items() if k in GPT2Config.model_fields}
    gpt2 = {**GPUS, "model": {**base_model, "model_type": "gpt2", "num_heads": 8, "hidden_size": 64},
            "parallel": {"dp": 1, "tp": 4}}
    assert spec_with(gpt2).model.kv_heads == 8
    (found,) = violations(gpt2)
    assert found[0] == "parallel.tp" and "declares no tensor-parallel plan" in found[1]
    llama = {**GPUS, "model.num_heads": 8, "model.hidden_size": 64, "model.num_kv_heads": 2,
             "parallel": {"dp": 1, "tp": 4}}
    assert violations(llama) == [("parallel.tp", "tp=4 must divide model.num_kv_heads (2)")]
