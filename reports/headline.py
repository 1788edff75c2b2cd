"""The top of the comment: what a reviewer decides on in 30 seconds (pure: `Report` in, text out).

Everything above the first collapsed section, in this order:

1. the verdict in words (`Refuted`, not a failure icon: a refuted hypothesis is a result; ❌
   stays for a stage that failed, `render_status`);
2. one sentence with the effect and its bound in the stated direction, the convention of every
   effect in the comment (`reports.evidence`): "`eval/loss` improved 0.07 %, at most 0.65 % at
   95 % confidence, 3 % required";
3. the hypothesis, the reason, the cost against the plan approved at launch, what merging will do
   (and who can override it), then the commit, the time and the links.

`top_markdown` renders it for the sticky comment, `top_text` for a terminal (`pipeline demo`):
the same lines from the same values, the terminal one with plain URLs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from reports.evidence import num, pct
from reports.markup import escape_text
from reports.report import Report
from reports.verdict import pct_exact
from validation.spec import ALPHA_LIMIT  # above it, the headline shows `alpha_override`

WORDS = {"supported": "Supported", "refuted": "Refuted", "inconclusive": "Inconclusive", "identical": "Identical"}
OVERRIDE_LABEL = "promote-override"
"""`pipelines.trusted.promote.OVERRIDE_LABEL` (reports import nothing from pipelines; a test holds them equal)."""
OVER_PLAN = 1.2
"""Used more than this share of the approved plan: the cost line says so."""


@dataclass(frozen=True)
class Line:
    label: str
    markdown: str
    text: str
    """The same line for a terminal: no markdown, URLs written out."""


def _u(x: float) -> str:
    """An unsigned percentage (the sign is in the words around it)."""
    return pct(abs(x), signed=False)


def level_text(report: Report) -> str:
    return f"{100 * (1 - report.hypothesis.alpha):.3g} %"


def effect_sentence(report: Report) -> str | None:
    """"`eval/loss` improved 0.07 %, at most 0.65 % at 95 % confidence, 3 % required." (markdown
    with the metric in backticks); None when there is no paired effect (the reason says why)."""
    v, h = report.verdict, report.hypothesis
    if v.effect is None or not math.isfinite(v.effect):
        return None
    shown = pct(v.effect)
    moved = ("did not move (0.00 %)" if shown in ("0.00 %", "+0.00 %") else
             f"improved {_u(v.effect)}" if v.effect > 0 else f"worsened {_u(v.effect)}")
    need = f"{pct_exact(h.min_effect)} required"
    level = level_text(report)
    metric = f"`{h.metric}`"
    if v.effect_ci is None:
        if v.n_pairs == 1:
            return f"{metric} {moved} on the one paired seed (one seed gives no interval), {need}."
        return f"{metric} {moved} on every seed alike (no noise estimate, so no interval), {need}."
    low, high = v.effect_ci
    if v.outcome == "supported":
        bound = f"at least {_u(low)} at {level} confidence"
    elif high < 0:
        bound = f"worse by at least {_u(high)} at {level} confidence"
    elif v.outcome == "refuted":
        bound = f"at most {_u(high)} at {level} confidence"
    else:
        bound = f"somewhere between {pct(low)} and {pct(high)} at {level} confidence"
    return f"{metric} {moved}, {bound}, {need}."


def merge_line(report: Report) -> str:
    """What merging the pull request will do, and who can change that (pipelines.trusted.promote)."""
    outcome = report.verdict.outcome
    if outcome == "supported":
        return ("Merging promotes this model to `champion`, once its training is attested on the final head "
                "commit and that commit has the required approvals.")
    return (f"Merging does **not** promote the model (a {outcome} verdict does not). To promote it anyway, a "
            f"maintainer with write access other than the author adds the `{OVERRIDE_LABEL}` label after the "
            "final head's attested training started; the label is recorded with the promotion.")


def cost_line(report: Report) -> str:
    c, b = report.candidate_summary, report.baseline_summary
    if c.device_hours is None:
        return "Not recorded: the runs left no wall time."
    runs = f"{c.runs} run{'s' if c.runs != 1 else ''}"
    text = f"{num(c.device_hours)} device-hours for the candidate's {runs}"
    if c.estimate_device_hours:
        ratio = c.device_hours / c.estimate_device_hours
        text += (f", {100 * ratio:.0f} % of the {num(c.estimate_device_hours)} the approved plan estimated "
                 "(recorded at launch)")
        if ratio > OVER_PLAN:
            text += ": **over the plan**"
    elif c.device_hours == 0:
        text += " (reused runs: nothing spent)"
    else:
        text += "; these runs recorded no plan at launch, so there is no estimate to compare with"
    if b.device_hours is not None and report.baselines:
        text += f". Baseline: {num(b.device_hours)}"
        if b.estimate_device_hours:
            text += f" of {num(b.estimate_device_hours)} planned"
    return text + "."


def _link(label: str, url: str | None) -> tuple[str, str]:
    return (f"[{label}]({url})", f"{label}: {url}") if url else ("", "")


def links_line(report: Report) -> tuple[str, str]:
    ctx = report.context
    md: list[str] = []
    text: list[str] = []
    if ctx.commit:
        short = ctx.commit[:12]
        dirty = " (with uncommitted changes)" if ctx.dirty else ""
        md.append(f"commit `{short}`{dirty}")
        text.append(f"commit {short}{dirty}")
    if ctx.generated_at:
        md.append(ctx.generated_at)
        text.append(ctx.generated_at)
    runs = len(report.candidates) + len(report.baselines)
    for label, url in (("workflow run", ctx.workflow_url), (f"MLflow: compare the {runs} runs", ctx.compare_url)):
        m, t = _link(label, url)
        if m:
            md.append(m)
            text.append(t)
    if ctx.mlflow_hint:
        md.append(("" if ctx.compare_url else "MLflow: ") + ctx.mlflow_hint)
        text.append(("" if ctx.compare_url else "MLflow: ") + ctx.mlflow_hint.replace("`", ""))
    return " · ".join(md), " · ".join(text)


def _escape(text: str) -> str:
    return escape_text(text)


def _plain(markdown: str) -> str:
    return markdown.replace("**", "").replace("`", "")


def top_lines(report: Report) -> tuple[str, str | None, list[Line]]:
    """(title, effect sentence, the lines under it): the parts both renderings share."""
    v, h = report.verdict, report.hypothesis
    title = f"{WORDS.get(v.outcome, v.outcome)}: `{_escape(report.experiment)}` vs `{_escape(report.baseline_name)}`"
    arrow = "↓" if h.direction == "decrease" else "↑"
    goal = "lower" if h.direction == "decrease" else "higher"
    alpha = f"alpha {h.alpha:g}"
    if h.alpha > ALPHA_LIMIT:
        alpha += f" (**above the {ALPHA_LIMIT:g} limit**, override: {_escape(h.alpha_override) or 'none given'})"
    seeds = f"{h.seeds} paired seed{'s' if h.seeds != 1 else ''} planned"
    hypothesis = (f"{_escape(h.statement) or '(no statement)'} (`{h.metric}` {arrow} {goal} by at least "
                  f"{pct_exact(h.min_effect)}, {alpha}, {seeds})")
    lines = [
        Line("Hypothesis", hypothesis, _plain(hypothesis)),
        Line("Why", _escape(v.reason), _plain(_escape(v.reason))),
        Line("Cost", cost_line(report), _plain(cost_line(report))),
        Line("If merged", merge_line(report), _plain(merge_line(report))),
    ]
    md, text = links_line(report)
    if md:
        lines.append(Line("Where", md, text))
    return title, effect_sentence(report), lines


def cautions(report: Report) -> list[str]:
    """Callouts that change how to read the verdict (markdown lines, each a `> [!CAUTION]` block)."""
    out: list[str] = []
    if report.hypothesis_changes:
        out += ["> [!CAUTION]",
                f"> **Hypothesis changed after results:** {_escape('; '.join(report.hypothesis_changes))}. "
                "The verdict tests the hypothesis registered when training started.", ""]
    p0 = [(run, a) for run, a in report.alerts if a.level == "P0"]
    if p0:
        out += ["> [!CAUTION]"] + [
            f"> **{_escape(a.level)} {_escape(a.kind)}** in `{_escape(run)}`"
            f"{f' at step {a.step}' if a.step is not None else ''}: {_escape(a.message)}" for run, a in p0[:5]
        ] + [""]
    return out


def top_markdown(report: Report) -> str:
    """The comment's first screen (markdown, ends with a blank line)."""
    title, sentence, lines = top_lines(report)
    out = [f"## {title}", ""]
    out += cautions(report)
    if sentence:
        out += [f"**{sentence}**", ""]
    out += [f"- **{line.label}:** {line.markdown}" for line in lines] + [""]
    if report.exploratory is not None and report.added_seeds:
        e = report.exploratory
        bounds = f", one-sided bounds [{pct(e.effect_ci[0])}, {pct(e.effect_ci[1])}]" if e.effect_ci else ""
        decided = (f"the headline was decided on seeds {', '.join(str(s) for s in report.decided_seeds)} only"
                   if report.decided_seeds else "no seed here was registered for the headline")
        out += [f"**Seeds added after registration** ({', '.join(str(s) for s in report.added_seeds)}): exploratory "
                f"look over all {e.n_pairs} paired seeds, improvement {pct(e.effect)}{bounds}. It decides nothing "
                f"({decided}): the registered look spent all of alpha (see `reports/prereg.py`); a confirmatory "
                "answer is a new registration on fresh seeds.", ""]
    if report.registration_note:
        out += [f"_{_escape(report.registration_note)}_", ""]
    if report.warnings:
        out += [f"> [!WARNING]\n> {_escape(w)}\n" for w in report.warnings]
    return "\n".join(out).rstrip("\n") + "\n\n"


def top_text(report: Report) -> list[str]:
    """The same first screen for a terminal: plain lines, URLs written out."""
    _, sentence, lines = top_lines(report)
    v = report.verdict
    out = [f"{WORDS.get(v.outcome, v.outcome).upper()}: {report.experiment} vs {report.baseline_name}"]
    if sentence:
        out.append(_plain(sentence))
    width = max(len(line.label) for line in lines)
    out += [f"{line.label.lower():<{width}}  {line.text}" for line in lines]
    out += [f"warning     {_plain(_escape(w))}" for w in report.warnings]
    return out
