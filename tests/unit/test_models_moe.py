"""Data-dependent shapes and the shipped mixture of experts (issue 30, parts 2 and 3).

Reproduced on the old main: a dropless (Mixtral-style) MoE, whose experts take the tokens
`torch.where` picks, trained in smoke, then re-measuring its FLOPs on fake tensors raised an
uncaught `DynamicOutputShapeException: aten.nonzero`. Now the count falls back to real tiny
tensors and says so; a plug-in's exception is one line naming its file, line and method.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.infra.model_variants import tiny

H, F, E, K, V = 16, 24, 4, 2, 256


class DroplessMoE:
    """A one-layer dropless top-2 mixture written like transformers' Mixtral (`torch.where`)."""

    vocab_size = V

    def flops_per_token(self) -> float:
        return 6.0 * (H * E + K * 2 * H * F + V * H)  # router, top-k experts (up, down), head

    def build(self) -> Any:
        import torch
        from torch import nn

        class Model(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.emb, self.router = nn.Embedding(V, H), nn.Linear(H, E, bias=False)
                self.up = nn.ModuleList(nn.Linear(H, F, bias=False) for _ in range(E))
                self.down = nn.ModuleList(nn.Linear(F, H, bias=False) for _ in range(E))
                self.head = nn.Linear(H, V, bias=False)

            def forward(self, input_ids: Any, labels: Any = None, **_: Any) -> Any:
                x = self.emb(input_ids).reshape(-1, H)
                weights, chosen = torch.topk(self.router(x).softmax(-1), K, dim=-1)
                y = torch.zeros_like(x)
                for e in range(E):
                    token, slot = torch.where(chosen == e)
                    y = y.index_add(0, token, self.down[e](self.up[e](x[token]).relu()) * weights[token, slot, None])
                logits = self.head(y)
                loss = nn.functional.cross_entropy(logits, labels.reshape(-1))
                return type("Out", (), {"loss": loss, "logits": logits})()

        return Model()


def test_a_dropless_moe_is_counted_on_real_tensors_and_equals_its_declared_flops():
    from trainer.measure import count_training_flops, measure_training_flops

    arch = DroplessMoE()
    assert count_training_flops(arch, 8, batch=2) == arch.flops_per_token()
    count = measure_training_flops(arch, 8, batch=2)
    assert count.tensors == "real" and "aten.nonzero" in (count.reason or "")
    assert count.describe().startswith("real tensors on the CPU (DynamicOutputShapeException: aten.nonzero")


def test_the_shipped_moe_counts_active_parameters_and_all_of_them():
    arch = tiny("moe")
    expert = 3 * arch.hidden_size * arch.intermediate_size
    skipped = arch.num_layers * (arch.num_experts - arch.top_k) * expert
    assert arch.active_parameter_count() == arch.parameter_count() - skipped
    assert sum(arch.parameters_by_role().values()) == arch.parameter_count()
    assert arch.flops_per_token(32) == 6 * arch.matmul_parameters() + arch.attention_flops_per_token(32)
    assert arch.tp_problem(2) is None
    assert "intermediate_size" in (tiny("moe", intermediate_size=63).tp_problem(2) or "")
    with pytest.raises(ValueError, match="top_k"):
        type(arch).model_validate(arch.model_dump() | {"top_k": 5})


def test_the_auxiliary_loss_joins_training_only_and_router_load_is_reported_then_reset():
    import torch

    arch = tiny("moe")
    torch.manual_seed(0)
    model = arch.build()
    ids = torch.randint(0, arch.vocab_size, (2, 16))
    out = model(input_ids=ids, labels=ids)
    model.eval()
    with torch.no_grad():
        plain = model(input_ids=ids, labels=ids)
    assert float(out.loss.detach()) == pytest.approx(float(plain.loss) + arch.router_aux_loss_coef * float(out.aux_loss.detach()))
    metrics = arch.step_metrics(model)  # the eval forward is not counted
    shares = [metrics[f"moe/load/e{i}"] for i in range(arch.num_experts)]
    assert sum(shares) == pytest.approx(1.0) and metrics["moe/load_max"] >= 1.0
    assert metrics["moe/aux_loss"] == pytest.approx(float(out.aux_loss.detach()))
    assert arch.step_metrics(model) == {}  # read once: the window starts again


def test_a_plugin_exception_is_one_line_naming_file_line_and_method():
    import torch

    from trainer.smoke import plugin_failure

    arch = tiny("moe")
    model = arch.build()
    try:
        model(input_ids=torch.zeros(1, 4))  # float ids: the embedding refuses them
    except Exception as exc:  # noqa: BLE001
        line = plugin_failure(exc, "moe")
    assert line is not None and line.startswith("models/moe.py:") and " in MoEModel.forward: RuntimeError: " in line
    assert "\n" not in line
    try:
        raise KeyError("framework")
    except KeyError as exc:
        assert plugin_failure(exc, "moe") is None  # not plug-in code: the caller re-raises it
    from models import Architecture

    try:
        Architecture.build(arch)  # the contract's default: a plug-in that does not define build()
    except NotImplementedError as exc:
        assert plugin_failure(exc, "moe") == ("models/moe.py: build: NotImplementedError: models.moe: build() is "
                                             "part of the contract")
