"""Activation checkpointing as `train.activation_checkpointing` asks: `none`, `selective`, `full`.

- `full`: every decoder block recomputes its activations in the backward pass, through the
  architecture's own `enable_activation_checkpointing(model)` (models/). Between forward and
  backward a block keeps only its input.
- `selective`: every `SELECTIVE_EVERY`-th block (the 2nd, 4th, ...) is checkpointed and the
  others keep their activations: torchtitan's layer-level selective checkpointing
  (`selective_ac_option: "2"`). The block's `forward` is wrapped in a non-reentrant
  `torch.utils.checkpoint.checkpoint`, inside the FSDP/TP hooks `__call__` runs, the same
  nesting as torchtitan's `checkpoint_wrapper` under `fully_shard`.

Either way the numbers are those of `none` (the recomputation replays the same kernels with the
RNG state restored); the memory plan counts the same choice (`validation.plan.memory`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from validation.plan.memory import SELECTIVE_EVERY, checkpointed_blocks

if TYPE_CHECKING:
    import torch

__all__ = ["SELECTIVE_EVERY", "apply_activation_checkpointing", "checkpoint_forward"]


def apply_activation_checkpointing(arch: Any, model: torch.nn.Module, mode: str) -> list[int]:
    """Checkpoint the blocks `mode` names; returns their indices (empty for `none`)."""
    blocks = arch.blocks(model)
    chosen = checkpointed_blocks(len(blocks), mode)
    if mode == "full":
        arch.enable_activation_checkpointing(model)
    else:
        for index in chosen:
            checkpoint_forward(blocks[index])
    return chosen


def checkpoint_forward(block: torch.nn.Module) -> None:
    """Make `block.forward` recompute in the backward pass (training with grad only)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    inner = block.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not (block.training and torch.is_grad_enabled()):
            return inner(*args, **kwargs)
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    forward.recomputes = True  # type: ignore[attr-defined]  # what a test can see of the wrapping
    block.forward = forward  # type: ignore[method-assign]
