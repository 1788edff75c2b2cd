"""What the trainer's forward returns under bf16 on one process: accelerate's autocast stays
(the logits are bf16), its fp32 copy of every output is gone (the trainer never reads the
logits; the copy was ~2 % of a CPU bf16 step, bench/ab_trainer_step.py), the loss is still
fp32; and deterministic mode does not NaN-fill fresh tensors."""

from __future__ import annotations

from pathlib import Path

from tests.infra.trainer_runs import data_dir, spec_dict  # noqa: F401 - fixture


def test_bf16_forward_keeps_autocast_without_the_fp32_logits_copy(tmp_path: Path, data_dir: Path) -> None:  # noqa: F811
    import torch
    from accelerate.state import AcceleratorState, GradientState

    from trainer.loop import Trainer
    from trainer.step import to_device
    from validation.spec import ExperimentSpec

    spec = ExperimentSpec.model_validate(spec_dict(precision="bf16", max_steps=2))
    # accelerate keeps one process-wide state: an earlier in-process fp32 trainer pinned "no"
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    try:
        trainer = Trainer(spec, tmp_path / "run", data_dir, tracking_uri="none")
        batch = to_device(trainer.batcher.batch(0, 0), trainer.device)
        out = trainer.model(**batch, use_cache=False)
    finally:  # accelerate's process-wide state would pin bf16 for the next in-process trainer
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    assert out.logits.dtype == torch.bfloat16  # autocast ran, and nothing copied the logits to fp32
    assert out.loss.dtype == torch.float32
    assert torch.isfinite(out.loss)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory is False  # type: ignore[attr-defined]
