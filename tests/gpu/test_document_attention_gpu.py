"""On a CUDA device: document attention (models/_attention.py) as the GPU runs it: flash attention
over variable-length documents in bf16/fp16, memory-efficient attention with the mask built inside
the call in fp32. Both against SDPA with the dense document mask, and the memory a forward and
backward hold growing linearly with the sequence. Skipped (saying why) where no CUDA device is
visible; the CPU path is tests/unit/test_document_attention.py."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _inputs(s: int, dtype: object, kv_heads: int = 2) -> tuple[object, ...]:
    import torch

    from models._attention import Documents

    gen = torch.Generator(device="cuda").manual_seed(0)
    lengths = [s // 2, s // 4, s - s // 2 - s // 4]
    pos = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None].repeat(2, 1)
    q = torch.randn(2, 8, s, 64, device="cuda", dtype=dtype, generator=gen).requires_grad_()
    k, v = (torch.randn(2, kv_heads, s, 64, device="cuda", dtype=dtype, generator=gen).requires_grad_()
            for _ in range(2))
    return q, k, v, Documents.from_positions(pos).prepare()


@pytest.mark.parametrize("dtype_name, atol", [("bfloat16", 3e-2), ("float32", 1e-4)])
def test_the_gpu_paths_equal_sdpa_with_the_dense_mask(dtype_name: str, atol: float) -> None:
    import torch
    import torch.nn.functional as F

    from models._attention import document_attention

    dtype = getattr(torch, dtype_name)
    q, k, v, docs = _inputs(300, dtype)
    grad = torch.randn(2, 300, 8, 64, device="cuda", dtype=dtype)
    ours = document_attention(q, k, v, docs)
    (ours * grad).sum().backward()
    mine = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1),
                                         attn_mask=docs.dense_mask()).transpose(1, 2)
    (ref * grad).sum().backward()
    assert torch.allclose(ours.float(), ref.float(), atol=atol, rtol=0)
    for a, b in zip(mine, (q.grad, k.grad, v.grad), strict=True):
        assert torch.allclose(a.float(), b.float(), atol=atol * 4, rtol=0)


def test_what_a_forward_and_backward_hold_grows_linearly_with_the_sequence() -> None:
    import torch

    from models._attention import document_attention

    def peak(s: int) -> int:
        q, k, v, docs = _inputs(s, torch.bfloat16)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        document_attention(q, k, v, docs).sum().backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    small, large = peak(8192), peak(32768)
    assert large < 5 * small  # 4x the tokens; a dense mask would make it 16x
