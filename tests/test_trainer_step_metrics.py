"""Loss and grad norm stay on the device between log intervals (issue 12, part 5)."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.profiler import ProfilerActivity, profile  # noqa: E402

from trainer.step_metrics import DeviceScalars, skip_if_nonfinite  # noqa: E402

pytestmark = pytest.mark.unit


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


def _run_tiny(tmp: Any, log_interval: int) -> tuple[dict[int, float], dict[int, float]]:
    """tests/test_trainer_golden.py's tiny run with another log interval: (per-step losses from
    the rank-0 log, train/loss from metrics.jsonl)."""
    import json
    import os
    import re

    import test_trainer_golden as golden

    from pipelines.dataprep.prepare import prepare_data
    from trainer.entry import main
    from validation.spec import DataSpec

    corpus = golden._write_corpus(tmp / "corpus")
    spec = golden.tiny_spec(corpus)
    spec["train"]["log_interval"] = log_interval
    os.environ["PIPELINE_DATA_ROOTS"] = str(tmp / "corpus")
    prepared = prepare_data(DataSpec.model_validate(spec["data"]), golden.REPO, tmp / "cache", progress=False)
    run_dir = tmp / "run"
    run_dir.mkdir()
    (run_dir / "spec.resolved.json").write_text(json.dumps(spec))
    code = main(["--spec", str(run_dir / "spec.resolved.json"), "--run-dir", str(run_dir),
                 "--data-dir", str(prepared.path), "--tracking-uri", "none"])
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert code == 0, log[-3000:]
    per_step = {int(m[1]): float(m[2]) for m in re.finditer(r"step=(\d+) loss=([-+.\deEna]+) ", log)}
    return per_step, golden.train_losses(run_dir)


@pytest.mark.integration
def test_deferred_reads_give_every_step_the_same_loss_as_per_step_reads(tmp_path: Any, monkeypatch: Any) -> None:
    # The GPU path (loss and grad norm read once per log interval, a non-finite step skipped by the
    # fused AdamW on the device) forced on the CPU, log interval 4: every step's loss still reaches
    # the log and the detector, bitwise equal to the run that reads every step.
    monkeypatch.setenv("PIPELINE_DATA_ROOTS", "")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        eager, eager_metrics = _run_tiny(tmp_path / "eager", 4)
        monkeypatch.setenv("TRAINER_DEFER_STEP_METRICS", "1")
        deferred, deferred_metrics = _run_tiny(tmp_path / "deferred", 4)
    finally:
        torch.set_num_threads(threads)
    assert len(eager) >= 8 and sorted(eager) == list(range(1, len(eager) + 1))
    assert deferred == eager
    assert deferred_metrics == eager_metrics and sorted(eager_metrics) == [s for s in eager if s % 4 == 0
                                                                           or s == max(eager)]
