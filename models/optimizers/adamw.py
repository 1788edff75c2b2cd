"""AdamW (Loshchilov & Hutter 2019): torch's fused kernel where it has one. The default."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from models import OptimizerConfig, ParamRole
from models.optimizers._groups import decay_groups


class Config(OptimizerConfig):
    """AdamW with weight decay on matrices only (norms and biases excluded)."""

    name: Literal["adamw"] = "adamw"
    """The optimizer (this file: models/optimizers/adamw.py)."""
    beta1: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
    """First-moment decay."""
    beta2: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.95
    """Second-moment decay."""
    eps: Annotated[float, Field(gt=0.0, le=1.0)] = 1e-8
    """Denominator epsilon."""

    def state_bytes_per_parameter(self, role: ParamRole, shape: tuple[int, ...] | None = None) -> float:
        return 8.0  # exp_avg + exp_avg_sq, fp32

    def build(self, named_params: list[tuple[str, Any, ParamRole]], train: Any) -> Any:
        """The fused kernel wherever torch has one for the parameters' device and dtype: one pass
        over each parameter instead of a chain of foreach ops (bench/RESULTS.md, "AdamW `step()`");
        deterministic, and it can skip a step on the device (`found_inf`)."""
        import torch

        groups = decay_groups(named_params, train.weight_decay)
        kwargs: dict[str, Any] = {"lr": train.lr, "betas": (self.beta1, self.beta2), "eps": self.eps}
        try:
            return torch.optim.AdamW(groups, **kwargs, fused=True)
        except RuntimeError:  # a device or dtype without a fused kernel: torch's own default choice
            return torch.optim.AdamW(groups, **kwargs)

    def implementation(self, optimizer: Any) -> str:
        defaults = getattr(optimizer, "optimizer", optimizer).defaults
        kind = "fused" if defaults.get("fused") else "foreach" if defaults.get("foreach") else "for-loop"
        return f"adamw ({kind})"
