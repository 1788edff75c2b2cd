"""Which source each training row comes from: systematic sampling of the mixture weights.

A step's global batch has `G = world * accum * micro` rows. Which source each row comes
from is decided by systematic sampling of the mixture weights with a per-step offset (so
each source gets floor or ceil of `G * weight` rows, unbiased over steps), shuffled with a
generator seeded by (seed, step). The k-th row of a source in the whole run depends only
on k, and k is a sum over earlier steps computed in closed form (vectorised, cached per
1024 steps).

Part of the data layer (numpy only): the PR's data checks read the realised mixture from
here, and the trainer's batcher (`trainer.batches.MixtureBatcher`) builds its rows on it.
"""

from __future__ import annotations

import numpy as np

from basics.errors import DataError
from validation.data.prepared import PreparedData

_BLOCK = 1024
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _unit_interval(seed: int, steps: np.ndarray) -> np.ndarray:
    """A fixed pseudo-random number in [0, 1) per (seed, step): splitmix64, vectorised."""
    with np.errstate(over="ignore"):
        z = steps.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(seed * 0x2545F4914F6CDD1D & 0xFFFFFFFFFFFFFFFF)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


class MixtureSchedule:
    """Which source, and which row of it, every global row of every step takes."""

    def __init__(self, prepared: PreparedData, weights: dict[str, float], global_rows: int, seed: int):
        assert global_rows >= 1
        unknown = sorted(set(weights) - set(prepared.sources))
        if unknown:
            raise DataError(f"mixture names sources not in prepared data {prepared.version}: {', '.join(unknown)}")
        # Prepared order (= spec order), not dict order, so the stream never depends on YAML key order.
        self.sources = [s for s in prepared.sources if weights.get(s, 0.0) > 0.0]
        if not self.sources:
            raise DataError("mixture has no source with a positive weight")
        for name in self.sources:
            if prepared.documents(name, "train") == 0:
                raise DataError(f"source '{name}' has weight > 0 but no training documents")
        total = sum(weights[s] for s in self.sources)
        self.weights = {s: weights[s] / total for s in self.sources}
        self.prepared = prepared
        self.seed = seed
        self.global_rows = global_rows
        # Epoch orders are seeded by the source's place in the prepared data, so a source's
        # document order does not change when another source's weight goes to zero.
        self._source_ids = [prepared.sources.index(s) for s in self.sources]
        cdf = np.cumsum([self.weights[s] for s in self.sources])
        cdf[-1] = 1.0
        self._edges = np.concatenate([[0.0], cdf]) * self.global_rows
        self._block_prefix: list[np.ndarray] = [np.zeros(len(self.sources), dtype=np.int64)]
        self._step_cache: tuple[int, np.ndarray, np.ndarray] | None = None

    # ------------------------------------------------------------------ which source per row

    def rows_per_source(self, steps: np.ndarray) -> np.ndarray:
        """Rows of each source in each of `steps`: shape [len(steps), n_sources], rows sum to G."""
        u = _unit_interval(self.seed, np.asarray(steps, dtype=np.int64))[:, None]
        bounds = np.ceil(self._edges[None, :] - u).clip(0, self.global_rows).astype(np.int64)
        return np.diff(bounds, axis=1)

    def _rows_before(self, step: int) -> np.ndarray:
        """Rows each source contributed in steps [0, step)."""
        block = step // _BLOCK
        while len(self._block_prefix) <= block:
            b = len(self._block_prefix) - 1
            counts = self.rows_per_source(np.arange(b * _BLOCK, (b + 1) * _BLOCK))
            self._block_prefix.append(self._block_prefix[-1] + counts.sum(axis=0))
        rest = np.arange(block * _BLOCK, step)
        return self._block_prefix[block] + (self.rows_per_source(rest).sum(axis=0) if rest.size else 0)

    def _step_plan(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(source index, row number within that source over the whole run) per global row."""
        if self._step_cache and self._step_cache[0] == step:
            return self._step_cache[1], self._step_cache[2]
        counts = self.rows_per_source(np.array([step]))[0]
        ordered = np.repeat(np.arange(len(self.sources)), counts)
        rng = np.random.default_rng([self.seed, step, 0x6D6978])
        source_of_row = ordered[rng.permutation(self.global_rows)]
        nth = np.empty(self.global_rows, dtype=np.int64)
        before = self._rows_before(step)
        for s in range(len(self.sources)):
            rows = np.flatnonzero(source_of_row == s)
            nth[rows] = before[s] + np.arange(rows.size)
        self._step_cache = (step, source_of_row, nth)
        return source_of_row, nth

    def global_row_sources(self, step: int) -> list[str]:
        return [self.sources[i] for i in self._step_plan(step)[0]]

    def realised_mixture(self, steps: int, start: int = 0) -> dict[str, float]:
        """Share of training rows (= tokens) per source over steps [start, start + steps)."""
        counts = self.rows_per_source(np.arange(start, start + steps)).sum(axis=0)
        return {s: float(c) / float(counts.sum()) for s, c in zip(self.sources, counts, strict=True)}
