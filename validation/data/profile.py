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
