"""Adafactor (Shazeer & Stern 2018): torch.optim.Adafactor, factored second moments for matrices.

Plain tensors (one process, DDP) take torch's own step. Sharded parameters (FSDP2 / TP DTensors)
take the same update computed over the *whole* matrix: a shard's row and column statistics are
not the matrix's (torch's step also fails there: its in-place `square_()` of a norm over the
sharded dimension is refused by DTensor). The row and column second moments are reduced over the
mesh and kept whole on every rank (replicated DTensors: rows + columns floats per matrix), each
rank forms the variance estimate of its own shard only (never the whole rows x columns matrix),
and the parameter and update norms are the matrix's. The numbers are torch's up to the order of
the sums (tests/unit/test_optimizer_adafactor.py).
"""

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
        decay = [p for _, p, _ in named_params if p.dim() >= 2]
        no_decay = [p for _, p, _ in named_params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return optimizer_class()(groups, lr=train.lr, beta2_decay=self.beta2_decay, eps=(None, self.eps),
                                 foreach=False)


_CLASS: Any = None


def optimizer_class() -> Any:
    """`Adafactor`, defined on first use (this module's top level stays torch-free)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import torch
    from torch.distributed.tensor import DTensor, Replicate

    class Adafactor(torch.optim.Adafactor):  # type: ignore[misc]
        """torch's Adafactor; sharded (DTensor) parameters take `_sharded_step` (see the module doc)."""

        @torch.no_grad()  # type: ignore[untyped-decorator]
        def step(self, closure: Any = None) -> Any:
            if not any(isinstance(p, DTensor) for group in self.param_groups for p in group["params"]):
                return super().step(closure)
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self._sharded_step(p, group)
            return loss

        def _sharded_step(self, p: Any, group: dict[str, Any]) -> None:
            """`torch.optim._adafactor._single_tensor_adafactor` for one parameter, over the whole
            matrix when `p` is a shard of it."""
            grad = -p.grad if group["maximize"] else p.grad
            eps1, eps2 = group["eps"]
            eps1 = torch.finfo(p.dtype).eps if eps1 is None else eps1
            lr = float(group["lr"])
            state = self.state[p]
            if len(state) == 0:
                state["step"] = torch.tensor(0.0)
                if grad.dim() > 1:
                    state["row_var"], state["col_var"] = _whole(grad, rows=True), _whole(grad, rows=False)
                else:
                    state["variance"] = torch.zeros_like(grad)
            step_t = state["step"]
            step_t += 1
            step = step_t.item()
            one_minus_beta2 = step ** group["beta2_decay"]
            rho = min(lr, 1 / (step ** 0.5))
            alpha = max(eps2, _norm(p) / (p.numel() ** 0.5)) * rho
            if group["weight_decay"] != 0:
                p.mul_(1 - lr * group["weight_decay"])
            if grad.dim() > 1:
                row_var, col_var = _local(state["row_var"]), _local(state["col_var"])
                row_mean = _whole_norm(grad, -1).square().div(grad.size(-1))
                col_mean = _whole_norm(grad, -2).square().div(grad.size(-2))
                row_var.lerp_(row_mean, one_minus_beta2)
                col_var.lerp_(col_mean, one_minus_beta2)
                mean_row = row_var.mean(dim=-2, keepdim=True).clamp(min=eps1)
                local = _local(grad)
                rows, cols = _shard_slices(grad)
                estimate = (row_var[..., rows, :] @ col_var[..., :, cols]).div(mean_row)
                update_local = estimate.clamp(min=eps1 * eps1).rsqrt().mul(local)
                update: Any = DTensor.from_local(update_local, grad.device_mesh, grad.placements,
                                                 shape=grad.shape, stride=grad.stride())
            else:
                state["variance"].lerp_(grad * grad, one_minus_beta2)
                update = state["variance"].clamp(min=eps1 * eps1).rsqrt().mul(grad)
            denom = max(1.0, _norm(update) / ((update.numel() ** 0.5) * group["d"]))
            p.add_(update, alpha=-alpha / denom)

    def _whole(grad: Any, rows: bool) -> Any:
        """A zero row (or column) statistic of `grad`'s whole matrix, replicated over its mesh."""
        shape = (*grad.shape[:-1], 1) if rows else (*grad.shape[:-2], 1, grad.shape[-1])
        local = torch.zeros(shape, dtype=grad.dtype, device=_local(grad).device)
        mesh = grad.device_mesh
        return DTensor.from_local(local, mesh, [Replicate()] * mesh.ndim, run_check=False)

    def _local(t: Any) -> Any:
        return t.to_local() if isinstance(t, DTensor) else t

    def _norm(t: Any) -> float:
        """The 2-norm of the whole tensor (a DTensor's reduced over its mesh)."""
        norm = torch.linalg.vector_norm(t, 2)
        return float((norm.full_tensor() if isinstance(norm, DTensor) else norm).item())

    def _whole_norm(grad: Any, dim: int) -> Any:
        """2-norms along `dim` of the whole matrix, as a plain tensor on every rank."""
        norm = torch.linalg.vector_norm(grad, 2, dim=dim, keepdim=True)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    def _shard_slices(grad: Any) -> tuple[slice, slice]:
        """The rows and columns of the whole matrix this rank's shard of `grad` holds."""
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(grad.shape, grad.device_mesh, grad.placements)
        return (slice(offset[-2], offset[-2] + shape[-2]), slice(offset[-1], offset[-1] + shape[-1]))

    _CLASS = Adafactor
    return _CLASS
