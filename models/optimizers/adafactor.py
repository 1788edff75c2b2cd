"""Adafactor (Shazeer & Stern 2018): torch.optim.Adafactor, factored second moments for matrices."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from models import OptimizerConfig, ParamRole


class Config(OptimizerConfig):
    """Adafactor: a row and a column second-moment vector per matrix instead of a full one."""

    name: Literal["adafactor"] = "adafactor"
    """The optimizer (this file: models/optimizers/adafactor.py)."""
    beta2_decay: Annotated[float, Field(ge=-1.0, le=0.0)] = -0.8
    """Decay rate exponent of the second moment (torch's default)."""
    eps: Annotated[float, Field(gt=0.0, le=1.0)] = 1e-3
    """Epsilon scaling the update (torch's eps[1])."""

    def state_bytes_per_parameter(self, role: ParamRole, shape: tuple[int, ...] | None = None) -> float:
        """Matrices keep rows + columns floats (per element: 4 x (r + c) / (r x c)); vectors a full one."""
        if shape is not None and len(shape) >= 2:
            rows, cols = shape[-2], shape[-1]
            return 4.0 * (rows + cols) / (rows * cols)
        return 4.0

    def build(self, named_params: list[tuple[str, Any, ParamRole]], train: Any) -> Any:
        import torch

        decay = [p for _, p, _ in named_params if p.dim() >= 2]
        no_decay = [p for _, p, _ in named_params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.Adafactor(groups, lr=train.lr, beta2_decay=self.beta2_decay, eps=(None, self.eps),
                                     foreach=False)
