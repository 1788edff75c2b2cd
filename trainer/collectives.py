"""The few collectives the trainer uses, each a no-op on one process (no process group needed).

All ranks must call each one in the same order; every decision that depends on one rank's
observation (out of memory, SIGTERM, which checkpoint to resume) goes through them so no
rank is left waiting in a gradient all-reduce its peers never enter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


class Collectives:
    def __init__(self, world: int, device: torch.device | str = "cpu", host_group: Any = None):
        """`host_group`: the gloo group host values go through on GPUs (`ParallelDims.host_group`)."""
        self.world = world
        self.device = device
        self.host_group = host_group

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def all_reduce(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks (float64, so token counts stay exact)."""
        if self.world == 1:
            return values
        import torch
        import torch.distributed as dist

        # Host values (token counts, flags) over gloo on CPU tensors: on GPUs an NCCL all-reduce
        # of a device tensor plus the read back would wait for all queued device work each step.
        group = self.host_group
        assert group is not None or not str(self.device).startswith("cuda"), "ParallelDims.build() makes it"
        t = torch.tensor(values, dtype=torch.float64, device="cpu" if group is not None else self.device)
        dist.all_reduce(t, group=group)
        return [float(v) for v in t.tolist()]

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank (picklable objects)."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box: list[Any] = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]  # type: ignore[no-any-return]

    def gather(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out
