"""The trainer executes `train.activation_checkpointing` (trainer/activation_checkpointing.py):
the same gradients in every mode, and less saved for the backward pass. An integration test only
because the first `torch.utils.checkpoint` call imports torch._dynamo (~6 s on the 2-core runner)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny():
    torch = pytest.importorskip("torch")
    from models import architectures

    arch = architectures()["nanogpt"](hidden_size=32, num_layers=4, num_heads=4, vocab_size=256,
                                      max_position_embeddings=64, intermediate_size=64)
    torch.manual_seed(0)
    state = arch.build().state_dict()
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    return torch, arch, state, ids


def _run(tiny, mode: str):
    """Gradients and the bytes saved for backward outside checkpointed blocks."""
    torch, arch, state, ids = tiny
    from trainer.activation_checkpointing import apply_activation_checkpointing

    model = arch.build()
    model.load_state_dict(state)
    model.train()
    chosen = apply_activation_checkpointing(arch, model, mode) if mode != "none" else []
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return chosen, saved[0], loss.item(), grads


def test_each_mode_gives_the_same_gradients_and_saves_less(tiny):
    torch = tiny[0]
    runs = {mode: _run(tiny, mode) for mode in ("none", "selective", "full")}
    assert runs["selective"][0] == [1, 3] and runs["full"][0] == [0, 1, 2, 3]
    assert runs["none"][1] > runs["selective"][1] > runs["full"][1]
    for mode in ("selective", "full"):
        assert runs[mode][2] == runs["none"][2]
        assert all(torch.equal(runs[mode][3][n], g) for n, g in runs["none"][3].items()), mode
