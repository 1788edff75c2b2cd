"""`train.compile` without a launch: inductor on a CPU without a C++ compiler is refused in one
line before any step (the compiled layouts themselves: tests/integration/test_trainer_compile.py)."""

from __future__ import annotations

import pytest


def test_inductor_on_cpu_without_a_cxx_compiler_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from basics.errors import TrainingError
    from trainer.parallel import apply_compile

    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(TrainingError, match=r"needs a C\+\+ compiler: 'no-such-c\+\+-compiler' is not on PATH") as err:
        apply_compile(None, torch.nn.Module())
    assert "\n" not in str(err.value)
