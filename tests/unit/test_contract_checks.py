"""The plug-in contract checks catch a researcher's mistakes with one line naming the file and
the method (issue 30, item 1). Reproduced on the old main: a forward that ignores
`position_ids` (packed documents attend to each other: logits off by up to 11.2) and an
optimizer that keeps its state outside `state_dict()` (smoke said only `resume_equal=FAIL`)
passed every contract test.

Issue 38: the checks name the cause, each on its own (`only=`), on the mistake files of
tests/infra/mistake_plugins.py (the whole contract on each: tests/integration/test_contract_mistakes.py).
On the old main dropout left on in eval was "tokens attend across the document boundary", a
capacity-limited mixture of experts failed the same way, a global head count in a `view` was
reported at the class line, and the causal leak, the parameter created in forward and the
unsaved buffer passed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import models
from tests.infra.mistake_plugins import load, marker_line, write
from validation.contract import plugins_touched

NANOGPT = models.architectures()["nanogpt"]


@pytest.fixture
def plugin(tmp_path: Path) -> Callable[[str], tuple[Any, str, int]]:
    """A mistake's plug-in file (tests/infra/mistake_plugins.py) in tmp_path: its Config, the path
    failures name, and the line of its marker."""

    def make(mistake: str) -> tuple[Any, str, int]:
        path = write(mistake, tmp_path, mistake)
        return load(path), str(path), marker_line(path.read_text(), mistake)

    return make


def test_a_forward_that_lets_packed_documents_attend_to_each_other_fails_the_contract(plugin: Any):
    from trainer.contract_checks import check_architecture

    config, file, build_line = plugin("boundary_leak")
    (first,) = check_architecture(config, file, only=("packed",))
    assert first.method == "build()" and first.file == file
    assert first.line == build_line  # the method the author changes
    assert "attend across the document boundary" in first.message and "of 3, tokens" in first.message
    assert "the difference starts at token 5, the first of document 2" in first.message
    assert first.github().startswith(f"::error file={file},line={build_line},")


def _leaky_optimizer() -> type:
    from models.optimizers.sgd import Config as SGD

    class LeakyMomentum(SGD):
        """Momentum kept in a dict of its own: not in state_dict(), lost on resume."""

        def build(self, named_params: list[tuple[str, Any, Any]], train: Any) -> Any:
            import torch

            class Heavy(torch.optim.Optimizer):
                def __init__(self, params: list[Any]) -> None:
                    super().__init__(params, {"lr": train.lr})
                    self.velocity: dict[int, Any] = {}

                @torch.no_grad()
                def step(self, closure: Any = None) -> None:
                    for group in self.param_groups:
                        for p in group["params"]:
                            v = self.velocity.setdefault(id(p), torch.zeros_like(p))
                            v.mul_(0.9).add_(p.grad)
                            p.add_(v, alpha=-group["lr"])

            return Heavy([p for _, p, _ in named_params])

    return LeakyMomentum


def test_an_optimizer_with_state_outside_state_dict_names_the_step_and_the_tensor():
    from trainer.contract_checks import check_optimizer

    assert check_optimizer(models.optimizer_configs()["sgd"], "models/optimizers/sgd.py") == []
    failures = check_optimizer(_leaky_optimizer(), "models/optimizers/leaky.py")
    assert len(failures) == 1, failures
    text = failures[0].text()
    assert text.startswith("models/optimizers/leaky.py:1: build(): state_dict() round trip: resumed after step 3, "
                           "step 4 updates '"), text
    assert "weight' differently (max |diff|" in text


@pytest.mark.parametrize(("changed", "expected"), [
    (["experiments/x.yaml", "docs/a.md"], set()),
    (["models/nanogpt.py", "models/optimizers/sgd.py"], {"nanogpt", "sgd"}),
    (["models/_hf.py"], set(models.architectures())),
    (["models/optimizers/_groups.py"], set(models.optimizer_configs())),
    (["models/gone.py"], set()),  # deleted in the pull request
])
def test_changed_files_select_the_plugins_to_check(changed: list[str], expected: set[str]):
    from tests.infra.plugin_clone import REPO

    assert {p.name for p in plugins_touched(changed, REPO)} == expected


def test_a_tp_plan_that_forgets_a_projection_names_the_module_that_fails_and_the_one_left_whole():
    from trainer.contract_checks import check_architecture

    class Forgot(NANOGPT):  # type: ignore[misc, valid-type]
        tp_plan = {k: v for k, v in NANOGPT.tp_plan.items() if k != "attn.v"}

    assert check_architecture(NANOGPT, "models/nanogpt.py", only=("tp",)) == []
    (failure,) = check_architecture(Forgot, "models/forgot.py", only=("tp",))
    assert failure.method == "tp_plan", failure
    assert failure.message.startswith("with tp=2, Block.attn fails: "), failure.message
    assert "linears the plan leaves whole: ['attn.v']" in failure.message
    # What a failure before the first step under TP adds to its first error line (trainer.entry).
    from trainer.contract_checks import tiny, tp_plan_hint

    big = Forgot.model_validate({**tiny(Forgot).model_dump(), "hidden_size": 256, "num_layers": 4})
    assert tp_plan_hint(big) == ("tp_plan of models/nanogpt.py: split by it, Block.attn meets a tensor of the wrong width; "
                             "linears the plan leaves whole: ['attn.v']")
    assert tp_plan_hint(tiny(NANOGPT)) == ""


def test_the_correct_file_passes_the_forward_and_state_checks(tmp_path: Path):
    from trainer.contract_checks import check_architecture

    path = write("from_scratch", tmp_path)
    assert check_architecture(load(path), str(path), only=("tp", "determinism", "causal", "packed", "state")) == []


def test_dropout_left_on_in_eval_is_reported_as_nondeterminism_not_as_a_document_boundary(plugin: Any):
    from trainer.contract_checks import check_architecture

    config, file, line = plugin("eval_dropout")
    (failure,) = check_architecture(config, file, only=("determinism", "causal", "packed"))
    assert (failure.file, failure.line, failure.method) == (file, line, "Attention.forward")
    assert failure.message.startswith("forward is not deterministic in eval mode: the same input twice gives logits")
    assert "first in module 'blocks.0.attn' (Attention)" in failure.message
    assert "document boundary" not in failure.message
    # Packed rows alone (the old main's only forward check) do not blame the boundary either.
    (alone,) = check_architecture(config, file, only=("packed",))
    assert alone.message.startswith("forward is not deterministic in eval mode")


@pytest.mark.parametrize(("mistake", "layout"), [("causal_leak", ""), ("tp_share_leak", " on rank 0's share of tp=2")])
def test_a_token_that_sees_the_future_is_named_with_the_first_position_and_the_module(plugin: Any, mistake: str,
                                                                                    layout: str):
    from trainer.contract_checks import check_architecture

    config, file, line = plugin(mistake)
    # The leak stays inside each document: packed rows equal documents alone, and pass.
    (failure,) = check_architecture(config, file, only=("causal", "packed"))
    assert (failure.file, failure.line, failure.method) == (file, line, "Attention.forward")
    assert failure.message.startswith("causality: position 0 sees the future: changing the tokens after position 0 "
                                      "changes its logits by "), failure.message
    assert f"{layout}; the difference first appears in module 'blocks.0.attn' (Attention)" in failure.message


@pytest.mark.parametrize(("mistake", "method", "culprit"), [
    ("param_in_forward", "Block.forward", "parameter 'blocks.0.gain' is created inside forward"),
    ("unused_parameter", "LayerNorm.__init__", "parameter 'blocks.0.ln_2.weight' has no gradient after a training step"),
    ("unsaved_buffer", "GPT.__init__", "buffer 'running_rms' (registered with persistent=False, so not in state_dict())"),
])
def test_state_a_checkpoint_loses_or_never_trains_is_named_where_it_is_created(plugin: Any, mistake: str, method: str,
                                                                             culprit: str):
    from trainer.contract_checks import check_architecture

    config, file, line = plugin(mistake)
    (failure,) = check_architecture(config, file, only=("state",))
    assert (failure.file, failure.line, failure.method) == (file, line, method)
    assert failure.message.startswith(culprit), failure.message


def test_a_global_head_count_in_a_view_is_reported_at_that_view(plugin: Any):
    from trainer.contract_checks import check_architecture, tiny, tp_plan_hint

    config, file, line = plugin("tp_global_heads")
    (failure,) = check_architecture(config, file, only=("tp", "causal"))
    assert (failure.file, failure.line, failure.method) == (file, line, "Attention.forward")
    assert failure.message.startswith("with tp=2 rank 0 holds 2 of the 4 heads, but this reshape (`q, k, v = "
                                      "(p(x).view(b, s, self.heads, self.head_dim)"), failure.message
    assert "reshape with -1 heads" in failure.message and "linears the plan leaves whole" not in failure.message
    # What a failure before the first step under TP adds to its first error line (trainer.entry).
    big = config.model_validate({**tiny(config).model_dump(), "hidden_size": 256, "num_layers": 4})
    assert tp_plan_hint(big) == (f"models/tp_global_heads.py:{line} (Attention.forward) reshapes to the global head "
                                 "count; under tp each rank holds num_heads / tp heads: reshape with -1 heads")


def test_a_capacity_limited_moe_passes_having_declared_that_its_routing_depends_on_the_row():
    from trainer.contract_checks import check_architecture

    capacity = models.architectures()["moe_capacity"]
    assert capacity.batch_dependence  # declared in the file
    assert check_architecture(capacity, "models/moe_capacity.py", only=("determinism", "causal", "packed")) == []

    class Undeclared(capacity):  # type: ignore[misc, valid-type]
        batch_dependence = ""

    (failure,) = check_architecture(Undeclared, "models/moe_capacity.py", only=("packed",))
    assert "not at a document boundary" in failure.message and "attend across" not in failure.message
    assert "declares `batch_dependence` (why) and `batch_independent_fields()`" in failure.message


def test_a_capacity_router_that_ranks_the_row_by_probability_sees_the_future(tmp_path: Path):
    """Batch-prioritized routing (Switch's variant: the most confident pairs of the row first) makes
    whether a token is dropped depend on later tokens: causality fails, at the router."""
    from trainer.contract_checks import check_architecture

    source = (Path(models.__file__).parent / "moe_capacity.py").read_text().replace('"moe_capacity"', '"moe_ranked"')
    first_come = "            place = (onehot.long().cumsum(dim=1) - 1).gather(2, pairs[..., None]).squeeze(2)  # [b, s*k]\n"
    ranked = ("            order = torch.argsort(-probs.gather(2, chosen).reshape(b, s * k), dim=1, stable=True)\n"
              "            ranked = (onehot.gather(1, order[..., None].expand(-1, -1, e)).long().cumsum(dim=1) - 1)\n"
              "            ranked = ranked.gather(2, pairs.gather(1, order)[..., None]).squeeze(2)\n"
              "            place = torch.empty_like(ranked).scatter_(1, order, ranked)\n")
    assert source.count(first_come) == 1
    path = tmp_path / "moe_ranked.py"
    path.write_text(source.replace(first_come, ranked))
    (failure,) = check_architecture(load(path), str(path), only=("determinism", "causal", "packed"))
    assert failure.method == "CapacityMoE.forward"
    assert failure.message.startswith("causality: position 0 sees the future"), failure.message
    assert "first appears in module 'blocks.0.moe' (CapacityMoE)" in failure.message
