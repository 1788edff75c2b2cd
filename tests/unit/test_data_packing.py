"""The numerical proof that packed rows have no cross-document attention.

A tiny Llama built from config (never downloaded) scores a row produced by the real
`MixtureBatcher` (several documents back to back, position_ids restarting at 0, no
attention_mask, use_cache=False); every segment's logits must equal the logits of that
segment run alone, on both attention kernels the spec allows. The trap this guards
against (see STACK-NOTES): use_cache=True or an all-ones attention_mask silently turn
the boundary detection off, and the loss still looks fine.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipelines.dataprep.prepare import prepare_data
from tests.infra.data_helpers import build_small_demo, demo_sources, make_spec
from trainer.batches import MixtureBatcher


@pytest.fixture(scope="module")
def packed_row(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, np.ndarray, int]:
    repo: Path = tmp_path_factory.mktemp("repo")
    build_small_demo(repo, max_bytes=30_000)
    spec = make_spec(demo_sources({"docs": 1.0}), tokenizer={"kind": "bpe", "vocab_size": 300})
    prepared = prepare_data(spec.data, repo, progress=False)
    batcher = MixtureBatcher(prepared, {"docs": 1.0}, seq_len=96, micro_batch_size=1, grad_accum_steps=1, seed=3)
    for step in range(50):  # a row with at least three segments
        batch = batcher.batch(step, 0)
        if int((batch["position_ids"][0] == 0).sum()) >= 3:
            return batch["input_ids"], batch["position_ids"], prepared.vocab_size
    raise AssertionError("no row with three documents in 50 steps")


def _tiny_llama(attn: str, vocab: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                         attn_implementation=attn)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_each_document_in_a_packed_row_scores_as_if_alone(packed_row, attn: str) -> None:
    import torch

    input_ids, position_ids, vocab = packed_row
    model = _tiny_llama(attn, vocab)
    ids, pos = torch.from_numpy(input_ids), torch.from_numpy(position_ids)
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
        starts = [int(i) for i in torch.nonzero(pos[0] == 0).flatten()] + [ids.shape[1]]
        assert len(starts) >= 4
        for lo, hi in zip(starts[:-1], starts[1:], strict=True):
            alone = model(input_ids=ids[:, lo:hi], position_ids=pos[:, lo:hi] - pos[0, lo],
                          use_cache=False).logits[0]
            assert torch.allclose(packed[lo:hi], alone, atol=1e-5), (attn, lo, hi,
                                                                     (packed[lo:hi] - alone).abs().max())
        # Control: the same row with the default cache on attends across documents, so the
        # comparison above is able to fail.
        leaky = model(input_ids=ids, position_ids=pos).logits[0]
        lo, hi = starts[1], starts[2]
        alone = model(input_ids=ids[:, lo:hi], position_ids=pos[:, lo:hi], use_cache=False).logits[0]
        assert not torch.allclose(leaky[lo:hi], alone, atol=1e-3)
