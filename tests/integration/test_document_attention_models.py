"""The transformers-built architectures with document attention (models/_attention.py): they
find the same document boundaries transformers does (from its own mask function) and give the
stock `sdpa` path's losses and gradients bitwise, with grouped-query heads and a sliding window.
The op itself: tests/unit/test_document_attention.py."""

from __future__ import annotations

import copy

import torch

import models
from models._attention import TRANSFORMERS_IMPLEMENTATION


def test_transformers_models_see_the_documents_transformers_detects_and_train_bitwise_alike():
    from trainer.contract_checks import initialised, packed_row, tiny

    # GQA (llama) and a sliding window (mistral); gpt2 and llama_qknorm take the same path, and the
    # contract's packed-equals-alone check runs on every architecture.
    for model_type, extra in (("llama", {}), ("mistral", {"sliding_window": 8})):
        arch = tiny(models.architectures()[model_type], **extra)
        model = initialised(arch).train()
        assert model.config._attn_implementation == TRANSFORMERS_IMPLEMENTATION
        stock = copy.deepcopy(model)
        stock.config._attn_implementation = "sdpa"
        ids, pos = packed_row(arch.vocab_size)
        ids, pos = ids.repeat(2, 1), pos.repeat(2, 1)
        pos[1] = torch.arange(pos.shape[1])  # a row of one document next to a packed one
        outs = []
        for m in (model, stock):
            out = m(input_ids=ids, position_ids=pos, labels=ids, use_cache=False)
            out.loss.backward()
            outs.append((out.loss.item(), [p.grad.clone() for p in m.parameters()]))
        (loss, grads), (stock_loss, stock_grads) = outs
        assert loss == stock_loss, model_type
        assert all(torch.equal(a, b) for a, b in zip(grads, stock_grads, strict=True)), model_type
