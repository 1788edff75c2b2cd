"""Distribution profiles of prepared data and the divergences the checks compare.

A source's token-frequency profile is kept in two forms: the top tokens (for people)
and a compact distribution over the `PROFILE_TOKENS` most frequent tokens, keyed by the
token's *text* (not its id), with the remaining mass in one `OTHER` entry. Keying by
text keeps profiles comparable between two preparations whose tokenizers assign
different ids (a re-trained BPE gives the common tokens the same strings, not the same
ids); with the same tokenizer and vocabularies up to `PROFILE_TOKENS` it is exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

PROFILE_TOKENS = 4096
OTHER = "<other>"
TOP_TOKENS = 20
LENGTH_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def token_profile(counts: np.ndarray, vocab: Sequence[str]) -> dict[str, Any]:
    total = int(counts.sum())
    order = np.argsort(-counts, kind="stable")
    kept = [int(i) for i in order[:PROFILE_TOKENS] if counts[i] > 0]
    distribution = {vocab[i]: round(float(counts[i]) / total, 9) for i in kept} if total else {}
    rest = total - int(sum(int(counts[i]) for i in kept))
    if rest > 0:
        distribution[OTHER] = round(rest / total, 9)
    return {
        "total": total,
        "distinct": int((counts > 0).sum()),
        "top": [[vocab[i], int(counts[i])] for i in kept[:TOP_TOKENS]],
        "distribution": distribution,
    }


def length_summary(lengths: np.ndarray) -> dict[str, Any]:
    if lengths.size == 0:
        return {"mean": 0.0, "max": 0, **{f"p{int(q * 100):02d}": 0.0 for q in LENGTH_QUANTILES}}
    qs = np.quantile(lengths, LENGTH_QUANTILES)
    out = {"mean": round(float(lengths.mean()), 3), "max": int(lengths.max())}
    out.update({f"p{int(q * 100):02d}": round(float(v), 3) for q, v in zip(LENGTH_QUANTILES, qs, strict=True)})
    return out


def histogram_quantile(values: np.ndarray, counts: np.ndarray, q: float) -> float:
    """`np.quantile(x, q)` (method 'linear', bit for bit) of the multiset where `values[i]` occurs
    `counts[i]` times (values sorted ascending), without materialising it."""
    n = int(counts.sum())
    cum = np.cumsum(counts)
    virtual = n * q + (1 + q * (1 - 1 - 1)) - 1  # numpy's _compute_virtual_index with alpha = beta = 1
    below = min(max(int(np.floor(virtual)), 0), n - 1)
    above = min(below + 1, n - 1)
    a = float(values[int(np.searchsorted(cum, below, side="right"))])
    b = float(values[int(np.searchsorted(cum, above, side="right"))])
    gamma = virtual - np.floor(virtual)
    diff = b - a
    return float(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)  # numpy's _lerp


def merge_histograms(parts: list[tuple[list[int], list[int]]]) -> tuple[np.ndarray, np.ndarray]:
    """Sum `(values, counts)` histograms; values sorted ascending."""
    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    values = np.concatenate([np.asarray(v, dtype=np.int64) for v, _ in parts])
    counts = np.concatenate([np.asarray(c, dtype=np.int64) for _, c in parts])
    merged, inverse = np.unique(values, return_inverse=True)
    return merged, np.bincount(inverse, weights=counts, minlength=merged.size).astype(np.int64)


def histogram_summary(values: np.ndarray, counts: np.ndarray) -> dict[str, Any]:
    """`length_summary` of the multiset a histogram describes (same numbers, same rounding)."""
    n = int(counts.sum())
    if n == 0:
        return {"mean": 0.0, "max": 0, **{f"p{int(q * 100):02d}": 0.0 for q in LENGTH_QUANTILES}}
    out = {"mean": round(float(int((values * counts).sum()) / n), 3), "max": int(values[counts > 0].max())}
    out.update({f"p{int(q * 100):02d}": round(histogram_quantile(values, counts, q), 3) for q in LENGTH_QUANTILES})
    return out


def js_divergence(p: Mapping[str, float] | Sequence[float], q: Mapping[str, float] | Sequence[float]) -> float:
    """Jensen-Shannon divergence in bits (0 = identical, 1 = disjoint support).

    Takes two aligned sequences, or two `{token text: probability}` profiles (aligned
    over the union of their keys, a missing key meaning probability 0)."""
    if isinstance(p, Mapping) and isinstance(q, Mapping):
        keys = sorted(set(p) | set(q))
        p, q = [p.get(k, 0.0) for k in keys], [q.get(k, 0.0) for k in keys]
    a = np.asarray(p, dtype=np.float64)
    b = np.asarray(q, dtype=np.float64)
    assert a.shape == b.shape, "profiles must be aligned"
    if a.sum() <= 0 or b.sum() <= 0:
        return 1.0 if a.sum() != b.sum() else 0.0
    a, b = a / a.sum(), b / b.sum()
    m = 0.5 * (a + b)

    def kl(x: np.ndarray) -> float:
        mask = x > 0
        return float(np.sum(x[mask] * np.log2(x[mask] / m[mask])))

    value = 0.5 * kl(a) + 0.5 * kl(b)
    return min(1.0, max(0.0, value if math.isfinite(value) else 1.0))


def relative_shift(value: float, baseline: float) -> float:
    if baseline == 0:
        return 0.0 if value == 0 else math.inf
    return abs(value - baseline) / abs(baseline)
