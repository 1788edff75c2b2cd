"""Approval tier: how much sign-off a run needs before it may start."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from validation.plan.compute import ComputeEstimate
from validation.spec import ResourceSpec

# Approval tiers (budget in GPU-hours = devices x wall hours; CPU runs cost no GPU-hours).
SMALL_TIER_MAX_GPU_HOURS = 1.0
"""A GPU run estimated at or under this many GPU-hours, or any CPU run, is `small`."""
SMALL_TIER_APPROVALS = 1
"""Approvals a `small` run needs before `/train` starts it."""
LARGE_TIER_APPROVALS = 2
"""Approvals a `large` run (over the small threshold, within `resource.max_gpu_hours`) needs."""

@dataclass(frozen=True)
class Tier:
    """How much sign-off a run needs before it may start."""

    name: Literal["small", "large", "refused"]
    required_approvals: int | None
    """Maintainer approvals needed; None when refused (no number of approvals suffices)."""
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def approval_tier(compute: ComputeEstimate, resource: ResourceSpec, *, device_hours: float | None = None) -> Tier:
    """`refused` over `resource.max_gpu_hours`; `small` for CPU runs or up to
    `SMALL_TIER_MAX_GPU_HOURS`; otherwise `large`. Boundaries are inclusive.

    `device_hours`: the total to judge (every seed and the baseline, `RunCost`); default the one
    run `compute` describes."""
    hours = compute.gpu_hours if device_hours is None else (device_hours if compute.on_gpu else 0.0)
    if hours > resource.max_gpu_hours:
        return Tier(
            name="refused",
            required_approvals=None,
            reason=(
                f"estimated {hours:.1f} GPU-hours exceeds resource.max_gpu_hours ({resource.max_gpu_hours:g}); "
                "shorten the run, shrink the model, or raise the budget with sign-off"
            ),
        )
    if not compute.on_gpu:
        return Tier(name="small", required_approvals=SMALL_TIER_APPROVALS, reason="CPU run (no GPU-hours)")
    if hours <= SMALL_TIER_MAX_GPU_HOURS:
        return Tier(
            name="small",
            required_approvals=SMALL_TIER_APPROVALS,
            reason=f"{hours:.2f} GPU-hours <= {SMALL_TIER_MAX_GPU_HOURS:g}",
        )
    return Tier(
        name="large",
        required_approvals=LARGE_TIER_APPROVALS,
        reason=(
            f"{hours:.1f} GPU-hours > {SMALL_TIER_MAX_GPU_HOURS:g} "
            f"(within the budget of {resource.max_gpu_hours:g})"
        ),
    )
