"""Attention inside each packed document without an s x s mask per block (models/_attention.py).

The custom op computes what SDPA computes with the dense document mask (bitwise on the CPU: the
same fused kernel and mask values), its backward too, with grouped-query heads and a sliding
window; what it keeps for the backward pass is O(s) (on fake tensors, as the dry run runs it);
the transformers-built architectures are checked against stock transformers in
tests/integration/test_document_attention_models.py.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo  # noqa: F401 - a custom op's first call imports it (0.8 s; every trainer process has it already)
import torch.nn.functional as F

from models._attention import Documents, document_attention


def _positions(*rows: tuple[int, ...]) -> torch.Tensor:
    return torch.stack([torch.cat([torch.arange(n) for n in lengths]) for lengths in rows])


def _repeat(t: torch.Tensor, heads: int) -> torch.Tensor:
    b, kv, s, d = t.shape
    return t[:, :, None].expand(b, kv, heads // kv, s, d).reshape(b, heads, s, d)


def test_documents_start_where_the_position_restarts_and_the_mask_is_block_causal():
    docs = Documents.from_positions(_positions((2, 3), (5,)))
    assert docs.ids.tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]]
    mask = docs.dense_mask()[:, 0]
    assert mask[0].int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0],
                                      [0, 0, 1, 1, 1]]
    assert torch.equal(mask[1], torch.ones(5, 5, dtype=torch.bool).tril())
    window = Documents.from_positions(_positions((5,)), window=2).dense_mask()[0, 0]
    assert window.int().tolist()[4] == [0, 0, 0, 1, 1]  # itself and one before
    cu, longest = docs.varlen()
    assert cu.tolist() == [0, 2, 5, 10] and longest == 5


@pytest.mark.parametrize("kv_heads, window, autocast", [(4, None, False), (2, None, False), (2, 3, False),
                                                        (2, None, True)],
                         ids=["mha", "gqa", "gqa-window", "gqa-bf16-autocast"])
def test_the_op_equals_sdpa_with_the_dense_mask(kv_heads: int, window: int | None, autocast: bool):
    gen = torch.Generator().manual_seed(0)
    b, heads, s, d = 2, 4, 23, 8
    docs = Documents.from_positions(_positions((5, 12, 6), (23,)), window=window)
    q, k, v = (torch.randn(b, h, s, d, generator=gen, requires_grad=True) for h in (heads, kv_heads, kv_heads))
    grad = torch.randn(b, s, heads, d, generator=gen)
    results = []
    for ours in (True, False):
        for t in (q, k, v):
            t.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if ours:
                out = document_attention(q, k, v, docs)
            else:
                out = F.scaled_dot_product_attention(q, _repeat(k, heads), _repeat(v, heads),
                                                     attn_mask=docs.dense_mask()).transpose(1, 2)
        (out.float() * grad).sum().backward()
        results.append((out.detach(), [t.grad.clone() for t in (q, k, v)]))
    (out, grads), (ref, ref_grads) = results
    assert out.shape == (b, s, heads, d) and out.is_contiguous()
    assert torch.equal(out, ref)
    for mine, theirs in zip(grads, ref_grads, strict=True):
        assert torch.allclose(mine, theirs, rtol=0, atol=1e-6 if not autocast else 1e-2)
        if not autocast:
            assert torch.equal(mine, theirs)


def test_what_the_op_keeps_for_the_backward_grows_linearly_with_the_sequence():
    """On fake tensors (the dry run), one call keeps q, k, v, the output, the log-sum-exp and the
    document index: bytes per token independent of the sequence length (a dense mask would add s)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def kept_per_token(s: int) -> float:
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            seen[id(t.untyped_storage())] = t.untyped_storage().nbytes()
            return t

        with FakeTensorMode():
            q = torch.randn(1, 8, s, 64, dtype=torch.bfloat16, requires_grad=True)
            kv = torch.randn(1, 2, s, 64, dtype=torch.bfloat16, requires_grad=True)
            docs = Documents.from_positions(torch.arange(s)[None])
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                document_attention(q * 1, kv * 1, kv * 2, docs)
        return sum(seen.values()) / s

    assert kept_per_token(4096) == kept_per_token(16384) < 8 * 64 * 2 * 4


def test_the_op_is_counted_by_the_flop_counter_as_sdpa_is():
    from torch.utils.flop_counter import FlopCounterMode

    b, heads, s, d = 2, 4, 16, 8
    q = torch.randn(b, heads, s, d, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        document_attention(q, q, q, Documents.from_positions(torch.arange(s).expand(b, s))).sum().backward()
    assert counter.get_total_flops() == 3 * 4 * b * heads * s * s * d  # forward 4bhs^2d, backward twice that
