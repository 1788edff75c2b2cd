"""Every architecture and optimizer under models/ keeps the contract, checked where the numbers
are made (parametrized over what `models.architectures()` discovers, so a new file is tested
the moment it exists):

- the model built on the meta device has exactly the declared parameter count;
- torch's FLOP counter on fake tensors (with a guard that fails when a matmul-like op without
  a FLOP formula ran) counts exactly the declared FLOPs per token;
- every tensor-parallel plan entry names a module of every block, and the parameter roles cover
  every parameter;
- each optimizer builds, steps, and declares its state bytes.
"""

from __future__ import annotations

from typing import Any

import pytest

import models
from tests.infra.model_variants import tiny, variants

ARCHS = sorted(models.architectures())
OPTIMIZERS = sorted(models.optimizer_configs())




def test_the_shipped_architectures_and_optimizers_are_discovered():
    assert {"llama", "gpt2", "qwen2", "mistral", "llama_qknorm", "nanogpt"} <= set(ARCHS)
    assert {"adamw", "muon", "adafactor", "sgd"} <= set(OPTIMIZERS)


def test_one_rule_says_which_files_under_models_are_plugins(tmp_path):
    """Discovery, `pipeline contract` and a run's code version read `models.plugin_paths`."""
    from pipelines.identity import model_paths
    from validation.contract import all_plugins, plugins_touched

    for rel in ("__init__.py", "_helper.py", "flat.py", "pkg/__init__.py", "pkg/layers.py", "not_a_package/x.py",
                "README.md", "optimizers/__init__.py", "optimizers/_groups.py", "optimizers/sgdish.py"):
        (tmp_path / "models" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "models" / rel).write_text("")
    assert [(p.path, p.kind, p.name) for p in models.plugin_paths(tmp_path / "models")] == [
        ("models/__init__.py", None, None), ("models/_helper.py", "architecture", None),
        ("models/flat.py", "architecture", "flat"), ("models/pkg/__init__.py", "architecture", "pkg"),
        ("models/optimizers/__init__.py", "optimizer", None), ("models/optimizers/_groups.py", "optimizer", None),
        ("models/optimizers/sgdish.py", "optimizer", "sgdish")]
    assert [(p.kind, p.name, p.file) for p in all_plugins(tmp_path)] == [
        ("architecture", "flat", "models/flat.py"), ("architecture", "pkg", "models/pkg/__init__.py"),
        ("optimizer", "sgdish", "models/optimizers/sgdish.py")]
    assert model_paths(tmp_path, "pkg", "sgdish") == (
        "models/__init__.py", "models/_helper.py", "models/pkg",
        "models/optimizers/__init__.py", "models/optimizers/_groups.py", "models/optimizers/sgdish.py")
    # By name, not by what exists: a deleted helper still calls for every plug-in of its folder.
    assert [p.name for p in plugins_touched(["models/pkg/layers.py"], tmp_path)] == ["pkg"]
    assert [p.name for p in plugins_touched(["models/_deleted.py"], tmp_path)] == ["flat", "pkg"]
    assert [p.name for p in plugins_touched(["models/__init__.py"], tmp_path)] == ["flat", "pkg", "sgdish"]
    assert plugins_touched(["models/not_a_package/x.py", "models/README.md"], tmp_path) == []


@pytest.mark.parametrize("model_type", ARCHS)
def test_parameter_count_equals_the_meta_device_build(model_type: str):
    from trainer.measure import parameter_count_on_meta

    for arch in variants(model_type):
        assert parameter_count_on_meta(arch) == arch.parameter_count(), arch
        assert arch.embedding_parameters() + arch.block_parameters() == arch.parameter_count()


@pytest.mark.parametrize("model_type", ARCHS)
def test_flops_per_token_equal_the_fake_tensor_count(model_type: str):
    from trainer.measure import count_training_flops

    for arch in variants(model_type):
        for seq_len in (16, 32):
            counted = count_training_flops(arch, seq_len, batch=2)
            assert counted == pytest.approx(arch.flops_per_token(seq_len), rel=1e-12), (arch, seq_len)


def test_the_flop_guard_fails_on_an_op_without_a_formula():
    # The blind spot it exists for: an executed matmul-like op without a FLOP formula counts 0.
    import torch

    from trainer.measure import MeasureError, UncountedOps, count_training_flops

    with UncountedOps() as guard:
        torch.ops.aten._weight_int8pack_mm(torch.randn(2, 8), torch.randint(-8, 8, (4, 8), dtype=torch.int8),
                                            torch.ones(4))
    assert guard.missing == {"_weight_int8pack_mm"}

    class Unknown:  # a model whose forward runs such an op
        vocab_size = 256

        def build(self) -> Any:
            class M(torch.nn.Module):
                def __init__(self) -> None:
                    super().__init__()
                    self.w = torch.nn.Parameter(torch.randn(256, 8))

                def forward(self, input_ids: Any, **_: Any) -> Any:
                    x = self.w[input_ids]
                    y = torch.ops.aten._weight_int8pack_mm(x.detach().reshape(-1, 8), torch.zeros(4, 8, dtype=torch.int8),
                                                           torch.ones(4))
                    return type("O", (), {"loss": (x.sum() + y.sum())})()

            return M()

    with pytest.raises(MeasureError, match="_weight_int8pack_mm"):
        count_training_flops(Unknown(), 8)


@pytest.mark.parametrize("model_type", ARCHS)
def test_every_tp_plan_entry_names_a_module_of_every_block(model_type: str):
    import torch

    for arch in variants(model_type):
        plan = arch.tensor_parallel_plan()
        with torch.device("meta"):
            model = arch.build()
        blocks = arch.blocks(model)
        assert len(blocks) == arch.num_layers
        for block in blocks:
            names = {name for name, _ in block.named_modules()}
            assert set(plan) <= names, f"{model_type}: {sorted(set(plan) - names)} not in {type(block).__name__}"
        if plan:  # colwise/rowwise entries are linears; replicate entries hold a weight
            for name, style in plan.items():
                module = blocks[0].get_submodule(name)
                assert hasattr(module, "weight"), (name, style)


@pytest.mark.parametrize("model_type", ARCHS)
def test_param_roles_cover_every_parameter(model_type: str):
    import torch

    arch = tiny(model_type)
    with torch.device("meta"):
        model = arch.build()
    roles = {name: arch.param_role(name, p) for name, p in model.named_parameters()}
    assert set(roles.values()) <= {"hidden", "embedding", "head", "scalar"}
    assert "hidden" in roles.values() and "scalar" in roles.values()
    # Hidden matrices are 2-D and live inside the blocks (what Muon orthogonalises).
    block_params = {id(p) for b in arch.blocks(model) for p in b.parameters()}
    for name, p in model.named_parameters():
        if roles[name] == "hidden":
            assert p.dim() == 2 and id(p) in block_params, name


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_optimizer_builds_steps_and_declares_its_state(name: str):
    import torch

    arch = tiny("llama")
    torch.manual_seed(0)
    model = arch.build()
    config = models.optimizer_configs()[name]()
    train = type("Train", (), {"lr": 1e-3, "weight_decay": 0.1, "optimizer": config})()
    named = [(n, p, arch.param_role(n, p)) for n, p in model.named_parameters()]
    opt = config.build(named, train)
    ids = torch.randint(0, 256, (2, 16))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert len(moved) == len(before), f"{name} left {set(before) - set(moved)} unchanged"
    for role in ("hidden", "embedding", "head", "scalar"):
        assert config.state_bytes_per_parameter(role, (64, 64)) >= 0
    # What the plan assumes for the state is what the optimizer really keeps (within 10 %).
    kept = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
               if torch.is_tensor(t) and t.dim() > 0)
    declared = sum(config.state_bytes_per_parameter(r, tuple(p.shape)) * p.numel() for _, p, r in named)
    assert kept == pytest.approx(declared, rel=0.1), (kept, declared)
