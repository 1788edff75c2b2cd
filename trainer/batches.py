"""Packed, mixture-weighted training rows and deterministic evaluation rows.

Built on the prepared data below the trainer (`validation.data`: `PreparedData`, `MixtureSchedule`).

    batcher = MixtureBatcher(prepared, spec.data.weights(), seq_len, micro, accum, seed, rank, world)
    batch = batcher.batch(step, micro_step)                  # np.int64 input_ids/labels/position_ids
    for batch in eval_batches(prepared, "docs", seq_len, batch_size, max_batches): ...

Row layout (what the model sees). A row holds `seq_len` tokens of ONE source: whole
documents back to back, the last one cut at the row end. `position_ids` restart at 0
at the row start and at every document start; `labels` equal `input_ids` except -100
wherever a segment starts (the first token of a document is not predicted from the
previous document). There is no padding, so every slot is a real token. Fed to a
transformers model as `model(input_ids, position_ids, labels, use_cache=False)` with
NO attention_mask, the attention kernels treat each position-0 as a boundary (see
tests/unit/test_data_packing.py for the numerical proof on sdpa and eager).

Determinism. A step's global batch has `G = world * accum * micro` rows. Which source
each row comes from is decided by systematic sampling of the mixture weights with a
per-step offset (so each source gets floor or ceil of `G * weight` rows, unbiased over
steps), shuffled with a generator seeded by (seed, step). Within a source, rows take
consecutive `seq_len` windows of an endless stream made of epochs; each epoch is a
permutation of the source's training documents seeded by (seed, source, epoch). The
k-th row of a source in the whole run therefore depends only on k, and k is a sum over
earlier steps that is computed in closed form (vectorised, cached per 1024 steps).
Everything is a function of (seed, step, global_row): a resumed run sees exactly the
batches it would have seen, and rank r at micro-step m gets global rows
`(m * world + r) * micro ... + micro - 1`, so the union over ranks equals the
single-rank stream for the same global batch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import numpy as np

from validation.data.mixture import MixtureSchedule
from validation.data.prepared import PreparedData

IGNORE_INDEX = -100


def _segment_arrays(pieces: list[np.ndarray], seq_len: int) -> tuple[np.ndarray, ...]:
    """One row from its pieces: every piece (a document, or the tail of one cut by the previous
    row) starts a segment at position 0, whose first token gets label -100."""
    input_ids = np.empty(seq_len, dtype=np.int64)
    position_ids = np.empty(seq_len, dtype=np.int64)
    at = 0
    for piece in pieces:
        n = piece.size
        input_ids[at : at + n] = piece
        position_ids[at : at + n] = np.arange(n)
        at += n
    assert at == seq_len, (at, seq_len)
    labels = input_ids.copy()
    labels[position_ids == 0] = IGNORE_INDEX
    return input_ids, labels, position_ids


class MixtureBatcher(MixtureSchedule):
    """Training micro-batches for one rank, drawn from the sources by mixture weight
    (`validation.data.mixture.MixtureSchedule` decides which source each row comes from)."""

    def __init__(
        self,
        prepared: PreparedData,
        weights: dict[str, float],
        seq_len: int,
        micro_batch_size: int,
        grad_accum_steps: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ):
        assert seq_len >= 1 and micro_batch_size >= 1 and grad_accum_steps >= 1
        assert 0 <= rank < world_size, (rank, world_size)
        super().__init__(prepared, weights, world_size * grad_accum_steps * micro_batch_size, seed)
        self.seq_len = seq_len
        self.micro_batch_size = micro_batch_size
        self.grad_accum_steps = grad_accum_steps
        self.rank = rank
        self.world_size = world_size
        self._epochs: OrderedDict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = OrderedDict()

    # ------------------------------------------------------------------ row content

    def _epoch(self, s: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        key = (s, epoch)
        if key not in self._epochs:
            offsets = self.prepared.offsets(self.sources[s], "train")
            rng = np.random.default_rng([self.seed, self._source_ids[s], epoch, 0x65706F])
            order = rng.permutation(offsets.size - 1)
            ends = np.cumsum((offsets[1:] - offsets[:-1])[order])
            self._epochs[key] = (order, ends)
            while len(self._epochs) > 2 * len(self.sources) + 2:
                self._epochs.popitem(last=False)
        return self._epochs[key]

    def _row(self, s: int, nth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        name = self.sources[s]
        tokens = self.prepared.tokens(name, "train")
        offsets = self.prepared.offsets(name, "train")
        per_epoch = int(offsets[-1])
        position = nth * self.seq_len
        epoch, offset = divmod(position, per_epoch)
        pieces: list[np.ndarray] = []
        need = self.seq_len
        while need:
            order, ends = self._epoch(s, epoch)
            d = int(np.searchsorted(ends, offset, side="right"))
            while need and d < order.size:
                doc = int(order[d])
                doc_len = int(offsets[doc + 1] - offsets[doc])
                within = offset - int(ends[d] - doc_len)
                take = min(need, doc_len - within)
                pieces.append(np.asarray(tokens[offsets[doc] + within : offsets[doc] + within + take]))
                need -= take
                offset += take
                d += 1
            epoch, offset = epoch + 1, 0
        return _segment_arrays(pieces, self.seq_len)

    def global_rows_of(self, micro_step: int) -> range:
        first = (micro_step * self.world_size + self.rank) * self.micro_batch_size
        return range(first, first + self.micro_batch_size)

    def batch(self, step: int, micro_step: int) -> dict:
        """Rank `rank`'s micro-batch `micro_step` of optimizer step `step`."""
        assert 0 <= micro_step < self.grad_accum_steps, micro_step
        source_of_row, nth = self._step_plan(step)
        rows = [self._row(int(source_of_row[g]), int(nth[g])) for g in self.global_rows_of(micro_step)]
        return {
            "input_ids": np.stack([r[0] for r in rows]),
            "labels": np.stack([r[1] for r in rows]),
            "position_ids": np.stack([r[2] for r in rows]),
            "sources": [self.sources[int(source_of_row[g])] for g in self.global_rows_of(micro_step)],
        }


def packing_efficiency(batch: dict, pad_token_id: int | None = None) -> dict[str, float]:
    """Real tokens / all slots (padding would lower it) and predicted tokens / all slots."""
    input_ids = np.asarray(batch["input_ids"])
    slots = input_ids.size
    real = slots if pad_token_id is None else int((input_ids != pad_token_id).sum())
    if "padding" in batch:
        real = slots - int(np.asarray(batch["padding"]).sum())
    supervised = int((np.asarray(batch["labels"]) != IGNORE_INDEX).sum())
    return {"efficiency": real / slots, "supervised_fraction": supervised / slots}


def eval_batches(
    prepared: PreparedData,
    source: str,
    seq_len: int,
    batch_size: int,
    max_batches: int | None = None,
) -> Iterator[dict]:
    """Held-out rows of one source: its documents in stored order, packed like training rows.

    Deterministic and independent of seed, rank and step, so every evaluation (and every
    experiment with the same data version and `seq_len`) scores exactly the same tokens.
    Only the very last row may be short: it is padded with token 0, label -100 and marked
    in `padding` (1 = pad slot), so it adds nothing to the loss.
    """
    tokens = prepared.tokens(source, "eval")
    offsets = prepared.offsets(source, "eval")
    total = int(offsets[-1])
    if total == 0:
        return
    doc_start = np.zeros(total, dtype=bool)
    doc_start[offsets[:-1][offsets[:-1] < total]] = True
    n_rows = -(-total // seq_len)
    if max_batches is not None:
        n_rows = min(n_rows, max_batches * batch_size)
    for first in range(0, n_rows, batch_size):
        rows = []
        for r in range(first, min(first + batch_size, n_rows)):
            lo, hi = r * seq_len, min((r + 1) * seq_len, total)
            ids = np.zeros(seq_len, dtype=np.int64)
            ids[: hi - lo] = tokens[lo:hi]
            starts = doc_start[lo:hi].copy()
            starts[0] = True
            seg = np.cumsum(starts) - 1
            seg_first = np.flatnonzero(starts)
            pos = np.zeros(seq_len, dtype=np.int64)
            pos[: hi - lo] = np.arange(hi - lo) - seg_first[seg]
            pad = np.zeros(seq_len, dtype=np.int64)
            pad[hi - lo :] = 1
            if hi - lo < seq_len:
                pos[hi - lo :] = np.arange(seq_len - (hi - lo))
            labels = ids.copy()
            labels[pos == 0] = IGNORE_INDEX
            labels[pad == 1] = IGNORE_INDEX
            rows.append((ids, labels, pos, pad))
        yield {
            "input_ids": np.stack([r[0] for r in rows]),
            "labels": np.stack([r[1] for r in rows]),
            "position_ids": np.stack([r[2] for r in rows]),
            "padding": np.stack([r[3] for r in rows]),
            "sources": [source] * len(rows),
        }
