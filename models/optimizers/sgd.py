"""SGD with (Nesterov) momentum: torch.optim.SGD. The cheapest state: one buffer per parameter."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from models import OptimizerConfig, ParamRole
from models.optimizers._groups import decay_groups


class Config(OptimizerConfig):
    """Stochastic gradient descent with momentum (weight decay on matrices only)."""

    name: Literal["sgd"] = "sgd"
    """The optimizer (this file: models/optimizers/sgd.py)."""
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
    """Momentum factor."""
    nesterov: bool = True
    """Nesterov momentum."""

    def state_bytes_per_parameter(self, role: ParamRole, shape: tuple[int, ...] | None = None) -> float:
        return 4.0 if self.momentum else 0.0  # momentum_buffer, fp32

    def build(self, named_params: list[tuple[str, Any, ParamRole]], train: Any) -> Any:
        import torch

        return torch.optim.SGD(decay_groups(named_params, train.weight_decay), lr=train.lr, momentum=self.momentum,
                               nesterov=self.nesterov and self.momentum > 0)
