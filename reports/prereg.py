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

import hashlib
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


# --------------------------------------------------------------------------- claims (issue 20)
#
# A registration is bound to the claim, not the name: the trained configuration (the spec
# hash without `train.seed`, so neither a rename nor a new base seed makes a new claim) and
# the baseline it is compared with. The hypothesis fields (metric, direction, min_effect,
# alpha, seeds) are frozen *in* the registration; editing them later is "changed after
# results" and the verdict keeps the registered ones.
#
# One confirmatory registration per claim (per claim and pull request under the trusted
# registry, pipelines/trusted/registry.py: another PR's registration never sets this PR's rule),
# made when its first seed starts training, on seeds no earlier run of the claim used
# (`fresh_seeds`; seeds stay used across pull requests). Every other seed of the claim is
# exploratory: pilot runs (`hypothesis.pilot`), seeds added later, seeds of a rerun under
# another name or base seed, runs whose results existed before the registration. The
# headline is decided on the registration's own seeds only, so no rename, no added seed and
# no rerun can move it (simulated in tests/unit/test_report_prereg.py).

CLAIM_PREFIX = "claim:"
"""Registration file keys of claim registrations (older files are keyed by experiment name)."""


def claim_spec_hash(spec: Any) -> str:
    """The spec hash without the seed: what a rerun on other seeds shares with the first run."""
    data = spec.training_dict()
    data.get("train", {}).pop("seed", None)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def claim_key(spec: Any) -> str:
    """The claim of an experiment spec: its configuration (without the seed) and its baseline."""
    payload = json.dumps({"spec": claim_spec_hash(spec), "baseline": spec.hypothesis.baseline}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def claim_entry(claim: str, experiment: str, hypothesis: Any, seeds: Sequence[int], *, pilot: bool = False,
                now: float | None = None, pr: int | None = None) -> dict[str, Any]:
    """A claim's registration; `pr`: the pull request that makes it (the trusted registry's
    plan), whose registration is in force for that pull request only."""
    entry = registration_entry(hypothesis, seeds, now=now)
    out = {**entry, "claim": claim, "experiment": experiment, "kind": "pilot" if pilot else "confirmatory"}
    return out if pr is None else {**out, "pr": int(pr)}


def registry_dir(runs_root: str | Path, claim: str) -> Path:
    return Path(runs_root) / "registry" / claim


def _confirmatory_file(claim_dir: Path, pr: int | None) -> Path:
    # Per pull request when the registration names one: on runs/ shared between runners, the
    # first PR to register a public configuration must not set another PR's rule.
    return claim_dir / ("confirmatory.json" if pr is None else f"confirmatory-pr{int(pr)}.json")


def confirmatory_registration(runs_root: str | Path, claim: str, pr: int | None = None) -> dict[str, Any] | None:
    """The claim's confirmatory registration, if one was made (`runs/registry/<claim>/`; with
    `pr`, the one that pull request made)."""
    path = _confirmatory_file(registry_dir(runs_root, claim), pr)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def seen_seeds(runs_root: str | Path, claim: str) -> set[int]:
    """Every seed any run of the claim trained on (or reused), pilot and exploratory included."""
    seen = registry_dir(runs_root, claim) / "seen"
    return {int(p.name) for p in seen.glob("*") if p.name.isdigit()} if seen.is_dir() else set()


def mark_seen(runs_root: str | Path, claim: str, seed: int) -> None:
    seen = registry_dir(runs_root, claim) / "seen"
    seen.mkdir(parents=True, exist_ok=True)
    (seen / str(int(seed))).touch()


def fresh_seeds(start: int, count: int, used: set[int]) -> list[int]:
    """The first `count` seeds from `start` on that no run of the claim used."""
    out: list[int] = []
    seed = start
    while len(out) < count:
        if seed not in used:
            out.append(seed)
        seed += 1
    return out


def register_confirmatory(runs_root: str | Path, entry: dict[str, Any]) -> dict[str, Any]:
    """Creates the claim's confirmatory registration unless one exists (first writer wins,
    O_EXCL, safe between processes; per pull request when the entry names one); returns the
    one in force."""
    directory = registry_dir(runs_root, entry["claim"])
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".confirmatory.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(entry, indent=2, sort_keys=True), encoding="utf-8")
    try:
        os.link(tmp, _confirmatory_file(directory, entry.get("pr")))
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    found = confirmatory_registration(runs_root, entry["claim"], entry.get("pr"))
    assert found is not None
    return found


def record_registration(run_dir: str | Path, entry: dict[str, Any], *, results_existed: bool) -> dict[str, Any]:
    """Writes the claim's registration into a seed run directory (first per claim wins): the
    run is confirmatory evidence only if it was trained under the registration, on one of its
    seeds; a run that had results before is marked `results_existed`."""
    run_dir = Path(run_dir)
    entries = read_registrations(run_dir)
    key = CLAIM_PREFIX + entry["claim"]
    if key in entries:
        return entries[key]
    entries[key] = {**entry, "results_existed": bool(results_existed)}
    tmp = run_dir / f".{REGISTRATION_FILE}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(entries, indent=2, sort_keys=True), encoding="utf-8")
    tmp.replace(run_dir / REGISTRATION_FILE)
    return entries[key]


def claims_of(candidates: Sequence[Any]) -> list[str]:
    """Claims the candidate runs carry, the most common first."""
    counts: dict[str, int] = {}
    for run in candidates:
        for key in getattr(run, "registrations", {}):
            if key.startswith(CLAIM_PREFIX):
                counts[key[len(CLAIM_PREFIX):]] = counts.get(key[len(CLAIM_PREFIX):], 0) + 1
    return sorted(counts, key=lambda c: -counts[c])


def split_by_registration(candidates: Sequence[Any], claim: str
                          ) -> tuple[dict[str, Any] | None, tuple[Any, ...], tuple[Any, ...]]:
    """(confirmatory registration, confirmatory runs, exploratory runs) of `claim`.

    A run is confirmatory iff it was trained under the claim's confirmatory registration
    (its own entry: kind confirmatory, results did not exist) on one of the registration's
    seeds. The registration is the earliest confirmatory entry any candidate carries."""
    key = CLAIM_PREFIX + claim
    entries = [r.registrations[key] for r in candidates if key in getattr(r, "registrations", {})]
    confirmatory = [e for e in entries if e.get("kind") == "confirmatory"]
    if not confirmatory:
        return None, (), tuple(candidates)
    entry = min(confirmatory, key=lambda e: float(e.get("registered_at_s") or 0.0))
    registered = set(entry.get("seed_list") or [])
    decided: list[Any] = []
    explored: list[Any] = []
    for run in candidates:
        own = getattr(run, "registrations", {}).get(key)
        ok = (own is not None and own.get("kind") == "confirmatory" and not own.get("results_existed")
              and own.get("registered_at_s") == entry.get("registered_at_s") and run.seed in registered)
        (decided if ok else explored).append(run)
    return entry, tuple(decided), tuple(explored)
