"""Distribution checks of prepared data with great-expectations 1.x.

Pure part: `source_rows` turns a prepared data version (and optionally the baseline's)
into one row of numbers per source: sizes, empty/duplicate rates, median lengths, the
realised vs requested mixture, and the drift against the baseline (Jensen-Shannon
divergence of token distributions and the relative shift of the median document
length, both computed here because GX 1.x has no divergence expectation).

Adapter part: `run_data_checks` validates those rows with an expectation suite in an
ephemeral GX context (no files, no network): absolute rules with thresholds from
`spec.data.checks`, and drift rules when a baseline is given. Each failing expectation
is reported per source with observed vs expected in plain words, as JSON, a markdown
table for the pull-request comment and a small HTML page.
"""

from __future__ import annotations

import html
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from basics.environment import scoped_environ
from basics.files import sha256_file
from validation.data.mixture import MixtureSchedule
from validation.data.profile import js_divergence, relative_shift, token_profile
from validation.spec import DataChecks, ExperimentSpec

# Mixture realisation is measured over the run's steps, capped (it converges quickly).
MIXTURE_STEPS_CAP = 5000
# Tokens per source sampled for the drift comparison when the two tokenizers differ.
RETOKENIZE_SAMPLE_TOKENS = 200_000


@dataclass(frozen=True)
class Rule:
    """One expectation: a column of the per-source frame must lie within [low, high]."""

    check: str
    column: str
    low: float | None
    high: float | None
    words: str  # how a person says the observed value, e.g. "documents after cleaning"
    drift: bool = False

    def expected(self) -> str:
        if self.low is not None and self.high is not None:
            return f"between {_fmt(self.low)} and {_fmt(self.high)}"
        return f"at least {_fmt(self.low)}" if self.low is not None else f"at most {_fmt(self.high)}"


@dataclass
class Outcome:
    check: str
    source: str
    observed: float | None
    expected: str
    passed: bool
    message: str


@dataclass
class DataCheckResult:
    experiment: str
    data_version: str
    baseline: str | None
    baseline_version: str | None
    success: bool
    total: int
    failed: int
    outcomes: list[Outcome]
    rows: list[dict[str, Any]]
    markdown: str = ""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("markdown")
        return out


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if float(value).is_integer() and abs(value) >= 1:
        return f"{int(value):,}"
    return f"{value:.3g}"


def rules_for(checks: DataChecks, with_baseline: bool) -> list[Rule]:
    rules = [
        Rule("min_documents", "documents", checks.min_documents, None, "documents after cleaning and de-duplication"),
        Rule("min_tokens", "tokens", checks.min_tokens, None, "tokens"),
        Rule("held_out_documents", "eval_documents", 1, None, "held-out documents for evaluation"),
        Rule("max_empty_rate", "empty_rate", None, checks.max_empty_rate, "share of documents dropped as empty or too short"),
        Rule("max_duplicate_rate", "duplicate_rate", None, checks.max_duplicate_rate, "share of exact duplicates"),
        Rule("doc_length_p50", "doc_tokens_p50", 1, checks.max_doc_tokens_p50, "median document length in tokens"),
        Rule("mixture_error", "mixture_error", None, checks.max_mixture_error,
             "difference between realised and requested mixture weight"),
    ]
    if with_baseline:
        rules += [
            Rule("token_drift", "js_divergence", None, checks.max_js_divergence,
                 "Jensen-Shannon divergence (bits) of the token distribution vs the baseline", drift=True),
            Rule("length_drift", "length_shift", None, checks.max_length_shift,
                 "relative shift of the median document length (characters) vs the baseline", drift=True),
        ]
    return rules


def _sample_documents(prepared: Any, source: str, budget: int) -> list[Any]:
    """Training documents spread evenly over the split (every k-th), up to `budget` tokens."""
    offsets = prepared.offsets(source, "train")
    tokens = prepared.tokens(source, "train")
    n = offsets.size - 1
    stride = max(1, int(offsets[-1]) // max(1, budget))
    docs, used = [], 0
    for i in range(0, n, stride):
        if used >= budget:
            break
        docs.append(tokens[offsets[i] : offsets[i + 1]])
        used += int(offsets[i + 1] - offsets[i])
    return docs


def comparable_profiles(prepared: Any, baseline: Any) -> tuple[dict[str, tuple[dict, dict]], str | None]:
    """Token distributions of each shared source, candidate vs baseline, under ONE tokenizer.

    With the same tokenizer the stored profiles are compared directly. When the
    tokenizers differ (another vocabulary, or a BPE trained on other text), a spread
    sample of the baseline's documents is decoded with its own tokenizer and re-encoded
    with the candidate's, and compared with the same-sized sample of the candidate, so
    that the divergence measures the data, not the tokenizer."""
    shared = [s for s in prepared.sources if s in baseline.stats]
    if sha256_file(prepared.tokenizer_path) == sha256_file(baseline.tokenizer_path):
        return {s: (prepared.stats[s]["token_profile"]["distribution"],
                    baseline.stats[s]["token_profile"]["distribution"]) for s in shared}, None

    vocab = [prepared.tokenizer.id_to_token(i) or "" for i in range(prepared.vocab_size)]
    out = {}
    with scoped_environ(TOKENIZERS_PARALLELISM="true"):  # every core for the re-encoding (off process-wide)
        for source in shared:
            ours = _sample_documents(prepared, source, RETOKENIZE_SAMPLE_TOKENS)
            counts_ours = np.bincount(np.concatenate(ours).astype(np.int64), minlength=len(vocab))
            texts = baseline.tokenizer.decode_batch([d.tolist() for d in _sample_documents(
                baseline, source, RETOKENIZE_SAMPLE_TOKENS)])
            ids = [e.ids for e in prepared.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
            counts_base = np.bincount(np.fromiter((i for row in ids for i in row), dtype=np.int64),
                                      minlength=len(vocab))
            out[source] = (token_profile(counts_ours, vocab)["distribution"],
                           token_profile(counts_base, vocab)["distribution"])
    note = (f"tokenizers differ from the baseline's: its documents were re-tokenized with this experiment's "
            f"tokenizer for the drift comparison (samples of about {RETOKENIZE_SAMPLE_TOKENS:,} tokens per source)")
    return out, note


def source_rows(spec: ExperimentSpec, prepared: Any, baseline: Any | None = None,
                profiles: dict[str, tuple[dict, dict]] | None = None) -> list[dict[str, Any]]:
    """One row of numbers per source of `spec` (numpy and the prepared data only)."""
    weights = spec.data.weights()
    dp = spec.parallel_layout().dp
    schedule = MixtureSchedule(prepared, weights, spec.global_batch(dp), spec.train.seed)
    steps = min(spec.total_steps(dp), MIXTURE_STEPS_CAP)
    realised = schedule.realised_mixture(steps)
    total_weight = sum(weights.values())
    if baseline is not None and profiles is None:
        profiles, _ = comparable_profiles(prepared, baseline)
    rows = []
    for name in prepared.sources:
        st = prepared.stats[name]
        requested = weights.get(name, 0.0) / total_weight
        row: dict[str, Any] = {
            "source": name,
            "documents": st["documents"],
            "eval_documents": st["eval_documents"],
            "tokens": st["tokens"],
            "empty_rate": st["empty_rate"],
            "duplicate_rate": st["duplicate_rate"],
            "non_ascii_ratio": st["non_ascii_ratio"],
            "doc_tokens_p50": st["doc_tokens"]["p50"],
            "doc_chars_p05": st["doc_chars"]["p05"],
            "doc_chars_p50": st["doc_chars"]["p50"],
            "doc_chars_p95": st["doc_chars"]["p95"],
            "requested_weight": round(requested, 6),
            "realised_weight": round(realised.get(name, 0.0), 6),
            "mixture_error": round(abs(realised.get(name, 0.0) - requested), 6),
            "js_divergence": math.nan,
            "length_shift": math.nan,
        }
        if baseline is not None and profiles is not None and name in profiles:
            base = baseline.stats[name]
            row["js_divergence"] = round(js_divergence(*profiles[name]), 6)
            row["length_shift"] = round(relative_shift(st["doc_chars"]["p50"], base["doc_chars"]["p50"]), 6)
            for q in ("p05", "p50", "p95"):
                row[f"baseline_doc_chars_{q}"] = base["doc_chars"][q]
        rows.append(row)
    return rows


def _validate_with_gx(rows: list[dict[str, Any]], rules: list[Rule]) -> list[tuple[Rule, bool, dict[str, float]]]:
    """Run the suite; return per rule: success and {source: observed} of the unexpected rows."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    # Lazy for speed (great_expectations alone takes ~2.6 s), and after the variable above.
    import great_expectations as gx
    import pandas as pd
    from great_expectations.data_context.types.base import ProgressBarsConfig

    frame = pd.DataFrame(rows)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    batch_definition = (
        context.data_sources.add_pandas("prepared_data")
        .add_dataframe_asset("per_source_stats")
        .add_batch_definition_whole_dataframe("all_sources")
    )
    suite = context.suites.add(gx.ExpectationSuite(name="data_checks"))
    for rule in rules:
        suite.add_expectation(gx.expectations.ExpectColumnValuesToBeBetween(
            column=rule.column, min_value=rule.low, max_value=rule.high, meta={"check": rule.check}))
    validation = context.validation_definitions.add(
        gx.ValidationDefinition(name="data_checks", data=batch_definition, suite=suite))
    result = validation.run(
        batch_parameters={"dataframe": frame},
        result_format={"result_format": "COMPLETE", "unexpected_index_column_names": ["source"]},
    )
    by_check = {r.expectation_config.meta["check"]: r for r in result.results}
    out = []
    for rule in rules:
        r = by_check[rule.check]
        unexpected = {item["source"]: float(item[rule.column]) for item in r.result.get("unexpected_index_list") or []}
        out.append((rule, bool(r.success), unexpected))
    return out


def _message(rule: Rule, source: str, observed: float, row: dict[str, Any], baseline: str | None) -> str:
    subject = f"{source}: {rule.words} is {_fmt(observed)}, expected {rule.expected()}"
    if rule.check == "token_drift":
        return (f"{source}: token distribution differs from baseline '{baseline}' (Jensen-Shannon divergence "
                f"{observed:.3f} bits, at most {_fmt(rule.high)} allowed); was the source replaced or re-filtered?")
    if rule.check == "length_drift":
        return (f"{source}: median document length moved from {_fmt(row.get('baseline_doc_chars_p50'))} to "
                f"{_fmt(row['doc_chars_p50'])} characters vs baseline '{baseline}' (shift {observed:.0%}, "
                f"at most {rule.high:.0%} allowed)")
    if rule.check == "mixture_error":
        return (f"{source}: realised mixture weight {row['realised_weight']:.3f} vs requested "
                f"{row['requested_weight']:.3f} (off by {observed:.3f}, at most {_fmt(rule.high)} allowed)")
    if rule.check == "held_out_documents":
        return f"{source}: no held-out documents, so it cannot be evaluated (add documents or raise eval_fraction)"
    return subject


def run_data_checks(
    spec: ExperimentSpec,
    prepared: Any,
    baseline: Any | None = None,
    out_dir: Path | None = None,
    baseline_name: str | None = None,
) -> DataCheckResult:
    """Validate `prepared` (a `validation.data.PreparedData`) for `spec`; write JSON, markdown, HTML."""
    notes = []
    profiles = None
    if baseline is not None:
        profiles, note = comparable_profiles(prepared, baseline)
        notes += [note] if note else []
    rows = source_rows(spec, prepared, baseline, profiles)
    rules = rules_for(spec.data.checks, baseline is not None)
    if baseline is not None and baseline_name is None:
        baseline_name = spec.hypothesis.baseline
    if baseline is not None:
        new = [r["source"] for r in rows if r["source"] not in baseline.stats]
        if new:
            notes.append(f"no baseline profile for {', '.join(new)} (new sources): drift not checked")
        if baseline.version == prepared.version:
            notes.append(f"same data version as baseline '{baseline_name}' ({prepared.version}): no drift possible")
    else:
        notes.append("no baseline data given: drift rules skipped")
    by_source = {r["source"]: r for r in rows}
    outcomes = []
    for rule, _success, unexpected in _validate_with_gx(rows, rules):
        for row in rows:
            value = row[rule.column]
            if isinstance(value, float) and math.isnan(value):
                continue
            source = row["source"]
            failed = source in unexpected
            observed = unexpected.get(source, float(value))
            outcomes.append(Outcome(rule.check, source, observed, rule.expected(), not failed,
                                    _message(rule, source, observed, by_source[source], baseline_name)))
    failed = sum(not o.passed for o in outcomes)
    result = DataCheckResult(
        experiment=spec.name, data_version=prepared.version, baseline=baseline_name,
        baseline_version=baseline.version if baseline is not None else None,
        success=failed == 0, total=len(outcomes), failed=failed, outcomes=outcomes, rows=rows, notes=notes,
    )
    result.markdown = render_markdown(result)
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "data_check.json").write_text(json.dumps(result.to_json(), indent=1, default=_json_default) + "\n")
        (out_dir / "data_check.md").write_text(result.markdown)
        (out_dir / "data_check.html").write_text(render_html(result))
    return result


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return str(value)


def render_markdown(result: DataCheckResult) -> str:
    """Compact: a status line, the failing expectations (observed vs expected), a per-source summary."""
    icon = "✅" if result.success else "❌"
    against = f" vs baseline `{result.baseline}`" if result.baseline else ""
    lines = [f"**Data checks {icon}** {result.total - result.failed}/{result.total} expectations met "
             f"(data `{result.data_version}`{against})", ""]
    failing = [o for o in result.outcomes if not o.passed]
    if failing:
        lines += ["| source | check | observed | expected | what it means |", "|---|---|---|---|---|"]
        lines += [f"| {o.source} | {o.check} | {_fmt(o.observed)} | {o.expected} | {o.message} |" for o in failing]
        lines.append("")
    lines += ["| source | docs | tokens | dup | empty | median len (tok) | weight req/real | JS vs base |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result.rows:
        js = "n/a" if math.isnan(r["js_divergence"]) else f"{r['js_divergence']:.3f}"
        lines.append(f"| {r['source']} | {r['documents']:,} | {r['tokens']:,} | {r['duplicate_rate']:.1%} | "
                     f"{r['empty_rate']:.1%} | {r['doc_tokens_p50']:.0f} | {r['requested_weight']:.2f}/"
                     f"{r['realised_weight']:.2f} | {js} |")
    lines += [""] + [f"_{n}_" for n in result.notes]
    return "\n".join(lines).rstrip() + "\n"


def render_html(result: DataCheckResult) -> str:
    e = html.escape
    rows = "".join(
        f"<tr class='{'ok' if o.passed else 'fail'}'><td>{e(o.source)}</td><td>{e(o.check)}</td>"
        f"<td>{e(_fmt(o.observed))}</td><td>{e(o.expected)}</td><td>{'pass' if o.passed else 'FAIL'}</td>"
        f"<td>{e(o.message)}</td></tr>"
        for o in result.outcomes
    )
    notes = "".join(f"<li>{e(n)}</li>" for n in result.notes)
    status = "passed" if result.success else f"failed ({result.failed} of {result.total})"
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Data checks</title><style>"
        "body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;padding:4px 8px}"
        "table{border-collapse:collapse}.fail{background:#fdd}.ok{background:#efe}</style></head><body>"
        f"<h1>Data checks: {e(result.experiment)} {e(status)}</h1>"
        f"<p>data version {e(result.data_version)}; baseline {e(str(result.baseline))} "
        f"({e(str(result.baseline_version))})</p><ul>{notes}</ul>"
        "<table><tr><th>source</th><th>check</th><th>observed</th><th>expected</th><th>status</th>"
        f"<th>meaning</th></tr>{rows}</table></body></html>\n"
    )
