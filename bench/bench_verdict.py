"""The verdict rule by simulation: today's rule side by side with the previous one.

Per cell 20,000 simulated studies (numpy, fixed seed). A loss-like metric (mean 3.5)
whose per-seed values vary by `noise` (relative sd) independently on each side; the
candidate's true relative effect is a multiple of min_effect. Figures:

- P(supported) with the true effect at 0.9x and 1x min_effect (false positives: the
  claim "at least min_effect" is wrong), at 2x (power), for 2, 3 and 5 seeds;
- the seeds hint for 80 % power: what each rule hints from the noise, and the simulated
  P(supported) at the hinted n at its planning effect (previous rule: min_effect itself;
  current rule: 2x min_effect, since a margin test has power alpha at the margin);
- an "add one seed until supported" policy (3 -> 16 seeds) at a true effect of min_effect:
  no correction, Bonferroni over the looks so far (alpha / K), and the registered look only
  (what `reports.prereg` does).

Previous rule (until a4a04ee): supported when a two-sided paired t-test of the absolute
differences against 0 has p < alpha and the mean effect relative to the baseline mean is
>= min_effect; hint n = ceil(((z_{1-alpha/2} + z_0.8) sqrt(2) sd_b / (min_effect |mean_b|))^2).

Run: `.venv/bin/python bench/bench_verdict.py` (prints the tables and appends them to
bench/RESULTS.md under "## Verdict rule"; `--no-write` only prints). About 10 s.
"""

from __future__ import annotations

import math
import platform
import sys
import time
from statistics import NormalDist

import numpy as np
from scaffold import append_results_md, utc_stamp
from scipy import stats

from reports.verdict import PLANNING_FACTOR, SUPPORTED, decide_values, seeds_needed

TRIALS = 20_000
ALPHA = 0.05
MEAN = 3.5
SEED = 20261201


def simulate(rng: np.random.Generator, n: int, effect: float, noise: float, trials: int = TRIALS):
    """(candidate, baseline) values, shape (trials, n); the metric should decrease."""
    base = MEAN * (1 + noise * rng.standard_normal((trials, n)))
    cand = MEAN * (1 - effect) * (1 + noise * rng.standard_normal((trials, n)))
    return cand, base


def new_supported(cand, base, min_effect: float, alpha: float = ALPHA):
    return decide_values(cand, base, "decrease", min_effect, alpha) == SUPPORTED


def old_supported(cand, base, min_effect: float, alpha: float = ALPHA):
    n = cand.shape[-1]
    d = cand - base
    mean, sd = d.mean(-1), d.std(-1, ddof=1)
    t = mean / (sd / math.sqrt(n))
    p = 2 * stats.t.sf(np.abs(t), n - 1)
    effect = -mean / np.abs(base.mean(-1))
    return (p < alpha) & (effect > 0) & (effect >= min_effect)


def old_hint(noise: float, min_effect: float, alpha: float = ALPHA) -> int:
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(0.8)
    return max(2, math.ceil((z * math.sqrt(2) * noise * MEAN / (min_effect * MEAN)) ** 2))


def rates_table(rng) -> list[str]:
    rows = ["| noise | min_effect | seeds | P(sup) at 0.9x: prev / now | at 1x: prev / now | power at 2x: prev / now |",
            "|---:|---:|---:|---:|---:|---:|"]
    for noise in (0.005, 0.01):
        for m in (0.01, 0.02):
            for n in (2, 3, 5):
                cells = []
                for factor in (0.9, 1.0, 2.0):
                    cand, base = simulate(rng, n, factor * m, noise)
                    cells.append(f"{old_supported(cand, base, m).mean():.3f} / {new_supported(cand, base, m).mean():.3f}")
                rows.append(f"| {noise:.1%} | {m:.0%} | {n} | " + " | ".join(cells) + " |")
    return rows


def hint_table(rng) -> list[str]:
    rows = ["| noise | min_effect | prev hint n | prev P(sup) at n, effect 1x | now hint n | now P(sup) at n, effect 2x |",
            "|---:|---:|---:|---:|---:|---:|"]
    for noise in (0.0025, 0.005, 0.01):
        for m in (0.01, 0.02):
            n_old = old_hint(noise, m)
            cand, base = simulate(rng, n_old, m, noise)
            p_old = old_supported(cand, base, m).mean()
            n_new = seeds_needed(math.sqrt(2) * noise, m, ALPHA)
            if n_new is None or n_new > 64:
                now = f"{n_new or '> 100000'} (over the maximum of 16: said so) | —"
            else:
                cand, base = simulate(rng, n_new, PLANNING_FACTOR * m, noise)
                now = f"{n_new}{' (over 16: said so)' if n_new > 16 else ''} | {new_supported(cand, base, m).mean():.3f}"
            rows.append(f"| {noise:.2%} | {m:.0%} | {n_old} | {p_old:.3f} | {now} |")
    return rows


def looks_table(rng, noise: float = 0.005, m: float = 0.01, start: int = 3, stop: int = 16) -> list[str]:
    trials = 10_000
    base_all = MEAN * (1 + noise * rng.standard_normal((trials, stop)))
    rows = ["| true effect | rule | P(supported at some look, 3 -> 16 seeds) |", "|---|---|---:|"]
    for label, effect in (("0 (A/A)", 0.0), ("1x min_effect", m)):
        cand_all = MEAN * (1 - effect) * (1 + noise * rng.standard_normal((trials, stop)))
        policies = {
            "previous rule, no correction": lambda k, n, c, b: old_supported(c, b, m),
            "current rule, no correction": lambda k, n, c, b: new_supported(c, b, m),
            "current rule, Bonferroni alpha/K over the looks so far": lambda k, n, c, b: new_supported(c, b, m, ALPHA / k),
            "current rule, registered look only (reports.prereg)": lambda k, n, c, b: (
                new_supported(c, b, m) if k == 1 else np.zeros(trials, bool)),
        }
        for name, rule in policies.items():
            hit = np.zeros(trials, bool)
            for k, n in enumerate(range(start, stop + 1), 1):
                hit |= rule(k, n, cand_all[:, :n], base_all[:, :n])
            rows.append(f"| {label} | {name} | {hit.mean():.3f} |")
    return rows


def estimated_hint_table(rng, m: float = 0.02, pilot: int = 3, trials: int = 2000) -> list[str]:
    """The hint from an sd *estimated* on `pilot` seeds (what an inconclusive verdict gives):
    the exact power that n then has under the true sd."""
    from reports.verdict import power

    rows = ["| true sd of r | needed n (true sd) | median hinted n (sd from 3 seeds) | mean power at hinted n | "
            "P(power >= 0.8) |", "|---:|---:|---:|---:|---:|"]
    for sd in (0.005, 0.01, 0.02):
        sd_hat = (sd * rng.standard_normal((trials, pilot))).std(axis=1, ddof=1)
        hinted = [seeds_needed(float(s), m, ALPHA) or 10**6 for s in sd_hat]
        powers = np.array([power(min(n, 10**4), sd, m, ALPHA) for n in hinted])
        rows.append(f"| {sd:.1%} | {seeds_needed(sd, m, ALPHA)} | {int(np.median(hinted))} | {powers.mean():.3f} | "
                    f"{(powers >= 0.8).mean():.3f} |")
    return rows


def main(write: bool = True) -> str:
    started = time.perf_counter()
    rng = np.random.default_rng(SEED)
    parts = [
        f"Machine: {platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}; "
        f"{TRIALS:,} simulated studies per cell, alpha {ALPHA}, seed {SEED}; Monte-Carlo 3 sigma at 0.05 is "
        f"{3 * math.sqrt(0.05 * 0.95 / TRIALS):.4f}.",
        "",
        "False positives (true effect 0.9x or 1x min_effect) and power (2x):",
        "",
        *rates_table(rng),
        "",
        "Seeds hint for 80 % power (noise known; the hint assumes independent seeds on both sides):",
        "",
        *hint_table(rng),
        "",
        "Extra looks: add one seed at a time until supported (noise 0.5 %, min_effect 1 %, 10,000 studies):",
        "",
        *looks_table(rng),
        "",
        "The hint as an inconclusive verdict gives it, from the sd of 3 seeds (min_effect 2 %, 2,000 pilots each); "
        "the sd estimate is noisy, so the hint is only as good as that estimate:",
        "",
        *estimated_hint_table(rng),
    ]
    elapsed = time.perf_counter() - started
    body = "\n".join(parts) + f"\n\nSimulated in {elapsed:.1f} s. Reproduce: `.venv/bin/python bench/bench_verdict.py`.\n"
    print(body)
    if write:
        append_results_md(f"\n## Verdict rule (bench/bench_verdict.py) — {utc_stamp()}\n\n{body}")
    return body


if __name__ == "__main__":
    main(write="--no-write" not in sys.argv)
