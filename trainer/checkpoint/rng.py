"""Every rank's RNG state (python, numpy, torch, CUDA), written into each checkpoint of
either layout as `rng_rank<N>.pt` and restored on resume by the rank of the same number."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.checkpoint.format import rng_file, tmp_dir_for


def rng_state() -> dict[str, Any]:
    import random

    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def write_rank_rng(root: Path, step: int, rank: int) -> None:
    """Every rank writes its own RNG state into the temporary directory (synchronous, tiny)."""
    import torch

    tmp = tmp_dir_for(root, step)
    tmp.mkdir(parents=True, exist_ok=True)
    torch.save(rng_state(), tmp / rng_file(rank))


def read_rank_rng(path: Path, rank: int) -> dict[str, Any] | None:
    """The RNG state `rank` saved; None when the checkpoint was written by fewer ranks."""
    import torch

    rng_path = Path(path) / rng_file(rank)
    if not rng_path.is_file():
        return None
    state: dict[str, Any] = torch.load(rng_path, map_location="cpu", weights_only=False)
    return state
