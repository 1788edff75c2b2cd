"""Markdown for the sticky PR comment and the step summary (pure: `Report` in, text out).

What GitHub does with it decides the shape: the comment limit is 65,536 characters, so
the headline, verdict and key table always come first and the rest sits in collapsible
`<details>` sections that are dropped, by name and with a note saying so, when the text
would not fit. Loss curves are Mermaid `xychart-beta` blocks, which GitHub renders
inline with no image hosting. User-written text (the hypothesis) is escaped: it must not
open HTML, break a table or ping people.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import TypeVar

from reports.records import RunRecord
from reports.report import ABSENT, Report
from reports.verdict import pct_exact
from validation.spec import ALPHA_LIMIT  # above it, the headline shows `alpha_override`

T = TypeVar("T")
GITHUB_COMMENT_LIMIT = 65_536
MAX_CHART_POINTS = 50
VERDICT_BADGES = {"supported": ("✅", "Supported"), "refuted": ("❌", "Refuted"), "inconclusive": ("🟡", "Inconclusive"),
                  "identical": ("⚪", "Identical")}

KEY_METRICS = ("eval/loss", "eval/bpb", "train/loss", "perf/tokens_per_s", "perf/mfu", "perf/peak_mem_gb")
CHART_METRICS = ("train/loss", "eval/loss")
_MERMAID_BLOCK = re.compile(r"^```mermaid\n(.*?)^```$", re.S | re.M)


# --------------------------------------------------------------------------- small helpers


def escape_text(text: str) -> str:
    """User text for markdown: no raw HTML, no table breaks, no @-mentions, one line."""
    text = html.escape(" ".join(str(text).split()), quote=False)
    return text.replace("|", "\\|").replace("@", "@\u200b").replace("`", "'")


def fmt(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "—"
    if abs(value) >= 1_000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def fmt_pct(value: float | None, signed: bool = True) -> str:
    if value is None:
        return "—"
    return f"{value:+.2f} %" if signed else f"{value:.2f} %"


def mermaid_number(value: float) -> str:
    """5 significant digits, never in exponent notation (the xychart grammar has none)."""
    text = f"{value:.5g}"
    if "e" in text:
        text = format(Decimal(text), "f")
    return text


def mermaid_title(text: str) -> str:
    """A quoted xychart title/label: no quotes, backticks, backslashes or newlines inside."""
    cleaned = re.sub(r'["`\\\r\n]+', "'", " ".join(str(text).split()))
    return cleaned[:80]


def mermaid_blocks(markdown: str) -> list[str]:
    """The source of every ```mermaid fenced block (for checks and tests)."""
    return [m.group(1) for m in _MERMAID_BLOCK.finditer(markdown)]


def details(summary: str, body: str, *, open_: bool = False) -> str:
    # A blank line after </summary> is what makes GitHub render the body as markdown.
    return f"<details{' open' if open_ else ''}>\n<summary>{summary}</summary>\n\n{body.strip()}\n\n</details>\n"


def downsample(points: Sequence[tuple[int, T]], limit: int = MAX_CHART_POINTS) -> list[tuple[int, T]]:
    """At most `limit` points, evenly spaced by index, first and last kept."""
    if len(points) <= limit:
        return list(points)
    last = len(points) - 1
    picks = sorted({round(i * last / (limit - 1)) for i in range(limit)})
    return [points[i] for i in picks]


def mean_history(runs: Sequence[RunRecord], metric: str) -> list[tuple[int, float]]:
    """Per-step mean over the runs that logged that step."""
    by_step: dict[int, list[float]] = {}
    for run in runs:
        for step, value in run.history.get(metric, []):
            by_step.setdefault(step, []).append(value)
    return [(step, sum(v) / len(v)) for step, v in sorted(by_step.items())]


def _interpolate(points: Sequence[tuple[int, float]], step: int) -> float:
    for (s0, v0), (s1, v1) in zip(points, points[1:], strict=False):
        if s0 <= step <= s1:
            return v0 if s1 == s0 else v0 + (v1 - v0) * (step - s0) / (s1 - s0)
    return points[-1][1] if step >= points[-1][0] else points[0][1]


def aligned_curves(cand: Sequence[tuple[int, float]], base: Sequence[tuple[int, float]]) -> list[tuple[int, float, float]]:
    """(step, candidate, baseline) on shared x values: the common steps, or else the
    candidate's steps inside the baseline's range with the baseline interpolated."""
    base_at = dict(base)
    common = [(s, v, base_at[s]) for s, v in cand if s in base_at]
    if len(common) >= 2 or not base:
        return common
    return [(s, v, _interpolate(base, s)) for s, v in cand if base[0][0] <= s <= base[-1][0]]


def mermaid_chart(report: Report, metric: str) -> str | None:
    """An xychart-beta with the candidate (1st line) and baseline (2nd line) mean curves."""
    rows = aligned_curves(mean_history(report.candidates, metric), mean_history(report.baselines, metric))
    if len(rows) < 2:
        return None
    picked = downsample([(s, (c, b)) for s, c, b in rows])
    steps = ", ".join(str(s) for s, _ in picked)
    cand = ", ".join(mermaid_number(c) for _, (c, _) in picked)
    base = ", ".join(mermaid_number(b) for _, (_, b) in picked)
    title = mermaid_title(f"{metric}: {report.experiment} vs {report.baseline_name}")
    return (
        "```mermaid\nxychart-beta\n"
        f'    title "{title}"\n'
        f'    x-axis "step" [{steps}]\n'
        f'    y-axis "{mermaid_title(metric)}"\n'
        f'    line "{mermaid_title(report.experiment)}" [{cand}]\n'
        f'    line "{mermaid_title(report.baseline_name)}" [{base}]\n'
        "```\n"
    )


def _run_link(run: RunRecord, mlflow_url: str | None) -> str:
    label = f"`{escape_text(run.run_id)}`"
    url = run.mlflow_url or (f"{mlflow_url.rstrip('/')}/#/runs/{run.mlflow_run_id}" if mlflow_url and run.mlflow_run_id else None)
    return f"[{label}]({url})" if url else label


# --------------------------------------------------------------------------- sections


def headline(report: Report) -> str:
    v, h = report.verdict, report.hypothesis
    emoji, word = VERDICT_BADGES[v.outcome]
    arrow = "↓" if h.direction == "decrease" else "↑"
    alpha = f"alpha {h.alpha:g}"
    if h.alpha > ALPHA_LIMIT:
        alpha += f" (**above the {ALPHA_LIMIT:g} limit**, override: {escape_text(h.alpha_override) or 'none given'})"
    lines = [
        f"## {emoji} {word}: `{escape_text(report.experiment)}` vs `{escape_text(report.baseline_name)}`",
        "",
    ]
    if report.hypothesis_changes:
        lines += [
            "> [!CAUTION]",
            f"> **Hypothesis changed after results:** {escape_text('; '.join(report.hypothesis_changes))}. "
            "The verdict tests the hypothesis registered when training started.",
            "",
        ]
    p0 = [(run, a) for run, a in report.alerts if a.level == "P0"]
    if p0:
        lines += ["> [!CAUTION]"] + [
            f"> **{escape_text(a.level)} {escape_text(a.kind)}** in `{escape_text(run)}`"
            f"{f' at step {a.step}' if a.step is not None else ''}: {escape_text(a.message)}" for run, a in p0[:5]
        ] + [""]
    lines += [
        f"> **Hypothesis:** {escape_text(h.statement) or '(no statement)'}",
        f"> `{h.metric}` {arrow} {h.direction} by at least {pct_exact(h.min_effect)} "
        f"· {alpha} · {h.seeds} seed{'s' if h.seeds != 1 else ''} planned",
        "",
        f"**Verdict:** {escape_text(v.reason)}",
        "",
    ]
    if v.rule:
        lines += [f"**Rule:** {escape_text(v.rule)}: supported only if the one-sided {100 * (1 - h.alpha):.3g} % lower bound "
                  "of the effect clears min_effect; refuted if the upper bound is below it.", ""]
    if report.exploratory is not None and report.added_seeds:
        e = report.exploratory
        bounds = (f", one-sided bounds [{e.effect_ci[0]:+.2%}, {e.effect_ci[1]:+.2%}]" if e.effect_ci else "")
        effect = f"{e.effect:+.2%}" if e.effect is not None else "—"
        decided = (f"the headline was decided on seeds {', '.join(str(s) for s in report.decided_seeds)} only"
                   if report.decided_seeds else "no seed here was registered for the headline")
        lines += [
            f"**Seeds added after registration** ({', '.join(str(s) for s in report.added_seeds)}): exploratory look "
            f"over all {e.n_pairs} paired seeds, effect {effect}{bounds}. It decides nothing ({decided}): the "
            "registered look spent all of alpha (see `reports/prereg.py`); a confirmatory answer is a new "
            "registration on fresh seeds.",
            "",
        ]
    if report.registration_note:
        lines += [f"_{escape_text(report.registration_note)}_", ""]
    return "\n".join(lines) + "\n"


def metric_table(report: Report, metrics: Sequence[str]) -> str:
    level = f"{100 * report.comparison.confidence:.3g} %"
    rows = [f"| metric | baseline | candidate | Δ | Δ % (geometric mean over seeds) | {level} CI of Δ % | seeds |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for key in metrics:
        m = report.comparison.metrics.get(key)
        if m is None:
            continue
        ci = m.ci_pct
        name = f"**`{key}`**" if key == report.hypothesis.metric else f"`{key}` (exploratory)"
        if key in report.definitions:
            name += " ⚠️ defined differently (" + ", ".join(f"`{f}`" for f in report.definitions[key]) + ")"
        rows.append(
            f"| {name} | {fmt(m.baseline)} | {fmt(m.candidate)} | {fmt(m.delta)} | {fmt_pct(m.delta_pct)} | "
            f"{f'[{fmt_pct(ci[0])}, {fmt_pct(ci[1])}]' if ci else 'needs ≥ 2 seeds'} | {m.n} |")
    if any(k != report.hypothesis.metric for k in metrics if k in report.comparison.metrics):
        rows.append("")
        rows.append(f"_Intervals are {level} (their ends are the verdict's one-sided {100 * (1 - report.hypothesis.alpha):.3g} % "
                    "bounds). Only the bold hypothesis metric is tested; the others are exploratory, not adjusted "
                    "for multiplicity, and decide nothing._")
    return "\n".join(rows) + "\n"


def key_section(report: Report) -> str:
    per_source = sorted(k for k in report.comparison.metrics if k.count("/") == 2 and k.startswith("eval/"))
    keys = list(dict.fromkeys([report.hypothesis.metric, *KEY_METRICS, *per_source]))
    text = metric_table(report, keys) if report.comparison.metrics else "_No metric could be compared._\n"
    if any(k in report.comparison.metrics for k in ("eval/loss", "eval/bpb")):
        text += ("\n_`eval/loss` and `eval/bpb` are pooled over every scored token of the data version's fixed "
                 "held-out set (not weighted by either side's mixture), so a mixture change does not change "
                 "their definition; `eval/<source>/…` are per source; bits per byte count the bytes of exactly "
                 "the scored tokens._\n")
    if report.warnings:
        text += "\n" + "\n".join(f"> [!WARNING]\n> {escape_text(w)}\n" for w in report.warnings)
    return text


def curves_section(report: Report) -> str | None:
    metrics = list(dict.fromkeys([report.hypothesis.metric, *CHART_METRICS]))
    charts = [c for c in (mermaid_chart(report, m) for m in metrics if not m.startswith("perf/")) if c]
    diverged = [r for r in report.candidates if r.status == "diverged"]
    if diverged:  # the diverged seed's own curve: averaging it with healthy seeds would hide it
        alone = replace(report, candidates=tuple(diverged[:1]))
        chart = mermaid_chart(alone, "train/loss")
        if chart:
            charts.insert(0, chart.replace(f'title "{mermaid_title("train/loss: ")}',
                                           f'title "{mermaid_title(f"train/loss, diverged seed {diverged[0].seed}: ")}', 1))
    if not charts:
        return None
    note = (f"First line: candidate `{report.experiment}`; second line: baseline `{report.baseline_name}` "
            f"(mean over seeds, at most {MAX_CHART_POINTS} points).")
    if report.plots:
        note += " PNG plots: " + ", ".join(f"`{p}`" for p in report.plots) + " (run artifacts)."
    return details("📈 Curves", note + "\n\n" + "\n".join(charts), open_=True)


def _task_cell(records: Sequence[RunRecord], key: str) -> str:
    """Mean over seeds of a task metric, ± its mean lm-eval stderr, with the examples scored."""
    values = [r.final_metrics[key] for r in records if key in r.final_metrics]
    if not values:
        return "—"
    stderrs = [r.final_metrics[f"{key}_stderr"] for r in records if f"{key}_stderr" in r.final_metrics]
    counts = [r.final_metrics[key.rsplit("/", 1)[0] + "/n"] for r in records
              if key.rsplit("/", 1)[0] + "/n" in r.final_metrics]
    text = fmt(sum(values) / len(values))
    if stderrs:
        text += f" ± {fmt(sum(stderrs) / len(stderrs), 2)}"
    if counts:
        text += f" (n {int(min(counts))})"
    return text


def task_section(report: Report) -> str | None:
    """Downstream tasks (lm-eval): value ± stderr (n examples) on each side, mean over seeds."""
    from validation.eval_tasks import TASK_METRIC, better_direction

    keys = sorted({k for r in (*report.candidates, *report.baselines) for k in r.final_metrics
                   if (m := TASK_METRIC.match(k)) and m["metric"] != "n" and not m["metric"].endswith("_stderr")})
    if not keys:
        return None
    rows = ["| task | metric | better | baseline | candidate |", "|---|---|---|---:|---:|"]
    for key in keys:
        m = TASK_METRIC.match(key)
        assert m is not None
        name = f"**`{m['metric']}`**" if key == report.hypothesis.metric else f"`{m['metric']}`"
        better = "higher" if better_direction(key) == "increase" else "lower"
        rows.append(f"| `{m['task']}` | {name} | {better} | {_task_cell(report.baselines, key)} | "
                    f"{_task_cell(report.candidates, key)} |")
    note = ("_lm-evaluation-harness on the exported model (one process), mean over seeds; ± is lm-eval's "
            "standard error of one run (for acc, sqrt(p(1 - p) / (n - 1))), n the examples scored. Per-example results: "
            "`RUN/downstream/samples_<task>.jsonl`._")
    return details(f"Downstream tasks ({len(keys)})", "\n".join(rows) + "\n\n" + note, open_=True)


def all_metrics_section(report: Report) -> str | None:
    if not report.comparison.metrics:
        return None
    return details(f"All metrics ({len(report.comparison.metrics)})", metric_table(report, list(report.comparison.metrics)))


def params_section(report: Report) -> str:
    if not report.params_diff:
        return details("Parameters changed (0)", "_Same resolved spec apart from cosmetic fields._")
    rows = ["| field | baseline | candidate |", "|---|---|---|"]
    def show(value: object) -> str:
        return escape_text(value if value == ABSENT else repr(value))

    rows += [f"| `{c.field}` | {show(c.baseline)} | {show(c.candidate)} |" for c in report.params_diff]
    return details(f"Parameters changed ({len(report.params_diff)})", "\n".join(rows))


def _checks(result: tuple[bool | None, tuple[str, ...]]) -> str:
    passed, failed = result
    if passed is None:
        return "not recorded"
    return "✅ passed" if passed else "❌ failed: " + ", ".join(escape_text(f) for f in failed)


def data_section(report: Report) -> str:
    d = report.data_diff
    lines = [
        f"Data version: baseline `{escape_text(d.baseline_version or 'unknown')}`, candidate "
        f"`{escape_text(d.candidate_version or 'unknown')}`{' (**changed**)' if d.version_changed else ' (same)'}.",
        f"Data checks: baseline {_checks(d.baseline_checks)}; candidate {_checks(d.candidate_checks)}.",
        "",
        "| source | baseline weight | candidate weight | baseline realised | candidate realised |",
        "|---|---:|---:|---:|---:|",
    ]
    has_baseline = any(bw is not None for bw, _ in d.mixture.values())
    for source in sorted(set(d.mixture) | set(d.realised)):
        bw, cw = d.mixture.get(source, (None, None))
        br, cr = d.realised.get(source, (None, None))
        mark = " **changed**" if has_baseline and bw != cw else ""
        lines.append(f"| `{escape_text(source)}`{mark} | {fmt(bw, 3)} | {fmt(cw, 3)} | {fmt(br, 3)} | {fmt(cr, 3)} |")
    return details("Data", "\n".join(lines))


def cost_section(report: Report) -> str:
    c, b = report.candidate_summary, report.baseline_summary
    over = ""
    if c.device_hours is not None and c.estimate_device_hours:
        ratio = c.device_hours / c.estimate_device_hours
        share = f"{ratio:.1f}x" if ratio >= 10 else f"{ratio:.0%} of"
        over = f" ({share} the estimate{', **over the estimate**' if ratio > 1 else ''})"
    rows = [
        f"Candidate used {fmt(c.device_hours)} device-hours over {c.runs} run(s), "
        f"estimate {fmt(c.estimate_device_hours)}{over}. Baseline: {fmt(b.device_hours)} device-hours.",
        "",
        "| | baseline | candidate |",
        "|---|---:|---:|",
        f"| tokens/s (median window, mean over seeds) | {fmt(b.tokens_per_s)} | {fmt(c.tokens_per_s)} |",
        f"| MFU (median window, mean over seeds) | {fmt_pct(100 * b.mfu, False) if b.mfu is not None else '—'} | "
        f"{fmt_pct(100 * c.mfu, False) if c.mfu is not None else '—'} |",
        f"| peak memory GB (max) | {fmt(b.peak_mem_gb)} | {fmt(c.peak_mem_gb)} |",
        f"| parameters: total / active per token | {_params(b.parameters, b.active_parameters)} | "
        f"{_params(c.parameters, c.active_parameters)} |",
    ]
    return details("Cost and performance", "\n".join(rows))


def _params(total: int | None, active: int | None) -> str:
    """`124.44 M / 124.44 M`: MFU and the FLOPs behind it count the active ones."""
    from validation.plan.common import format_count

    if total is None:
        return "—"
    return f"{format_count(total)} / {format_count(active) if active is not None else '—'}"


def alerts_section(report: Report) -> str:
    if not report.alerts:
        return details("Alerts (0)", "_The candidate runs raised no alerts._")
    rows = ["| run | level | kind | step | message |", "|---|---|---|---:|---|"]
    rows += [f"| `{escape_text(run)}` | {escape_text(a.level)} | {escape_text(a.kind)} | {a.step if a.step is not None else '—'} | "
             f"{escape_text(a.message)} |" for run, a in report.alerts]
    worst = min((a.level for _, a in report.alerts), default="P2")
    return details(f"⚠️ Alerts ({len(report.alerts)}, worst {escape_text(worst)})", "\n".join(rows))


def runs_section(report: Report, mlflow_url: str | None) -> str:
    rows = ["| side | seed | run | status | data version | trainer |", "|---|---:|---|---|---|---|"]
    for side, runs in (("candidate", report.candidates), ("baseline", report.baselines)):
        for r in runs:
            rows.append(f"| {side} | {r.seed if r.seed is not None else '—'} | {_run_link(r, mlflow_url)} | {escape_text(r.status)} | "
                        f"`{escape_text(r.data.version or '—')}` | `{escape_text(r.trainer_version or '—')}` |")
    # Run events that change how to read a curve (a continuation on another layout).
    rows += [""] + [f"- `{escape_text(run)}` {escape_text(a.message)}" for run, a in report.alerts
                    if a.kind == "resharded"]
    return details(f"Runs ({len(report.candidates)} candidate, {len(report.baselines)} baseline)", "\n".join(rows).rstrip())


# --------------------------------------------------------------------------- assembly


FULL_REPORT_NAME = "report_full.md"


def shorten_table_section(text: str, room: int) -> tuple[str, int, int] | None:
    """The section with the tail rows of its table dropped so it fits in `room` characters.

    Returns (text, rows kept, rows total), or None when not even one row fits. A line
    after the table says how many rows were left out (after a blank line, or GFM would
    read it as one more row).
    """
    lines = text.split("\n")
    table = [i for i, line in enumerate(lines) if line.startswith("|")]
    if len(table) < 3:
        return None
    first, last = table[2], table[-1]
    total = last - first + 1

    def build(keep: int) -> str:
        note = f"\n_… {total - keep:,} more rows left out to fit the comment limit._"
        return "\n".join(lines[: first + keep] + [note] + lines[last + 1:])

    best = None
    low, high = 1, total - 1
    while low <= high:  # the most rows that still fit
        mid = (low + high) // 2
        candidate = build(mid)
        if len(candidate) <= room:
            best, low = (candidate, mid, total), mid + 1
        else:
            high = mid - 1
    return best


def is_truncated(markdown: str) -> bool:
    return "✂️ Report truncated" in markdown


def render_markdown(report: Report, *, mlflow_url: str | None = None, max_chars: int = GITHUB_COMMENT_LIMIT) -> str:
    """The whole comment, under `max_chars`.

    Headline, hypothesis, verdict and key table always come first. Sections follow in
    order of importance; one too long for the space left keeps the first rows of its
    table, and one that cannot fit at all is left out. A note names what was shortened
    or left out (`build_report` then also writes the untruncated `report_full.md`).
    """
    assert max_chars >= 1000, "a comment limit below 1000 characters cannot hold a verdict"
    head = headline(report) + key_section(report)
    sections = [
        ("Downstream tasks", task_section(report)),
        ("Curves", curves_section(report)),
        ("All metrics", all_metrics_section(report)),
        ("Parameters changed", params_section(report)),
        ("Data", data_section(report)),
        ("Cost and performance", cost_section(report)),
        ("Alerts", alerts_section(report)),
        ("Runs", runs_section(report, mlflow_url)),
    ]
    footer = "\n<sub>Generated by `pipeline report`. The full report is in the run's `report/` artifacts.</sub>\n"
    note_reserve = 600  # room for the truncation note itself
    budget = max_chars - len(footer) - note_reserve
    shortened: list[str] = []
    omitted: list[str] = []
    if len(head) > budget:  # only a huge key table can do this; cut it at a line
        head = head[: head.rfind("\n", 0, budget) + 1] + "\n"
        shortened.append("the key table")
        omitted += [name for name, text in sections if text]
        sections = []
    present = [(name, text) for name, text in sections if text]
    # Water-filling: smallest sections first, each whole if it fits in an equal share of
    # what is left; the big ones (long tables) share the rest and are shortened to fit.
    fitted_text: dict[str, str] = {}
    remaining = budget - len(head)
    by_size = sorted(present, key=lambda item: len(item[1]))
    for i, (name, text) in enumerate(by_size):
        share = remaining // (len(by_size) - i)
        if len(text) + 1 <= share:
            fitted_text[name] = text
        else:
            fitted = shorten_table_section(text, share - 1)
            if fitted is None:
                continue
            fitted_text[name], kept, total = fitted
            shortened.append(f"{name} (first {kept:,} of {total:,} rows)")
        remaining -= len(fitted_text[name]) + 1
    out = [head]
    for name, _ in present:
        if name in fitted_text:
            out.append("\n" + fitted_text[name])
        else:
            omitted.append(name)
    if shortened or omitted:
        parts = []
        if shortened:
            parts.append("shortened: " + ", ".join(shortened))
        if omitted:
            parts.append("left out: " + ", ".join(omitted))
        out.append(
            f"\n> [!NOTE]\n> ✂️ Report truncated to fit GitHub's {max_chars:,}-character comment limit; "
            f"{'; '.join(parts)}. The untruncated report is `{FULL_REPORT_NAME}` in the run's report artifacts.\n")
    text = "".join(out) + footer
    assert len(text) <= max_chars, (len(text), max_chars)
    return text


# --------------------------------------------------------------------------- earlier stages

STAGES = (
    # key, short name for the checklist, headline once the stage is reached
    ("validated", "Validate", "Spec validated"),
    ("plan", "Plan", "Plan ready"),
    ("data_checked", "Data check", "Data checked"),
    ("smoke_passed", "Smoke", "Smoke run passed"),
    ("awaiting_train", "`/train`", "Awaiting `/train`"),
    ("training", "Training", "Training"),
    ("report", "Report", "Report ready"),
)
_STAGE_NAMES = [key for key, _, _ in STAGES]


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def render_status(
    stage: str,
    *,
    experiment: str,
    detail: str | None = None,
    body: str | None = None,
    failed: bool = False,
    step: int | None = None,
    total_steps: int | None = None,
    eta_s: float | None = None,
    loss: float | None = None,
    url: str | None = None,
) -> str:
    """A short status for the sticky comment before the report exists.

    `stage` is one of STAGES' keys (the latest reached); `failed=True` marks it as the
    stage that failed. `detail` is plain text (escaped); `body` is markdown the pipeline
    generated itself (e.g. the plan table), shown in a collapsible section.
    """
    assert stage in _STAGE_NAMES, f"unknown stage {stage!r}"
    index = _STAGE_NAMES.index(stage)
    marks = []
    for i, (key, short, _) in enumerate(STAGES):
        if i < index:
            mark = "✅"
        elif i > index:
            mark = "⬜"
        else:
            mark = "❌" if failed else {"training": "🔄", "awaiting_train": "⏳"}.get(key, "✅")
        marks.append(f"{mark} {short}")
    _, short, reached = STAGES[index]
    if failed:
        icon, title = "❌", f"{short} failed"
    else:
        icon, title = ("⏳" if stage in ("training", "awaiting_train") else "✅"), reached
    lines = [f"## {icon} `{escape_text(experiment)}`: {title}", "", " → ".join(marks), ""]
    if stage == "training" and not failed:
        progress = f"Step {step if step is not None else '?'}"
        if step is not None and total_steps:
            progress += f" / {total_steps} ({100 * step / total_steps:.0f} %)"
        if eta_s is not None:
            progress += f", ETA {_duration(eta_s)}"
        if loss is not None:
            progress += f", loss {fmt(loss)}"
        lines += [progress + ".", ""]
    if stage == "awaiting_train" and not failed:
        lines += ["A maintainer can start training with a `/train` comment.", ""]
    if detail:
        lines += [escape_text(detail), ""]
    if body:
        lines += [details("Details", body)]
    if url:
        lines += [f"[Logs and details]({url})", ""]
    return "\n".join(lines)


def write_step_summary(markdown: str, env: dict[str, str] | None = None) -> Path | None:
    """Appends to `$GITHUB_STEP_SUMMARY` when set (GitHub Actions); returns the path used."""
    target = (env if env is not None else os.environ).get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(markdown if markdown.endswith("\n") else markdown + "\n")
    return path
