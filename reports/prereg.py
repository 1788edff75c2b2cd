"""Preregistration: the hypothesis is frozen into a run's record when its training starts.

`hypothesis.registered.json` in a seed run directory maps experiment name -> what that
experiment's hypothesis was (metric, direction, min_effect, alpha, seeds, baseline) when
training started, or when the run was first reused for it (`results_existed: true`). The
first registration per name wins and is never rewritten, so editing the YAML after the
results cannot move the goalposts: the verdict is computed against the registered
hypothesis and the comment shows what changed.

Extra looks: seeds added after registration are not part of the registered test. The
registered look spends all of alpha (an alpha-spending rule that gives later looks
nothing): the verdict is decided on the registered seeds only, and the added seeds are
shown as an exploratory look that decides nothing. Why not Bonferroni over the looks
taken so far (alpha / K at look K): an "add a seed until supported" policy still
reaches a false-positive rate of 0.073 at alpha 0.05 with it (bench/bench_verdict.py).
To decide with more seeds, register a new experiment on fresh seeds (another
`train.seed`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reports.compare import HypothesisView
from reports.records import REGISTRATION_FILE, read_registrations

__all__ = ["REGISTRATION_FILE", "changes", "read_registrations", "register_hypothesis", "registered_for",
           "registered_view", "registration_entry"]


def registration_entry(hypothesis: Any, seeds: Sequence[int], *, results_existed: bool = False,
                       now: float | None = None) -> dict[str, Any]:
    view = HypothesisView.of(hypothesis)
    return {
        "hypothesis": view.registered_fields(),
        "seed_list": [int(s) for s in seeds],
        "registered_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now if now is not None else time.time())),
        "registered_at_s": now if now is not None else time.time(),
        "results_existed": bool(results_existed),
    }


def register_hypothesis(run_dir: str | Path, experiment: str, hypothesis: Any, seeds: Sequence[int], *,
                        results_existed: bool = False) -> dict[str, Any]:
    """Registers `hypothesis` for `experiment` in `run_dir` unless it already is; returns
    the registration in force. The caller holds the run's identity lock."""
    run_dir = Path(run_dir)
    entries = read_registrations(run_dir)
    if experiment in entries:
        return entries[experiment]
    entries[experiment] = registration_entry(hypothesis, seeds, results_existed=results_existed)
    tmp = run_dir / f".{REGISTRATION_FILE}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(entries, indent=2, sort_keys=True), encoding="utf-8")
    tmp.replace(run_dir / REGISTRATION_FILE)
    return entries[experiment]


def registered_for(candidates: Sequence[Any], experiment: str) -> dict[str, Any] | None:
    """The earliest registration of `experiment` among the candidate runs (RunRecords)."""
    found: list[dict[str, Any]] = [r.registrations[experiment] for r in candidates
                                   if experiment in getattr(r, "registrations", {})]
    if found:
        return min(found, key=lambda e: float(e.get("registered_at_s") or 0.0))
    # Runs without a registration file (trained before it existed, or by hand): the spec the
    # run was trained from was frozen into its directory when training started; use that.
    own = [r.hypothesis for r in candidates if r.experiment == experiment and isinstance(r.hypothesis, dict)]
    if not own:
        return None
    return {"hypothesis": HypothesisView.of(own[0]).registered_fields(), "seed_list": [],
            "registered_at": "training start (the run's spec.resolved.json)", "registered_at_s": 0.0,
            "results_existed": False}


def registered_view(entry: dict[str, Any], current: HypothesisView) -> HypothesisView:
    """The registered hypothesis as a view (statement and override text from the current spec)."""
    fields = {**current.registered_fields(), **{k: v for k, v in (entry.get("hypothesis") or {}).items()
                                               if k in current.registered_fields()}}
    return HypothesisView.of({**fields, "statement": current.statement, "alpha_override": current.alpha_override})


def changes(registered: HypothesisView, current: HypothesisView) -> list[str]:
    """`direction decrease -> increase` for each registered field the current spec changed."""
    out = []
    before, after = registered.registered_fields(), current.registered_fields()
    for key, old in before.items():
        new = after[key]
        if old != new:
            out.append(f"{key} {old:g} -> {new:g}" if isinstance(old, float) else f"{key} {old} -> {new}")
    return out
