"""Held-out evaluation: loss and bits per byte per source, and over the whole eval set.

The metric must not move under the experiment (issue 13):

- The eval set is fixed per data version and `seq_len`: the first `eval_batches` x
  EVAL_ROWS_PER_BATCH packed rows of each source's held-out split, whatever the micro batch,
  world size or layout. Those rows are cut into micro-batch chunks only for the forward
  pass, and every rank scores a disjoint share of the chunks; one all-reduce per source sums
  (loss x tokens, tokens, bytes), so the numbers do not depend on how the work was split.
- `eval/loss` and `eval/bpb` pool every scored token of that fixed set (token-weighted
  over the sources), not the run's own mixture weights, so a mixture experiment compares
  the same metric on both sides.
- Bits per byte divides by the UTF-8 bytes of exactly the scored tokens (byte lengths from
  the tokenizer's vocabulary), not an average bytes-per-token of the whole split.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from trainer.collectives import Collectives
from trainer.monitor import track_best
from validation.spec import EVAL_ROWS_PER_BATCH  # one figure: the plan prices the eval set from it too

AGGREGATE = "pooled over every scored token of the fixed eval set (not mixture-weighted)"
"""How `eval/loss` and `eval/bpb` combine the sources (the report states it)."""


def token_byte_lengths(tokenizer: Any) -> np.ndarray:
    """UTF-8 bytes each token id stands for (0 for special tokens).

    A byte-level BPE vocabulary spells each byte as one printable character (GPT-2's
    bytes_to_unicode), so a token's byte count is its character count; any other tokenizer
    decodes the id on its own, which is exact for whole-character tokens.
    """
    from tokenizers import decoders

    vocab = tokenizer.get_vocab(with_added_tokens=True)
    lengths = np.zeros(max(vocab.values()) + 1, dtype=np.int64)
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    byte_level = isinstance(tokenizer.decoder, decoders.ByteLevel)
    for token, index in vocab.items():
        if token in special:
            continue
        lengths[index] = len(token) if byte_level else len(tokenizer.decode([index]).encode("utf-8"))
    return lengths

if TYPE_CHECKING:
    import torch

    from validation.data.prepared import PreparedData
    from validation.spec import ExperimentSpec


class Evaluator:
    def __init__(self, spec: ExperimentSpec, prepared: PreparedData, comm: Collectives, rank: int,
                 autocast: Callable[[], Any], to_device: Callable[[dict[str, Any]], dict[str, torch.Tensor]],
                 split: bool = True):
        self.spec = spec
        self.prepared = prepared
        self.comm = comm
        self.rank = rank
        self.autocast = autocast
        self.to_device = to_device
        # False for sharded models: their forward is a collective, so every rank runs every batch
        # (the all-reduced ratio is the same; each rank's share is counted world times).
        self.split = split
        self.token_bytes: np.ndarray | None = None
        """Bytes per token id (`token_byte_lengths`), built on the first evaluation."""

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        import torch

        from trainer.batches import eval_batches

        spec, world = self.spec, self.comm.world
        if self.token_bytes is None:
            self.token_bytes = token_byte_lengths(self.prepared.tokenizer)
        model.eval()
        out: dict[str, float] = {}
        total_nats = total_tokens = total_bytes = 0.0
        chunk = spec.train.micro_batch_size
        with torch.no_grad(), self.autocast():
            for source in self.prepared.sources:
                nats = count = n_bytes = 0.0
                batches = eval_batches(self.prepared, source, spec.data.seq_len, EVAL_ROWS_PER_BATCH,
                                       spec.train.eval_batches)
                pieces = ({k: v[i:i + chunk] for k, v in batch.items()}
                          for batch in batches for i in range(0, len(batch["input_ids"]), chunk))
                for i, piece in enumerate(pieces):
                    if self.split and i % world != self.rank:
                        continue
                    targets = piece["labels"][:, 1:]
                    scored = targets != -100
                    n = float(scored.sum())
                    if n == 0:
                        continue
                    loss = model(**self.to_device(piece), use_cache=False).loss.float()
                    nats += float(loss) * n
                    count += n
                    n_bytes += float(self.token_bytes[targets[scored]].sum())
                nats, count, n_bytes = self.comm.all_reduce([nats, count, n_bytes])
                if count == 0:
                    continue
                out[f"eval/{source}/loss"] = nats / count
                out[f"eval/{source}/bpb"] = nats / math.log(2) / n_bytes if n_bytes else math.nan
                total_nats, total_tokens, total_bytes = total_nats + nats, total_tokens + count, total_bytes + n_bytes
        if total_tokens:
            out["eval/loss"] = total_nats / total_tokens
            out["eval/bpb"] = total_nats / math.log(2) / total_bytes if total_bytes else math.nan
        model.train()
        return out


def update_best(state: Any, metrics: dict[str, float], patience: int) -> bool:
    """Record the eval loss and the best so far in `state` (a TrainState); True when early
    stopping says stop (`patience` evaluations without improvement; 0 = never)."""
    value = metrics.get("eval/loss")
    if value is None or not math.isfinite(value):
        return False
    state.eval_metric = value
    best, state.evals_without_improvement = track_best(state.best_metric, state.evals_without_improvement, value)
    if best != state.best_metric:
        state.best_metric, state.best_step = best, state.step
    return bool(patience) and state.evals_without_improvement >= patience
