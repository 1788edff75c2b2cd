"""Loss and grad norm stay on the device between log intervals (issue 12, part 5)."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.profiler import ProfilerActivity, profile  # noqa: E402

from trainer.step_metrics import DeviceScalars, skip_if_nonfinite  # noqa: E402


def host_reads(fn: Any) -> int:
    """`aten::_local_scalar_dense` calls inside `fn`: every .item()/float(t) (a device sync on a GPU)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == "aten::_local_scalar_dense")


def tiny() -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    return model, opt, torch.randn(4, 8)


def forward_backward_clip(model: Any, x: Any, scale: float = 1.0) -> tuple[Any, Any]:
    loss = model(x).pow(2).mean() * scale
    loss.backward()
    return loss, torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)


def test_a_window_of_steps_is_read_with_one_transfer_and_equals_the_per_step_reads():
    model, opt, x = tiny()
    window = DeviceScalars()
    eager: list[tuple[float, float]] = []

    def steps() -> None:
        for step in range(1, 6):
            loss, norm = forward_backward_clip(model, x)
            skip_if_nonfinite(opt, loss, norm)
            window.add(step, loss, norm)
            eager.append((loss.detach(), norm.detach()))  # kept as tensors: read after profiling
            opt.zero_grad(set_to_none=True)  # (no optimizer step here: torch's CPU AdamW reads its step count)

    assert host_reads(steps) == 0
    assert len(window) == 5
    got = window.read()
    assert len(window) == 0 and window.read() == []
    assert [s for s, _, _, _ in got] == [1, 2, 3, 4, 5]
    assert [(loss, norm) for _, loss, norm, _ in got] == [(float(a), float(b)) for a, b in eager]  # bitwise


def test_ranks_losses_are_summed_before_the_single_read():
    window = DeviceScalars(all_reduce_sum=lambda t: t.mul_(2))  # two ranks with equal shares
    window.add(7, torch.tensor(0.25), torch.tensor(3.0), host=123.0)
    assert window.read() == [(7, 0.5, 3.0, 123.0)]


def test_fused_adamw_skips_a_nonfinite_step_on_the_device_and_takes_a_finite_one():
    model, opt, x = tiny()
    ref_model, ref_opt, _ = tiny()
    before = [p.detach().clone() for p in model.parameters()]

    loss, norm = forward_backward_clip(model, x, scale=float("nan"))
    assert skip_if_nonfinite(opt, loss, norm)
    opt.step()
    opt.zero_grad(set_to_none=True)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(float(s["step"]) == 0 for s in opt.state.values())  # the skipped step is not counted

    # The next finite step is exactly a plain fused step of an untouched twin.
    loss, norm = forward_backward_clip(model, x)
    assert skip_if_nonfinite(opt, loss, norm)
    opt.step()
    ref_loss, _ = forward_backward_clip(ref_model, x)
    ref_opt.step()
    assert math.isfinite(float(loss.detach())) and float(loss.detach()) == float(ref_loss.detach())
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref_model.parameters(), strict=True))


def test_without_a_fused_kernel_the_caller_is_told_to_check_on_the_host():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    assert not skip_if_nonfinite(opt, torch.tensor(float("inf")), torch.tensor(1.0))
    assert not hasattr(opt, "found_inf")


def test_build_optimizer_uses_the_fused_kernel_on_cpu():
    from types import SimpleNamespace

    from trainer.optim import build_optimizer, implementation
    from validation.spec import OPTIMIZERS, model_spec

    train = SimpleNamespace(lr=1e-3, weight_decay=0.1, optimizer=OPTIMIZERS["adamw"]())
    arch = model_spec({"model_type": "llama", "hidden_size": 64, "num_layers": 1, "num_heads": 4, "vocab_size": 256})
    opt = build_optimizer(torch.nn.Linear(4, 4), train, arch)
    assert implementation(opt, train) == "adamw (fused)"
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
