"""Muon (Jordan et al. 2024) on the hidden matrices, AdamW on everything else (the split of
modded-nanogpt: embeddings, head, norms and biases are not orthogonalised).

One `torch.optim.Optimizer` holding both kinds of groups (`use_muon`), so accelerate, the
scheduler and DCP checkpoints see one optimizer with a plain state dict (Muon keeps
`momentum_buffer`, AdamW `exp_avg`, `exp_avg_sq`, `step`). The update is torch's own
(`torch.optim._muon._zeropower_via_newtonschulz` on CUDA, its coefficients and `_adjust_lr`,
the AdamW functional); on a CPU the same Newton-Schulz iteration runs in fp32 instead of bf16
(see `orthogonalise`: bf16 matmuls are several times slower than fp32 on CPUs).

Sharded parameters (FSDP2 / TP DTensors): the Newton-Schulz iteration orthogonalises the
*whole* matrix, not a shard of it (a shard's orthogonalisation is a different update). Each
matrix's full momentum-mixed update is gathered, orthogonalised by its owner rank only (round
robin over the matrices, so the work is split instead of repeated on every rank), broadcast,
and every rank keeps its own slice. bench/bench_optimizers.py measures the cost against DDP.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from models import OptimizerConfig, ParamRole


class Config(OptimizerConfig):
    """Muon for 2-D hidden matrices (by parameter role), AdamW (train.lr) for the rest."""

    name: Literal["muon"] = "muon"
    """The optimizer (this file: models/optimizers/muon.py)."""
    lr: Annotated[float, Field(gt=0.0, le=10.0)] = 0.02
    """Peak learning rate of the Muon groups (the AdamW groups use `train.lr`); the schedule scales both."""
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.95
    """Muon momentum."""
    nesterov: bool = True
    """Nesterov momentum."""
    ns_steps: Annotated[int, Field(ge=1, le=20)] = 5
    """Newton-Schulz iterations."""
    adjust_lr: Literal["original", "match_rms_adamw"] = "original"
    """torch's learning-rate adjustment by matrix shape."""
    beta1: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
    """AdamW beta1 of the non-matrix groups."""
    beta2: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.95
    """AdamW beta2 of the non-matrix groups."""

    def state_bytes_per_parameter(self, role: ParamRole, shape: tuple[int, ...] | None = None) -> float:
        return 4.0 if role == "hidden" else 8.0  # momentum_buffer vs exp_avg + exp_avg_sq

    def build(self, named_params: list[tuple[str, Any, ParamRole]], train: Any) -> Any:
        hidden = [p for _, p, role in named_params if role == "hidden" and p.dim() == 2]
        hidden_ids = {id(p) for p in hidden}
        rest = [(p, p.dim() >= 2) for _, p, _ in named_params if id(p) not in hidden_ids]
        groups: list[dict[str, Any]] = [
            {"params": hidden, "use_muon": True, "lr": self.lr, "weight_decay": train.weight_decay},
            {"params": [p for p, d in rest if d], "use_muon": False, "lr": train.lr, "weight_decay": train.weight_decay},
            {"params": [p for p, d in rest if not d], "use_muon": False, "lr": train.lr, "weight_decay": 0.0},
        ]
        return optimizer_class()([g for g in groups if g["params"]], self)

    def implementation(self, optimizer: Any) -> str:
        return f"muon (ns_steps {self.ns_steps}) + adamw"


_CLASS: Any = None


def optimizer_class() -> Any:
    """`MuonWithAdamW`, defined on first use (this module's top level stays torch-free)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import torch
    from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, _adjust_lr, _zeropower_via_newtonschulz
    from torch.optim.adamw import adamw

    def orthogonalise(update: torch.Tensor, ns_steps: int) -> torch.Tensor:
        """torch's Newton-Schulz iteration. On CUDA it is torch's own function (bf16). On a CPU the
        same iteration in fp32: torch's hard-coded bf16 matmuls are 5x slower than fp32 there
        (measured: 0.125 s vs 0.024 s for a 768 x 256 Gram matrix, one thread), which made a CPU
        Muon step 11x an AdamW step (bench/bench_optimizers.py)."""
        if update.is_cuda:
            return _zeropower_via_newtonschulz(update, (DEFAULT_A, DEFAULT_B, DEFAULT_C), ns_steps, 1e-7)
        a, b, c = DEFAULT_A, DEFAULT_B, DEFAULT_C
        x = update.float()
        tall = x.size(0) > x.size(1)
        if tall:
            x = x.T
        x = x / x.norm().clamp(min=1e-7)
        for _ in range(ns_steps):
            gram = x @ x.T
            x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
        return x.T if tall else x

    class MuonWithAdamW(torch.optim.Optimizer):
        def __init__(self, groups: list[dict[str, Any]], cfg: Config):
            defaults = {"lr": cfg.lr, "weight_decay": 0.0, "momentum": cfg.momentum, "nesterov": cfg.nesterov,
                        "ns_steps": cfg.ns_steps, "adjust_lr_fn": cfg.adjust_lr, "betas": (cfg.beta1, cfg.beta2),
                        "eps": 1e-8, "use_muon": False}
            super().__init__(groups, defaults)

        @torch.no_grad()  # type: ignore[untyped-decorator]
        def step(self, closure: Any = None) -> Any:
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            owner = 0
            for group in self.param_groups:
                if group["use_muon"]:
                    owner = self._muon_group(group, owner)
                else:
                    self._adamw_group(group)
            return loss

        def _muon_group(self, group: dict[str, Any], owner: int) -> int:
            from torch.distributed.tensor import DTensor, distribute_tensor

            lr, mom = float(group["lr"]), group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mom)
                update = p.grad.lerp(buf, mom) if group["nesterov"] else buf
                if isinstance(update, DTensor):
                    full = update.full_tensor()
                    full = _orthogonalise_on_owner(full, owner, group["ns_steps"], update.device_mesh)
                    owner += 1
                    ortho: Any = distribute_tensor(full, update.device_mesh, update.placements, src_data_rank=None)
                else:
                    ortho = orthogonalise(update, group["ns_steps"])
                adjusted = _adjust_lr(lr, group["adjust_lr_fn"], p.shape)
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(ortho.to(p.dtype), alpha=-adjusted)
            return owner

        def _adamw_group(self, group: dict[str, Any]) -> None:
            params, grads, avgs, sqs, steps = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "step" not in state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                params.append(p)
                grads.append(p.grad)
                avgs.append(state["exp_avg"])
                sqs.append(state["exp_avg_sq"])
                steps.append(state["step"])
            if params:
                beta1, beta2 = group["betas"]
                adamw(params, grads, avgs, sqs, [], steps, foreach=False, amsgrad=False, beta1=beta1, beta2=beta2,
                      lr=float(group["lr"]), weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)

    def _orthogonalise_on_owner(full: torch.Tensor, owner: int, ns_steps: int, mesh: Any) -> torch.Tensor:
        """Newton-Schulz on one rank of the mesh (round robin), the result broadcast to the rest."""
        import torch.distributed as dist

        group = mesh.get_group() if mesh.ndim == 1 else None
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        src = ranks[owner % len(ranks)]
        if dist.get_rank() == src:
            out = orthogonalise(full, ns_steps).to(full.dtype).contiguous()
        else:
            out = torch.empty_like(full)
        dist.broadcast(out, src=src, group=group)
        return out

    _CLASS = MuonWithAdamW
    return _CLASS
