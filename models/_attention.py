"""Causal attention inside each document of a packed row, without an s x s mask kept per block.

The trainer packs documents back to back in a row and restarts `position_ids` at 0 for each
(trainer/batches.py). A token attends only to earlier tokens of its own document. The dense way
(a (b, 1, s, s) mask handed to SDPA) keeps that mask in the compute dtype in every block for the
backward pass (2 GiB a block at seq 32768 in bf16) and keeps SDPA off its flash kernels on a GPU.
Here the documents are described in O(s) (`Documents`: each token's document index, built once per
forward) and every block runs:

- on a CUDA device in bf16/fp16: `torch.nn.attention.varlen.varlen_attn`, flash attention over
  variable-length sequences (the rows' documents as one packed sequence with cumulative lengths,
  as torchtitan's `VarlenAttention` and transformers' flash-attention path run packed rows):
  cross-document tiles are never computed, grouped-query heads are native, and the backward keeps
  q, k, v, the output and its log-sum-exp;
- elsewhere (the CPU; CUDA in fp32, which flash does not take): the custom op
  `gitops_train::scaled_dot_product_document_attention`. Its forward and backward run torch's
  fused SDPA kernels (CPU flash attention; CUDA memory-efficient attention) with the dense
  document mask: on a GPU built inside each call from the (b, s) document index and freed when
  the call returns; on the CPU built once per forward and shared by every block and backward
  (`Documents.shared_mask`: one tensor a step, which CPU runs afford, at the speed of the dense
  path). Each block keeps q, k, v, the output, the log-sum-exp and the index: O(s), like the flash
  path. The numbers are SDPA's with the dense mask (bitwise on the CPU: the same kernel, the same
  mask values);
- on fake tensors (`pipeline plan --dry-run`): the op's fake kernel, so the memory tracker sees
  what the flash path keeps and no mask.

FlexAttention (torchtitan's other document-mask path) was measured and not taken: torch 2.13 has
no FlexAttention backward on the CPU ("FlexAttention does not support backward on CPU", eager and
compiled), so the CPU suite, smoke and the dry run could not train through it.

A helper, not a plug-in; torch-free at import (torch is imported inside the functions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

OP_NAMESPACE = "gitops_train"
"""The custom ops' namespace: `torch.ops.gitops_train.scaled_dot_product_document_attention` (its
name says what it is, so trainer/measure.py's guard for matmul-like ops without a FLOP formula
would see it; it has one, registered with it)."""
EFFICIENT_ATTENTION_ALIGNMENT = 16
"""CUDA memory-efficient attention wants the bias rows 16-element aligned (SDPA pads them so)."""


@dataclass
class Documents:
    """The packed documents of a batch: `ids[b, t]` is the index of token t's document in row b
    (0, 0, 0, 1, 1, 2, ...), non-decreasing along the row. Built once per forward; every block
    reads it. `window`: each token attends to at most this many tokens of its document, itself
    included (Mistral's sliding window), or None."""

    ids: torch.Tensor
    window: int | None = None
    _varlen: tuple[torch.Tensor, int] | None = field(default=None, repr=False)
    _masks: dict[Any, torch.Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def from_positions(cls, position_ids: torch.Tensor, window: int | None = None) -> Documents:
        """A new document wherever the position restarts at 0 (the trainer's packing)."""
        import torch

        starts = position_ids == 0
        starts[:, 0] = True  # a row always starts a document (also when it continues one)
        return cls(torch.cumsum(starts, dim=1, dtype=torch.int32) - 1, window)

    @classmethod
    def from_starts(cls, starts: torch.Tensor, window: int | None = None) -> Documents:
        """From a (b, s) boolean: True where a document starts (column 0 is taken as a start)."""
        import torch

        starts = starts.clone()
        starts[:, 0] = True
        return cls(torch.cumsum(starts, dim=1, dtype=torch.int32) - 1, window)

    def dense_mask(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The (b, 1, s, s) mask these documents mean: boolean (True = attend), or additive in
        `dtype` (0 / -inf). Only inside one attention call, or for tests: never kept per block."""
        import torch

        s = self.ids.shape[1]
        pos = torch.arange(s, device=self.ids.device)
        allowed = (self.ids[:, :, None] == self.ids[:, None, :]) & (pos[None, :, None] >= pos[None, None, :])
        if self.window is not None:
            allowed &= pos[None, None, :] > pos[None, :, None] - self.window
        allowed = allowed[:, None]
        if dtype is None:
            return allowed
        zero = torch.zeros((), dtype=dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.full((), float("-inf"), dtype=dtype, device=allowed.device))

    def shared_mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """On the CPU, the additive mask built once per forward and read by every block's attention
        call and backward (one (b, 1, s, s) tensor for the whole step: CPU runs are small, and
        building it in every call cost 15 % of a tiny model's step). None elsewhere: a GPU in fp32
        builds it inside each call and frees it, and on fake tensors (the dry run) there is none,
        as on the GPU's flash path."""
        from torch._subclasses.fake_tensor import is_fake

        if self.ids.device.type != "cpu" or is_fake(self.ids):
            return None
        if dtype not in self._masks:
            self._masks[dtype] = self.dense_mask(dtype)
        return self._masks[dtype]

    def varlen(self) -> tuple[torch.Tensor, int]:
        """(cumulative document lengths over the flattened rows, int32; the longest document):
        what flash attention over variable-length sequences takes. One host read per forward,
        made where the documents are built (`prepare`), not in every block."""
        if self._varlen is None:
            import torch

            b, s = self.ids.shape
            starts = torch.ones_like(self.ids, dtype=torch.bool)
            starts[:, 1:] = self.ids[:, 1:] != self.ids[:, :-1]
            first = torch.nonzero(starts.reshape(-1)).reshape(-1).to(torch.int32)
            cu = torch.cat([first, torch.full((1,), b * s, dtype=torch.int32, device=first.device)])
            self._varlen = (cu, int((cu[1:] - cu[:-1]).max()))
        return self._varlen

    def prepare(self) -> Documents:
        """Compute what the device's kernel needs once (the flash path's cumulative lengths)."""
        if self.ids.device.type == "cuda":
            self.varlen()
        return self


def document_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, documents: Documents,
                       scale: float | None = None) -> torch.Tensor:
    """Causal attention of (b, heads, s, d) `query` over (b, kv_heads, s, d) `key`/`value` inside
    each document; returns (b, s, heads, d), contiguous (what the output projection reads).
    Under autocast the three are cast to its dtype, as SDPA is."""
    import torch

    device = query.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    b, heads, s, d = query.shape
    if key.shape != value.shape or key.shape[0] != b or key.shape[2:] != (s, d) or heads % key.shape[1]:
        raise RuntimeError(f"document attention: query {tuple(query.shape)}, key {tuple(key.shape)}, value "
                           f"{tuple(value.shape)}: key and value must have the same shape, the query's batch, "
                           "sequence and head size, and a number of heads that divides the query's")
    scale = d ** -0.5 if scale is None else float(scale)
    if device == "cuda" and query.dtype in (torch.bfloat16, torch.float16):
        from torch.nn.attention.varlen import varlen_attn

        cu, longest = documents.varlen()
        span = (-1, 0) if documents.window is None else (documents.window - 1, 0)
        packed: Any = varlen_attn(query.transpose(1, 2).reshape(b * s, heads, d),
                                  key.transpose(1, 2).reshape(b * s, key.shape[1], d),
                                  value.transpose(1, 2).reshape(b * s, value.shape[1], d),
                                  cu, cu, longest, longest, scale=scale, window_size=span,
                                  enable_gqa=key.shape[1] != heads)
        flat: torch.Tensor = packed
        return flat.view(b, s, heads, d)
    _register()
    window = -1 if documents.window is None else int(documents.window)
    out, _ = torch.ops.gitops_train.scaled_dot_product_document_attention(
        query, key, value, documents.ids, documents.shared_mask(query.dtype), scale, window)
    # The kernel writes the output in the query's layout: (b, s, heads, d) in memory for the
    # models here (q is a view of the projection's output), where this is a view, not a copy.
    return out.transpose(1, 2).contiguous()


# --------------------------------------------------------------------------- the custom op


def _expand_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """k or v repeated to every query head (grouped-query attention), as transformers' repeat_kv."""
    groups = heads // t.shape[1]
    if groups == 1:
        return t
    b, kv, s, d = t.shape
    return t[:, :, None].expand(b, kv, groups, s, d).reshape(b, kv * groups, s, d)


def _fold_heads(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The gradient of `_expand_heads`: summed over each group of query heads."""
    b, heads, s, d = grad.shape
    if heads == kv_heads:
        return grad
    return grad.view(b, kv_heads, heads // kv_heads, s, d).sum(dim=2)


def _mask(ids: torch.Tensor, window: int, dtype: torch.dtype, shared: torch.Tensor | None = None) -> torch.Tensor:
    if shared is not None:
        return shared
    mask = Documents(ids, None if window < 0 else window).dense_mask(dtype)
    if ids.device.type == "cpu":
        return mask
    # CUDA memory-efficient attention: rows padded to 16 elements and sliced back (SDPA's pad_bias).
    s = mask.shape[-1]
    padded = -(-s // EFFICIENT_ATTENTION_ALIGNMENT) * EFFICIENT_ATTENTION_ALIGNMENT
    if padded == s:
        return mask
    out = mask.new_zeros((*mask.shape[:-1], padded))
    out[..., :s] = mask
    return out[..., :s]


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ids: torch.Tensor, shared: torch.Tensor | None,
             scale: float, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    aten = torch.ops.aten
    heads = q.shape[1]
    mask = _mask(ids, window, q.dtype, shared)
    k, v = _expand_heads(k, heads), _expand_heads(v, heads)
    if q.device.type == "cpu":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask, scale=scale)
        return out, lse
    bias = mask.expand(q.shape[0], heads, q.shape[2], k.shape[2])
    out, lse, _, _ = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, False, scale=scale)
    return out, lse


def _backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
              lse: torch.Tensor, ids: torch.Tensor, shared: torch.Tensor | None, scale: float, window: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    import torch

    aten = torch.ops.aten
    heads, kv_heads = q.shape[1], k.shape[1]
    mask = _mask(ids, window, q.dtype, shared)
    ke, ve = _expand_heads(k, heads), _expand_heads(v, heads)
    if q.device.type == "cpu":
        dq, dk, dv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad, q, ke, ve, out, lse, 0.0, False, attn_mask=mask, scale=scale)
    else:
        bias = mask.expand(q.shape[0], heads, q.shape[2], ke.shape[2])
        # No dropout: the philox seed and offset are not read (the forward makes them CPU scalars).
        seed = offset = torch.zeros((), dtype=torch.int64)
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            grad.contiguous(), q, ke, ve, bias, out, lse, seed, offset, 0.0, [True, True, True, False], False,
            scale=scale)
    return dq, _fold_heads(dk, kv_heads), _fold_heads(dv, kv_heads)


@cache
def _register() -> None:
    """Define the custom ops (once per process)."""
    import torch
    from torch.utils.flop_counter import register_flop_formula, sdpa_flop_count

    name = f"{OP_NAMESPACE}::scaled_dot_product_document_attention"

    # Schemas spelled out: this module's annotations are strings (torch is imported lazily).
    @torch.library.custom_op(name, mutates_args=(), schema="(Tensor q, Tensor k, Tensor v, Tensor ids, Tensor? mask, "
                             "float scale, int window) -> (Tensor, Tensor)")  # type: ignore[untyped-decorator]
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor | None,
                  scale: float, window: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _forward(q, k, v, ids, mask, scale, window)

    @attention.register_fake  # type: ignore[untyped-decorator]
    def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor | None,
          scale: float, window: int) -> tuple[torch.Tensor, torch.Tensor]:
        b, heads, s, _ = q.shape
        # The output in the query's layout, as the CPU kernel writes it.
        return torch.empty_like(q), q.new_empty((b, heads, s), dtype=torch.float32)

    @torch.library.custom_op(f"{name}_backward", mutates_args=(),
                             schema="(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor ids, "
                                    "Tensor? mask, float scale, int window) -> (Tensor, Tensor, Tensor)")  # type: ignore[untyped-decorator]
    def attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           out: torch.Tensor, lse: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor | None,
                           scale: float, window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dq, dk, dv = _backward(grad, q, k, v, out, lse, ids, mask, scale, window)
        return dq.contiguous(), dk.contiguous(), dv.contiguous()

    @attention_backward.register_fake  # type: ignore[untyped-decorator]
    def _(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
          lse: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor | None, scale: float,
          window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
        q, k, v, ids, mask, scale, window = inputs
        out, lse = output
        # The shared CPU mask (one tensor for every block of the step), when there is one.
        ctx.save_for_backward(q, k, v, out, lse, ids, *(() if mask is None else (mask,)))
        ctx.scale, ctx.window = scale, window

    def backward(ctx: Any, grad_out: torch.Tensor, _grad_lse: Any) -> tuple[Any, ...]:
        q, k, v, out, lse, ids, *shared = ctx.saved_tensors
        dq, dk, dv = attention_backward(grad_out, q, k, v, out, lse, ids, shared[0] if shared else None,
                                        ctx.scale, ctx.window)
        return dq, dk, dv, None, None, None, None

    attention.register_autograd(backward, setup_context=setup_context)

    # FLOPs as torch counts SDPA's (the MFU convention: the whole s x s, forward 4 b h s^2 d,
    # backward twice that), so trainer/measure.py counts this op like the kernel it replaces.
    @register_flop_formula(torch.ops.gitops_train.scaled_dot_product_document_attention, get_raw=True)  # type: ignore[untyped-decorator]
    def _(q: Any, k: Any, v: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
        return int(sdpa_flop_count(q.shape, q.shape, v.shape[:1] + q.shape[1:2] + v.shape[2:]))

    @register_flop_formula(torch.ops.gitops_train.scaled_dot_product_document_attention_backward, get_raw=True)  # type: ignore[untyped-decorator]
    def _(grad: Any, q: Any, k: Any, v: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
        return 2 * int(sdpa_flop_count(q.shape, q.shape, v.shape[:1] + q.shape[1:2] + v.shape[2:]))


# --------------------------------------------------------------------------- transformers models

TRANSFORMERS_IMPLEMENTATION = "gitops_train_documents"
"""The attention implementation the transformers-built architectures (models/_hf.py) register and
build with for `attn_implementation: sdpa`: transformers' own SDPA, except that a causal mask over
packed documents reaches every block as `Documents` (O(s)) instead of a (b, 1, s, s) tensor. The
name is not written into an exported config.json (transformers does not serialise it): an export
loads with stock transformers' `sdpa`."""


@cache
def transformers_implementation() -> str:
    """Register `TRANSFORMERS_IMPLEMENTATION` with transformers' attention and mask interfaces
    (once per process) and return its name.

    The mask function runs once per forward (`create_causal_mask`). When the mask is causal over
    packed documents (what transformers builds from position_ids that restart, with no 2-D
    attention mask and no cache), it returns `Documents`: a document starts wherever token i may
    not attend to token i - 1, which it asks of transformers' own mask function for the s - 1
    neighbouring pairs (O(s), so the boundaries are exactly the ones transformers detects), with
    the model's sliding window when it has one (Mistral). A plain causal batch returns None
    (SDPA's is_causal, as before); anything else (a padding mask, a cache) the dense `sdpa_mask`."""
    import torch
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, sdpa_mask

    def mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: Any = 0,
             mask_function: Any = causal_mask_function, attention_mask: Any = None,
             allow_is_causal_skip: bool = True, **kwargs: Any) -> Any:
        config, device = kwargs.get("config"), kwargs.get("device", "cpu")
        window = getattr(config, "sliding_window", None)
        plain = (attention_mask is None and isinstance(q_offset, int) and isinstance(kv_offset, int)
                 and q_offset == kv_offset == 0 and q_length == kv_length)
        if not plain:
            return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                             kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                             allow_is_causal_skip=allow_is_causal_skip, **kwargs)
        if mask_function is causal_mask_function and window is None and allow_is_causal_skip:
            return None
        later = torch.arange(1, q_length, device=device)
        rows = torch.arange(batch_size, device=device)[:, None]
        attends_previous = mask_function(rows, torch.zeros((), dtype=torch.long, device=device), later[None, :],
                                         later[None, :] - 1)
        starts = torch.ones((batch_size, q_length), dtype=torch.bool, device=device)
        starts[:, 1:] = ~attends_previous.expand(batch_size, q_length - 1)
        return Documents.from_starts(starts, window).prepare()

    def attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                  dropout: float = 0.0, scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
        if isinstance(attention_mask, Documents) and not dropout:
            return document_attention(query, key, value, attention_mask, scaling), None
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)

    AttentionInterface.register(TRANSFORMERS_IMPLEMENTATION, attention)
    AttentionMaskInterface.register(TRANSFORMERS_IMPLEMENTATION, mask)
    return TRANSFORMERS_IMPLEMENTATION
