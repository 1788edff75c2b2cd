"""The plug-in contract checks catch a researcher's mistakes with one line naming the file and
the method (issue 30, item 1). Reproduced on the old main: a forward that ignores
`position_ids` (packed documents attend to each other: logits off by up to 11.2) and an
optimizer that keeps its state outside `state_dict()` (smoke said only `resume_equal=FAIL`)
passed every contract test.
"""

from __future__ import annotations

from typing import Any, Literal

import pytest

import models
from validation.contract import plugins_touched

NANOGPT = models.architectures()["nanogpt"]


class LeakyNanoGPT(NANOGPT):  # type: ignore[misc, valid-type]
    """nanogpt whose forward uses position_ids for the embeddings but a plain causal mask."""

    model_type: Literal["nanogpt"] = "nanogpt"

    def build(self) -> Any:
        import torch

        model = super().build()

        def forward(input_ids: Any, position_ids: Any = None, labels: Any = None, **_: Any) -> Any:
            s = input_ids.shape[1]
            mask = torch.ones(s, s, dtype=torch.bool).tril()[None, None]
            x = model.wte(input_ids) + model.wpe(position_ids)
            for block in model.blocks:
                x = block(x, mask)
            return type("Out", (), {"loss": None, "logits": model.lm_head(model.ln_f(x))})()

        model.forward = forward
        return model


def test_a_forward_that_lets_packed_documents_attend_to_each_other_fails_the_contract():
    from trainer.contract_checks import check_architecture

    assert check_architecture(NANOGPT, "models/nanogpt.py", only=("packed",)) == []
    failures = check_architecture(LeakyNanoGPT, "tests/unit/test_contract_checks.py", only=("packed",))
    assert failures, "a leaky forward passed"
    first = failures[0]
    assert first.method == "build()" and first.file == "tests/unit/test_contract_checks.py"
    assert first.line == LeakyNanoGPT.build.__code__.co_firstlineno  # the method the author changes
    assert "attend across the document boundary" in first.message and "of 3, tokens" in first.message
    assert first.github().startswith("::error file=tests/unit/test_contract_checks.py,line=")


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
