"""`Report`: the comparison, the verdict and the context a reviewer needs (pure).

Built from records only: the parameter diff shows only fields that changed, the data
diff the mixture, data version and checks, then cost against the plan's estimate,
alerts, throughput/MFU/memory, and warnings about anything that makes the comparison
less fair than it looks (different trainer code, different environment, unpaired or
failed seeds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from reports.compare import Comparison, HypothesisView, compare
from reports.records import COSMETIC_PARAM_PREFIXES, Alert, RunRecord, env_diff
from reports.verdict import Verdict, verdict

ABSENT = "(absent)"
"""Shown for a field one side's spec does not have (e.g. a source only the candidate uses)."""


@dataclass(frozen=True)
class ParamChange:
    field: str
    baseline: Any
    candidate: Any


@dataclass(frozen=True)
class DataDiff:
    candidate_version: str | None
    baseline_version: str | None
    mixture: dict[str, tuple[float | None, float | None]]
    """source -> (baseline weight, candidate weight) as requested."""
    realised: dict[str, tuple[float | None, float | None]]
    """source -> (baseline, candidate) realised share."""
    candidate_checks: tuple[bool | None, tuple[str, ...]]
    baseline_checks: tuple[bool | None, tuple[str, ...]]
    candidate_counts: tuple[int | None, int | None] = (None, None)
    """(expectations met, expectations evaluated) by the candidate's data-check stage."""
    baseline_counts: tuple[int | None, int | None] = (None, None)
    check_rows: tuple[dict[str, Any], ...] = ()
    """The candidate's per-source profile the checks ran on (validation.data.checks rows)."""
    checks_against: str | None = None
    """The baseline the candidate's drift rules compared with."""

    @property
    def version_changed(self) -> bool:
        return self.candidate_version != self.baseline_version


@dataclass(frozen=True)
class SideSummary:
    """Cost and performance of one side (means over its finished runs, sums for cost)."""

    runs: int
    device_hours: float | None
    estimate_device_hours: float | None
    tokens_per_s: float | None
    mfu: float | None
    peak_mem_gb: float | None
    parameters: int | None = None
    """Total parameters of the side's model (its first run that recorded them)."""
    active_parameters: int | None = None
    """Parameters per token (mixture of experts: the experts a token is routed to)."""


@dataclass(frozen=True)
class ReportContext:
    """Where and when: what the top of the comment links to (filled by `build_report`)."""

    commit: str | None = None
    """The commit the candidate trained (the PR head the launch was bound to, else its git SHA)."""
    dirty: bool = False
    """The candidate trained with uncommitted changes."""
    generated_at: str | None = None
    """When the report was made, `2026-12-04 20:41 UTC`."""
    workflow_url: str | None = None
    """The GitHub Actions run that made it (None outside Actions)."""
    compare_url: str | None = None
    """MLflow's compare view of every run of the comparison."""
    mlflow_hint: str | None = None
    """How to open MLflow when it has no public URL (a local store)."""
    artifacts: str | None = None
    """Where report.md's files (PNG plots, result.json) are: a folder, or the workflow run's artifacts."""


@dataclass(frozen=True)
class Report:
    experiment: str
    baseline_name: str
    comparison: Comparison
    verdict: Verdict
    candidates: tuple[RunRecord, ...]
    baselines: tuple[RunRecord, ...]
    params_diff: tuple[ParamChange, ...]
    data_diff: DataDiff
    candidate_summary: SideSummary
    baseline_summary: SideSummary
    alerts: tuple[tuple[str, Alert], ...]
    """(run id, alert) for every alert the candidate runs raised."""
    warnings: tuple[str, ...]
    plots: tuple[str, ...] = field(default=())
    """File names of PNG plots next to report.md."""
    hypothesis_changes: tuple[str, ...] = ()
    """Registered fields the spec changed after registration (`direction decrease -> increase`)."""
    current_hypothesis: HypothesisView | None = None
    """The spec's hypothesis now, when it differs from the registered one the verdict used."""
    added_seeds: tuple[int | None, ...] = ()
    """Candidate seeds outside the registered seed list (an exploratory look, see reports.prereg)."""
    exploratory: Verdict | None = None
    """What all paired seeds, added ones included, would say; decides nothing."""
    registration_note: str = ""
    definitions: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """metric -> the fields that make it mean something else on the two sides (not comparable)."""
    decided_seeds: tuple[int | None, ...] = ()
    """The seeds the headline was decided on (the confirmatory registration's own runs)."""
    baseline_alerts: tuple[tuple[str, Alert], ...] = ()
    """(run id, alert) for every alert the baseline runs raised: the same alert on both sides is
    not caused by the change."""
    context: ReportContext = field(default_factory=ReportContext)

    @property
    def hypothesis(self) -> HypothesisView:
        return self.comparison.hypothesis


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return float(a) == float(b)
    return bool(a == b)


def params_diff(candidate: dict[str, Any], baseline: dict[str, Any]) -> tuple[ParamChange, ...]:
    """Fields whose values differ (missing on one side counts), cosmetic fields and the seed left out."""
    changes = []
    for key in sorted(set(candidate) | set(baseline)):
        if key.startswith(COSMETIC_PARAM_PREFIXES) or key == "train.seed":
            continue
        cand, base = candidate.get(key, ABSENT), baseline.get(key, ABSENT)
        if not _same(cand, base):
            changes.append(ParamChange(key, base, cand))
    return tuple(changes)


def _merge(base: dict[str, float], cand: dict[str, float]) -> dict[str, tuple[float | None, float | None]]:
    return {s: (base.get(s), cand.get(s)) for s in sorted(set(base) | set(cand))}


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return fmean(known) if known else None


def _sum(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def summarize(runs: Sequence[RunRecord], charge_for: str | None = None) -> SideSummary:
    """Means over finished runs; device-hours summed over the runs `charge_for` caused (its
    own training; a run reused from another experiment with the same identity cost it nothing)."""
    done = [r for r in runs if r.status == "finished"] or list(runs)
    charged = [r for r in runs if charge_for is None or r.experiment == charge_for]
    return SideSummary(
        runs=len(runs),
        device_hours=_sum([r.cost.device_hours for r in charged]) if charged else (0.0 if runs else None),
        estimate_device_hours=_sum([r.cost.estimate_device_hours for r in charged]),
        tokens_per_s=_mean([r.perf.tokens_per_s for r in done]),
        mfu=_mean([r.perf.mfu for r in done]),
        peak_mem_gb=max((r.perf.peak_mem_gb for r in done if r.perf.peak_mem_gb is not None), default=None),
        parameters=next((r.perf.parameters for r in done if r.perf.parameters), None),
        active_parameters=next((r.perf.active_parameters for r in done if r.perf.active_parameters), None),
    )


def _warnings(candidates: Sequence[RunRecord], baselines: Sequence[RunRecord], comparison: Comparison,
              name: str, definitions: dict[str, tuple[str, ...]]) -> list[str]:
    warnings = []
    if definitions:
        warnings.append("Defined differently on the two sides, so not comparable: " + "; ".join(
            f"`{k}` ({', '.join(v)})" for k, v in definitions.items())
            + (". Bits per byte (`eval/bpb`) do not depend on the tokenizer." if any(
                k.endswith("/loss") for k in definitions) else "."))
    cand_trainer = {r.trainer_version for r in candidates if r.trainer_version}
    base_trainer = {r.trainer_version for r in baselines if r.trainer_version}
    if cand_trainer and base_trainer and cand_trainer != base_trainer:
        warnings.append(
            f"Stale baseline: it ran on trainer code {', '.join(sorted(base_trainer))}, the candidate on "
            f"{', '.join(sorted(cand_trainer))}; differences may come from the trainer, not the experiment. "
            "Re-run the baseline on the current code to be sure.")
    differences = sorted({line for c in candidates for b in baselines for line in env_diff(c.env, b.env)})
    if differences:
        warnings.append(
            "Different environments (candidate vs baseline): " + "; ".join(differences)
            + ". Throughput and numerics may not be comparable.")
    for r in (*candidates, *baselines):
        if r.non_finite:
            warnings.append(
                f"Not finite in {r.experiment} seed {r.seed}: {', '.join(f'`{k}`' for k in r.non_finite)}; left out, "
                "not replaced by an earlier value (a non-finite eval or training loss is divergence).")
    failed = [r for r in (*candidates, *baselines) if r.status != "finished"]
    if failed:
        warnings.append("Not finished (left out of the comparison): " + ", ".join(
            f"{r.experiment} seed {r.seed} ({r.status})" for r in failed))
    # A baseline seed whose candidate did not finish is explained by the line above.
    unfinished = {r.seed for r in candidates if r.status != "finished"}
    lonely_base = [s for s in comparison.unpaired_baseline_seeds if s not in unfinished]
    if comparison.unpaired_candidate_seeds or lonely_base:
        warnings.append(
            f"Unpaired seeds left out: candidate {list(comparison.unpaired_candidate_seeds)}, "
            f"baseline {lonely_base}.")
    h = comparison.hypothesis
    reused = sorted({r.experiment for r in candidates if r.experiment != name})
    if reused:
        warnings.append(f"Reused runs trained for {', '.join(reused)} (same identity): not charged to `{name}`.")
    if comparison.primary and comparison.primary.n < h.seeds:
        warnings.append(f"Only {comparison.primary.n} of the {h.seeds} planned seeds could be paired.")
    # An exported model that transformers cannot load is said, with how it does load (the
    # architecture file's own statement): never a silently different model in the registry.
    refusals = sorted({r.tags["export"] for r in candidates if r.tags.get("export_loadable") == "false"})
    if refusals:
        warnings.append("Exported model: " + "; ".join(refusals))
    return warnings


def make_report(
    candidates: Sequence[RunRecord],
    baselines: Sequence[RunRecord],
    hypothesis: Any = None,
    *,
    experiment: str | None = None,
    baseline_name: str | None = None,
    claim: str | None = None,
) -> Report:
    """Everything for one comparison; `hypothesis` defaults to the candidate spec's own.

    `claim` (`reports.prereg.claim_key`) names the registration that decides the headline;
    by default the claim most candidate runs carry, else the registration by experiment name."""
    candidates, baselines = tuple(candidates), tuple(baselines)
    assert candidates, "a report needs at least one candidate run"
    if hypothesis is None:
        hypothesis = next((r.hypothesis for r in candidates if r.hypothesis), None)
        assert hypothesis is not None, "no hypothesis given and none in the candidate's spec"
    from reports import prereg

    current = HypothesisView.of(hypothesis)
    name = experiment or candidates[0].experiment
    view, note = current, ""
    changed: tuple[str, ...] = ()
    added: tuple[int | None, ...] = ()
    decided = candidates
    headline_override: str | None = None
    carried = prereg.claims_of(candidates)
    claim = claim if claim in carried else next(iter(carried), None)
    if claim is not None:
        entry, decided, explored = prereg.split_by_registration(candidates, claim)
        added = _seeds(explored)
        if entry is not None:
            view = prereg.registered_view(entry, current)
            changed = tuple(prereg.changes(view, current))
            if not decided:
                headline_override = (
                    f"Inconclusive: none of these runs is on the claim's registered seeds "
                    f"{entry.get('seed_list')} (registered {entry.get('registered_at', '?')} by "
                    f"`{entry.get('experiment', '?')}`): a rename, a new base seed or added seeds of the same "
                    "configuration and baseline are the same claim, and its verdict is decided on its registered "
                    "seeds only. Everything here is an exploratory look.")
        else:
            pilot = any((getattr(r, "registrations", {}).get(prereg.CLAIM_PREFIX + claim) or {}).get("kind") == "pilot"
                        for r in candidates)
            headline_override = (
                "Inconclusive: a pilot decides nothing; its numbers are an exploratory look. The confirmatory "
                "test is a new registration on fresh seeds: set `hypothesis.pilot: false` and the plan picks seeds "
                "no run of this claim has used." if pilot else
                "Inconclusive: these runs had results before the claim was registered, so they are an exploratory "
                "look only; a confirmatory verdict needs runs trained under the registration.")
            decided = ()
    else:  # registrations by experiment name (runs made before claims)
        entry = prereg.registered_for(candidates, name)
        if entry is not None:
            view = prereg.registered_view(entry, current)
            changed = tuple(prereg.changes(view, current))
            registered_seeds = set(entry.get("seed_list") or [])
            if registered_seeds:
                decided = tuple(r for r in candidates if r.seed in registered_seeds)
                added = _seeds(r for r in candidates if r.seed not in registered_seeds)
            if entry.get("results_existed"):
                note = (f"The hypothesis of `{name}` was registered on {entry.get('registered_at', '?')} when its "
                        "runs already had results (they were reused from an identical configuration).")
    comparison = compare(decided, baselines, view)
    exploratory = None
    if added:
        exploratory = verdict(compare(candidates, baselines, view), candidates=candidates, baselines=baselines)
    cand0, base0 = candidates[0], (baselines[0] if baselines else None)
    definitions = {k: d for k in comparison.metrics
                   if base0 is not None and (d := definition_differences(cand0.params, base0.params, k))}
    if headline_override is None and view.metric in definitions:
        headline_override = (
            f"Inconclusive: `{view.metric}` is a different quantity on the two sides "
            f"({', '.join(definitions[view.metric])} differ), so comparing it decides nothing"
            + ("; bits per byte (`eval/bpb`) do not depend on the tokenizer." if view.metric.endswith("/loss") else "."))
    if headline_override is not None:
        decided_verdict = Verdict("inconclusive", headline_override, view.metric, 0, alpha=view.alpha)
    else:
        decided_verdict = verdict(comparison, candidates=decided, baselines=baselines)
    data_diff = DataDiff(
        candidate_version=cand0.data.version,
        baseline_version=base0.data.version if base0 else None,
        mixture=_merge(base0.data.mixture_requested if base0 else {}, cand0.data.mixture_requested),
        realised=_merge(base0.data.mixture_realised if base0 else {}, cand0.data.mixture_realised),
        candidate_checks=(cand0.data.checks_passed, cand0.data.checks_failed),
        baseline_checks=(base0.data.checks_passed, base0.data.checks_failed) if base0 else (None, ()),
        candidate_counts=(cand0.data.checks_met, cand0.data.checks_total),
        baseline_counts=(base0.data.checks_met, base0.data.checks_total) if base0 else (None, None),
        check_rows=cand0.data.check_rows,
        checks_against=cand0.data.checks_against,
    )
    return Report(
        experiment=name,
        baseline_name=baseline_name or (base0.experiment if base0 else view.baseline or "baseline"),
        comparison=comparison,
        verdict=decided_verdict,
        candidates=candidates,
        baselines=baselines,
        params_diff=params_diff(cand0.params, base0.params) if base0 else (),
        data_diff=data_diff,
        candidate_summary=summarize(candidates, charge_for=name),
        baseline_summary=summarize(baselines),
        alerts=tuple((r.run_id, a) for r in candidates for a in r.alerts),
        baseline_alerts=tuple((r.run_id, a) for r in baselines for a in r.alerts),
        context=ReportContext(commit=_commit(candidates), dirty=any(r.tags.get("dirty") == "True" for r in candidates)),
        warnings=tuple(_warnings(candidates, baselines, comparison, name, definitions)),
        hypothesis_changes=changed,
        current_hypothesis=current if changed else None,
        added_seeds=added,
        exploratory=exploratory,
        registration_note=note,
        decided_seeds=_seeds(decided),
        definitions=definitions,
    )


EVAL_SETTINGS = ("data.seq_len", "data.eval_fraction", "data.min_doc_chars", "train.eval_batches")
"""How the held-out split is cut and packed (validation.rules.metric_definition)."""


def definition_differences(candidate: dict[str, Any], baseline: dict[str, Any], metric: str) -> tuple[str, ...]:
    """The fields (flattened spec params) that make an eval metric a different quantity on the
    two sides: the held-out settings, the held-out sources (all of them for a pooled metric,
    one for `eval/<source>/...`), and for a per-token `loss` the tokenizer."""
    if not metric.startswith("eval/") or not candidate or not baseline:
        return ()  # a side without its spec: unknown, not different
    parts = metric.split("/")
    source = parts[1] if len(parts) == 3 else None
    keys = set(EVAL_SETTINGS)
    for params in (candidate, baseline):
        keys |= {k for k in params if k.startswith("data.sources.") and k.endswith(".path")
                 and (source is None or k == f"data.sources.{source}.path")}
        if metric.endswith("/loss"):
            keys |= {k for k in params if k.startswith("data.tokenizer.")}
    return tuple(sorted(k for k in keys if candidate.get(k, ABSENT) != baseline.get(k, ABSENT)))


def _seeds(runs: Any) -> tuple[int | None, ...]:
    return tuple(sorted({r.seed for r in runs}, key=lambda s: (s is None, s or 0)))


def _commit(runs: Sequence[RunRecord]) -> str | None:
    """The commit the runs trained: the PR head the launch was bound to, else the checkout's SHA."""
    for key in ("head_sha", "git_sha"):
        found = next((r.tags[key] for r in runs if r.tags.get(key) and r.tags[key] != "None"), None)
        if found:
            return found
    return None
