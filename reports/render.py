"""Markdown for the sticky PR comment and the step summary (pure: `Report` in, text out).

What GitHub does with it decides the shape: the comment limit is 65,536 characters, so
the first screen (`reports.headline`: the verdict in words, the effect and its bound in one
sentence, cost against the approved plan, what merging does, links) always comes first and
the evidence sits in `<details>` sections (`reports.evidence` for the numbers) that are
shortened or dropped, by name and with a note saying so, when the text would not fit. Loss
curves are Mermaid `xychart-beta` blocks (mean and seed band), which GitHub renders inline
with no image hosting; the PNG versions travel with the report's files (the run artifact). User-written text (the hypothesis) is escaped: it must not
open HTML, break a table or ping people.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from statistics import fmean
from typing import TypeVar

from reports.markup import escape_text
from reports.records import RunRecord
from reports.report import ABSENT, Report

T = TypeVar("T")
GITHUB_COMMENT_LIMIT = 65_536
MAX_CHART_POINTS = 50
CHART_METRICS = ("train/loss", "eval/loss")
_MERMAID_BLOCK = re.compile(r"^```mermaid\n(.*?)^```$", re.S | re.M)


# --------------------------------------------------------------------------- small helpers


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
    """The comment's first screen (`reports.headline`): verdict in words, effect and bound in one
    sentence, hypothesis, reason, cost against the approved plan, what merging does, links."""
    from reports.headline import top_markdown

    return top_markdown(report)


def _way_words(way: str | None) -> str:
    return {"decrease": "lower is better", "increase": "higher is better"}.get(way or "", "+ = higher")


def seed_section(report: Report) -> str | None:
    """The test itself: one row per paired seed, the interval against the margin, the rule."""
    from reports.evidence import better_way, improvement, interval_chart, num, pct

    h, v = report.hypothesis, report.verdict
    m = report.comparison.metrics.get(h.metric)
    if m is None:
        return None
    imp = improvement(m, better_way(h.metric, report), report.comparison.confidence)
    level = f"{100 * (1 - h.alpha):.3g} %"
    rows = [f"| seed | baseline | candidate | improvement ({_way_words(imp.way)}) |", "|---:|---:|---:|---:|"]
    pairs = [p for p in report.comparison.pairs
             if h.metric in p.candidate.final_metrics and h.metric in p.baseline.final_metrics]
    for pair, better in zip(pairs, imp.per_seed or [None] * len(pairs), strict=False):
        rows.append(f"| {pair.seed if pair.seed is not None else '—'} | {num(pair.baseline.final_metrics[h.metric])} | "
                    f"{num(pair.candidate.final_metrics[h.metric])} | {pct(better)} |")
    effect = v.effect if v.effect is not None else imp.effect
    bounds = (f" (one-sided {level} bounds {pct(v.effect_ci[0])} … {pct(v.effect_ci[1])})" if v.effect_ci else "")
    rows.append(f"| **mean** (geometric) | {num(imp.baseline)} | {num(imp.candidate)} | **{pct(effect)}**{bounds} |")
    text = "\n".join(rows)
    chart = interval_chart(effect, v.effect_ci, h.min_effect, imp.per_seed, level=level)
    if chart:
        text += ("\n\nImprovement in percent: `●` the effect and `[━]` its bounds, `·` each seed, `▲` the "
                 "required margin; supported only when the whole interval is right of `▲`.\n\n```text\n" + chart + "\n```")
    if v.rule:
        text += (f"\n\n**Rule:** {escape_text(v.rule)}: supported only if the one-sided {level} lower bound of the "
                 "improvement clears the margin; refuted if the upper bound is below it (docs/verdicts.md).")
    return details(f"🔬 The test: `{escape_text(h.metric)}` per seed", text, open_=True)


def band_chart(report: Report, metric: str) -> str | None:
    """A Mermaid xychart: each side's mean over seeds and its min-max band (blue candidate, orange
    baseline, the band lighter; the text above the chart is the legend: xychart draws none)."""
    def spread(runs: Sequence[RunRecord]) -> dict[int, list[float]]:
        by_step: dict[int, list[float]] = {}
        for run in runs:
            for step, value in run.history.get(metric, []):
                by_step.setdefault(step, []).append(value)
        return by_step

    cand, base = spread(report.candidates), spread(report.baselines)
    steps = sorted(set(cand) & set(base)) if base else sorted(cand)
    if len(steps) < 3:
        return None
    picked = [s for s, _ in downsample([(s, s) for s in steps])]

    def series(by_step: dict[int, list[float]], how: Callable[[list[float]], float]) -> str:
        return ", ".join(mermaid_number(how(by_step[s])) for s in picked)

    def seeds(runs: Sequence[RunRecord]) -> int:
        return sum(1 for r in runs if r.history.get(metric))

    lines = [f'    line "{mermaid_title(report.experiment)}" [{series(cand, fmean)}]']
    colours = ["#1f77b4"]
    if base:
        lines.append(f'    line "{mermaid_title(report.baseline_name)}" [{series(base, fmean)}]')
        colours.append("#ff7f0e")
    for name, by_step, runs, light in ((report.experiment, cand, report.candidates, "#9ecae1"),
                                       (report.baseline_name, base, report.baselines, "#fdbe85")):
        if by_step and seeds(runs) > 1:  # a band needs two seeds
            lines += [f'    line "{mermaid_title(name)} min" [{series(by_step, min)}]',
                      f'    line "{mermaid_title(name)} max" [{series(by_step, max)}]']
            colours += [light, light]
    palette = ", ".join(colours)
    return (
        "```mermaid\n"
        f'%%{{init: {{"themeVariables": {{"xyChart": {{"plotColorPalette": "{palette}"}}}}}}}}%%\n'
        "xychart-beta\n"
        f'    title "{mermaid_title(f"{metric}: mean and min-max over seeds")}"\n'
        f'    x-axis "step" [{", ".join(str(s) for s in picked)}]\n'
        f'    y-axis "{mermaid_title(metric)}"\n' + "\n".join(lines) + "\n```\n"
    )


def curves_section(report: Report) -> str | None:
    metrics = list(dict.fromkeys([report.hypothesis.metric, *CHART_METRICS]))
    charts: list[str] = []
    sparse: list[str] = []
    for metric in metrics:
        if metric.startswith("perf/"):
            continue
        chart = band_chart(report, metric)
        if chart:
            charts.append(chart)
            continue
        steps = sorted({s for r in (*report.candidates, *report.baselines) for s, _ in r.history.get(metric, [])})
        if steps:
            sparse.append(f"`{escape_text(metric)}` was logged at {len(steps)} step{'s' if len(steps) != 1 else ''} "
                          f"({', '.join(str(s) for s in steps[:5])}{', …' if len(steps) > 5 else ''}): too few "
                          "points for a curve; its final values are in the test above.")
    diverged = [r for r in report.candidates if r.status == "diverged"]
    if diverged:  # the diverged seed's own curve: averaging it with healthy seeds would hide it
        alone = replace(report, candidates=tuple(diverged[:1]))
        chart = mermaid_chart(alone, "train/loss")
        if chart:
            charts.insert(0, chart.replace(f'title "{mermaid_title("train/loss: ")}',
                                           f'title "{mermaid_title(f"train/loss, diverged seed {diverged[0].seed}: ")}', 1))
    if not charts and not sparse:
        return None
    n_c, n_b = len(report.candidates), len(report.baselines)
    note = (f"**Blue**: candidate `{escape_text(report.experiment)}` ({n_c} seed{'s' if n_c != 1 else ''}); "
            f"**orange**: baseline `{escape_text(report.baseline_name)}` ({n_b} seed{'s' if n_b != 1 else ''}). "
            "Dark lines are the mean over seeds, the light pair around each is its lowest and highest seed "
            f"(at most {MAX_CHART_POINTS} points).")
    if report.plots:
        where = report.context.artifacts or "the report's files"
        note += (" The same as images (mean and shaded min-max band): " + ", ".join(f"`{p}`" for p in report.plots)
                 + f", in {where}.")
    body = "\n".join([note, "", *charts, *sparse])
    return details("📈 Curves: mean and seed spread", body, open_=True)


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


def _improvement_rows(report: Report, metrics: Sequence[str], *, noise: bool) -> list[str]:
    from reports.evidence import improvements, num, pct

    level = f"one-sided {100 * (1 - report.hypothesis.alpha):.3g} % bounds"
    rows = [f"| metric | better | baseline | candidate | improvement | {level} |"
            + (" beyond seed noise |" if noise else ""),
            "|---|---|---:|---:|---:|---:|" + ("---|" if noise else "")]
    for imp in improvements(report, metrics):
        name = f"`{escape_text(imp.metric)}`"
        if imp.metric in report.definitions:
            name += " ⚠️ defined differently (" + ", ".join(f"`{f}`" for f in report.definitions[imp.metric]) + ")"
        perf = imp.metric.startswith("perf/")
        if perf:
            name += " (machine-dependent)"
        interval = f"{pct(imp.interval[0])} … {pct(imp.interval[1])}" if imp.interval else "needs ≥ 2 seeds"
        if perf:
            interval = "— (not an effect)"
        row = (f"| {name} | {_way_words(imp.way).replace(' is better', '')} | {num(imp.baseline)} | "
               f"{num(imp.candidate)} | {pct(imp.effect)} | {interval} |")
        if noise:
            row += (" — |" if perf or not imp.interval else " yes |" if imp.beyond_noise else " no |")
        rows.append(row)
    return rows


def metrics_section(report: Report) -> str | None:
    """Exploratory metrics that moved beyond the seeds' own spread (interval excluding 0), in the
    comment's convention; the rest are named. Decides nothing."""
    from reports.evidence import improvements, outcome_metrics

    keys, _ = outcome_metrics(report)
    if not keys:
        return None
    imps = improvements(report, keys)
    beyond = [i.metric for i in imps if i.beyond_noise]
    within = [i.metric for i in imps if not i.beyond_noise]
    one_seed = all(i.interval is None for i in imps)
    if one_seed:
        text = "\n".join(_improvement_rows(report, keys, noise=False))
        text += "\n\n_One paired seed: no noise estimate, so none of these differences can be told from seed noise._"
        return details(f"Other metrics ({len(keys)}, exploratory)", text)
    if beyond:
        text = "\n".join(_improvement_rows(report, beyond, noise=False))
    else:
        text = "_None of the other metrics moved beyond the spread the seeds show._"
    if within:
        text += ("\n\nWithin seed noise (interval includes 0): " + ", ".join(f"`{escape_text(k)}`" for k in within)
                 + ". Every value is under All metrics.")
    text += ("\n\n_Exploratory: only the hypothesis metric is tested; these are not adjusted for multiplicity and "
             "decide nothing. Improvement is + when the metric moved its better way._")
    return details(f"Other metrics that moved beyond seed noise ({len(beyond)} of {len(keys)}, exploratory)", text,
                   open_=bool(beyond))


def all_metrics_section(report: Report) -> str | None:
    from reports.evidence import outcome_metrics

    if not report.comparison.metrics:
        return None
    keys, left_out = outcome_metrics(report)
    perf = [k for k, why in left_out.items() if k.startswith("perf/")]
    shown = [report.hypothesis.metric, *keys, *perf]
    text = "\n".join(_improvement_rows(report, shown, noise=True))
    hidden = {k: why for k, why in left_out.items() if k not in perf}
    if hidden:
        text += "\n\nLeft out: " + "; ".join(f"`{escape_text(k)}` ({why})" for k, why in hidden.items()) + "."
    if any(k in report.comparison.metrics for k in ("eval/loss", "eval/bpb")):
        text += ("\n\n_`eval/loss` and `eval/bpb` are pooled over every scored token of the data version's fixed "
                 "held-out set (not weighted by either side's mixture), so a mixture change does not change their "
                 "definition; `eval/<source>/…` are per source._")
    return details(f"All metrics ({len(shown)})", text)


def params_section(report: Report) -> str:
    if not report.params_diff:
        return details("Parameters changed (0)", "_Same resolved spec apart from cosmetic fields._")
    rows = ["| field | baseline | candidate |", "|---|---|---|"]
    def show(value: object) -> str:
        return escape_text(value if value == ABSENT else repr(value))

    rows += [f"| `{c.field}` | {show(c.baseline)} | {show(c.candidate)} |" for c in report.params_diff]
    return details(f"Parameters changed ({len(report.params_diff)})", "\n".join(rows))


def _checks(result: tuple[bool | None, tuple[str, ...]], counts: tuple[int | None, int | None] = (None, None)) -> str:
    passed, failed = result
    met, total = counts
    tally = f"{met}/{total} expectations met" if met is not None and total is not None else None
    if passed is None:
        return tally or "not recorded"
    if passed:
        return f"✅ {tally}" if tally else "✅ passed"
    return f"❌ {tally or 'failed'}: " + ", ".join(escape_text(f) for f in failed)


def checks_summary(report: Report) -> str:
    """`27/27 expectations met`, or what failed: the Data section's title."""
    d = report.data_diff
    met, total = d.candidate_counts
    if d.candidate_checks[0] is None:
        return "checks not recorded"
    if met is not None and total is not None:
        return f"{met}/{total} expectations met"
    return "checks passed" if d.candidate_checks[0] else "checks failed"


def _check_rows(rows: Sequence[dict[str, object]]) -> list[str]:
    def number(value: object, how: str) -> str:
        if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
            return "—"
        return format(value, how)

    out = ["| source | documents | tokens | duplicates | empty | weight asked / realised | drift vs baseline (JS) |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| `{escape_text(str(r.get('source', '?')))}` | {number(r.get('documents'), ',')} | "
                   f"{number(r.get('tokens'), ',')} | {number(r.get('duplicate_rate'), '.1%')} | "
                   f"{number(r.get('empty_rate'), '.1%')} | {number(r.get('requested_weight'), '.2f')} / "
                   f"{number(r.get('realised_weight'), '.2f')} | {number(r.get('js_divergence'), '.3f')} |")
    return out


def data_section(report: Report) -> str:
    d = report.data_diff
    against = f" (drift against `{escape_text(d.checks_against)}`)" if d.checks_against else ""
    lines = [
        f"Data version: baseline `{escape_text(d.baseline_version or 'unknown')}`, candidate "
        f"`{escape_text(d.candidate_version or 'unknown')}`{' (**changed**)' if d.version_changed else ' (same)'}.",
        f"Data checks: candidate {_checks(d.candidate_checks, d.candidate_counts)}{against}; "
        f"baseline {_checks(d.baseline_checks, d.baseline_counts)}.",
        "",
    ]
    if d.check_rows:
        lines += ["What the candidate's checks ran on:", "", *_check_rows(d.check_rows), ""]
    lines += [
        "| source | baseline weight | candidate weight | baseline realised | candidate realised |",
        "|---|---:|---:|---:|---:|",
    ]
    has_baseline = any(bw is not None for bw, _ in d.mixture.values())
    for source in sorted(set(d.mixture) | set(d.realised)):
        bw, cw = d.mixture.get(source, (None, None))
        br, cr = d.realised.get(source, (None, None))
        mark = " **changed**" if has_baseline and bw != cw else ""
        lines.append(f"| `{escape_text(source)}`{mark} | {fmt(bw, 3)} | {fmt(cw, 3)} | {fmt(br, 3)} | {fmt(cr, 3)} |")
    return details(f"Data ({escape_text(checks_summary(report))})", "\n".join(lines))


def cost_section(report: Report) -> str:
    from reports.headline import cost_line

    c, b = report.candidate_summary, report.baseline_summary
    rows = [
        cost_line(report),
        "",
        "| | baseline | candidate |",
        "|---|---:|---:|",
        f"| device-hours used / planned at launch | {fmt(b.device_hours)} / {fmt(b.estimate_device_hours)} | "
        f"{fmt(c.device_hours)} / {fmt(c.estimate_device_hours)} |",
        f"| tokens/s (median window, mean over seeds; machine-dependent) | {fmt(b.tokens_per_s)} | {fmt(c.tokens_per_s)} |",
        f"| MFU (median window, mean over seeds; machine-dependent) | "
        f"{fmt_pct(100 * b.mfu, False) if b.mfu is not None else '—'} | "
        f"{fmt_pct(100 * c.mfu, False) if c.mfu is not None else '—'} |",
        f"| peak memory GB (max) | {fmt(b.peak_mem_gb)} | {fmt(c.peak_mem_gb)} |",
        f"| parameters: total / active per token | {_params(b.parameters, b.active_parameters)} | "
        f"{_params(c.parameters, c.active_parameters)} |",
        "",
        "_Throughput and MFU measure the machine as much as the change (other work on a shared runner moves "
        "them by tens of per cent), so they are not effects of the change and get no interval._",
    ]
    return details("Cost and performance", "\n".join(rows))


def _params(total: int | None, active: int | None) -> str:
    """`124.44 M / 124.44 M`: MFU and the FLOPs behind it count the active ones."""
    from validation.plan.common import format_count

    if total is None:
        return "—"
    return f"{format_count(total)} / {format_count(active) if active is not None else '—'}"


def alerts_section(report: Report) -> str:
    """Alerts of both sides: an alert the baseline raised too (same kind, same seed) is not the change's doing."""
    sides = [("candidate", run, a) for run, a in report.alerts] + [("baseline", run, a) for run, a in report.baseline_alerts]
    if not sides:
        return details("Alerts (0)", "_Neither side raised an alert._")
    seed_of = {r.run_id: r.seed for r in (*report.candidates, *report.baselines)}
    kinds = {side: {(seed_of.get(run), a.kind) for s, run, a in sides if s == side} for side in ("candidate", "baseline")}
    rows = ["| side | seed | run | level | kind | step | message | on the other side too |",
            "|---|---:|---|---|---|---:|---|---|"]
    for side, run, a in sides:
        other = "baseline" if side == "candidate" else "candidate"
        both = "yes" if (seed_of.get(run), a.kind) in kinds[other] else "no"
        seed = seed_of.get(run)
        rows.append(f"| {side} | {seed if seed is not None else '—'} | `{escape_text(run)}` | {escape_text(a.level)} | "
                    f"{escape_text(a.kind)} | {a.step if a.step is not None else '—'} | {escape_text(a.message)} | {both} |")
    worst = min((a.level for _, _, a in sides), default="P2")
    shared = sum(1 for side, run, a in sides if side == "candidate" and (seed_of.get(run), a.kind) in kinds["baseline"])
    note = (f"\n\n_{shared} of the candidate's {len(report.alerts)} alert(s) also fired in the baseline on the same "
            "seed: those come with the setup, not the change._" if report.alerts and report.baseline_alerts else "")
    return details(f"⚠️ Alerts (candidate {len(report.alerts)}, baseline {len(report.baseline_alerts)}, worst "
                   f"{escape_text(worst)})", "\n".join(rows) + note)


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

    The first screen (`reports.headline`: verdict, effect sentence, cost, merge, links) always
    comes first; the evidence follows in `<details>` sections. Sections follow in
    order of importance; one too long for the space left keeps the first rows of its
    table, and one that cannot fit at all is left out. A note names what was shortened
    or left out (`build_report` then also writes the untruncated `report_full.md`).
    """
    assert max_chars >= 1000, "a comment limit below 1000 characters cannot hold a verdict"
    head = headline(report)
    sections = [
        ("The test", seed_section(report)),
        ("Curves", curves_section(report)),
        ("Downstream tasks", task_section(report)),
        ("Other metrics", metrics_section(report)),
        ("Alerts", alerts_section(report)),
        ("Data", data_section(report)),
        ("Parameters changed", params_section(report)),
        ("Cost and performance", cost_section(report)),
        ("All metrics", all_metrics_section(report)),
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
