"""`build_report`: run directories (or records) in, `report/{report.md, result.json, *.png}` out.

The one adapter-level entry point the orchestrator and `pipeline report` call. It reads
the runs, builds the pure `Report`, renders it, saves plots, optionally logs the files
to MLflow, appends to `$GITHUB_STEP_SUMMARY` when present, and writes `result.json`
last: the report directory's commit marker.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from basics.errors import UsageError
from reports.records import RunRecord, record_from_run_dir
from reports.render import (
    FULL_REPORT_NAME,
    GITHUB_COMMENT_LIMIT,
    is_truncated,
    render_markdown,
    write_step_summary,
)
from reports.report import Report, ReportContext, make_report
from reports.verdict import Verdict


@dataclass(frozen=True)
class BuiltReport:
    report: Report
    markdown: str
    out_dir: Path
    files: tuple[Path, ...]

    @property
    def verdict(self) -> Verdict:
        return self.report.verdict


def load_hypothesis(spec_path: str | Path) -> dict[str, Any]:
    """The hypothesis section of an experiment YAML or a resolved spec JSON."""
    path = Path(spec_path)
    if not path.is_file():
        raise UsageError(f"{path}: no such spec file")
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}: not valid JSON ({exc.msg})") from exc
        from validation.resolved import spec_section  # a resolved experiment or a bare spec

        data = spec_section(data)
        hypothesis = data.get("hypothesis") if isinstance(data, dict) else None
        if not isinstance(hypothesis, dict):
            raise UsageError(f"{path}: has no hypothesis section")
        return hypothesis
    try:
        from validation.loader import load_spec
    except ImportError:  # the loader may not exist yet; plain YAML without `extends`
        import yaml

        from validation.spec import ExperimentSpec

        try:
            spec = ExperimentSpec.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
        except Exception as exc:  # pydantic/yaml errors: the user's file
            raise UsageError(f"{path}: invalid experiment spec: {str(exc).splitlines()[0]}") from exc
    else:
        spec = load_spec(path)
    return spec.hypothesis.model_dump(mode="json")


def _fetched_run(seed_dir: Path) -> str | None:
    """The MLflow run a seed directory was fetched from (`fetched_from.json`), None if trained here."""
    try:
        data = json.loads((seed_dir / "fetched_from.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data.get("mlflow_run_id") if isinstance(data, dict) else None


def _records(items: Sequence[RunRecord | str | Path]) -> list[RunRecord]:
    return [item if isinstance(item, RunRecord) else record_from_run_dir(item) for item in items]


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


SUMMARY_NAME = "summary.txt"
"""The comment's first screen and the test, for a terminal (`pipeline demo` prints it)."""


def compare_url(base_url: str, runs: Sequence[tuple[str, str]]) -> str:
    """MLflow's compare view of `runs` ((experiment id, run id) pairs), as its UI links it
    (`/#/compare-runs?runs=[...]&experiments=[...]`, JSON lists, percent-encoded)."""
    from urllib.parse import quote

    run_ids = list(dict.fromkeys(r for _, r in runs))
    experiments = sorted(set(e for e, _ in runs))

    def as_json(items: list[str]) -> str:
        return quote(json.dumps(items, separators=(",", ":")), safe="")

    return f"{base_url.rstrip('/')}/#/compare-runs?runs={as_json(run_ids)}&experiments={as_json(experiments)}"


def _compare_link(report: Report, mlflow_url: str | None, client: Any) -> str | None:
    """The compare view of every run of the report, when MLflow has a URL and knows each run's
    experiment (asked of the client: result.json keeps the run ids, not their experiments)."""
    ids = [r.mlflow_run_id for r in (*report.candidates, *report.baselines) if r.mlflow_run_id]
    if not mlflow_url or client is None or not ids:
        return None
    pairs = []
    try:
        for run_id in dict.fromkeys(ids):
            pairs.append((str(client.get_run(run_id).info.experiment_id), run_id))
    except Exception:  # noqa: BLE001 - a link is context: MLflow down or a run gone means no link
        return None
    return compare_url(mlflow_url, pairs)


LOCAL_MLFLOW_UI = "http://127.0.0.1:5000"
"""Where `mlflow ui` serves a local store by default."""


def _tracking_uri(client: Any) -> str | None:
    uri = getattr(getattr(client, "_tracking_client", None), "tracking_uri", None)
    return uri if isinstance(uri, str) else None


def workflow_run_url(env: dict[str, str]) -> str | None:
    """The GitHub Actions run this report is made in (None elsewhere)."""
    server, repo, run = (env.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    if server and repo and run and run.isdigit():
        return f"{server.rstrip('/')}/{repo}/actions/runs/{run}"
    return None


def summary_text(report: Report) -> str:
    """The first screen for a terminal, then the per-seed test and its chart (plain text)."""
    from reports.evidence import better_way, improvement, interval_chart, num, pct
    from reports.headline import level_text, top_text

    lines = top_text(report)
    h, v = report.hypothesis, report.verdict
    m = report.comparison.metrics.get(h.metric)
    if m is not None:
        imp = improvement(m, better_way(h.metric, report), report.comparison.confidence)
        way = "lower" if imp.way == "decrease" else "higher"
        lines += ["", f"per seed ({h.metric}; improvement: + = {way})"]
        lines += [f"  seed {p.seed}: baseline {num(p.baseline.final_metrics.get(h.metric))}, candidate "
                  f"{num(p.candidate.final_metrics.get(h.metric))}, improvement {pct(x)}"
                  for p, x in zip(report.comparison.pairs, imp.per_seed, strict=False)]
        chart = interval_chart(v.effect, v.effect_ci, h.min_effect, imp.per_seed, level=level_text(report))
        if chart:
            lines += ["", chart]
    return "\n".join(lines) + "\n"


def report_result(report: Report, markdown: str, plots: Sequence[str]) -> dict[str, Any]:
    """The machine-readable report (what promotion gates and the comment workflow read)."""
    v = report.verdict
    result: dict[str, Any] = _jsonable({
        "experiment": report.experiment,
        "baseline": report.baseline_name,
        "hypothesis": asdict(report.hypothesis),
        "verdict": {
            "outcome": v.outcome, "reason": v.reason, "metric": v.metric, "n_pairs": v.n_pairs,
            "effect": v.effect, "effect_ci": v.effect_ci, "p_value": v.p_value,
            "seeds_needed": v.seeds_needed, "baseline_sd": v.baseline_sd, "rule": v.rule, "alpha": v.alpha,
            "diverged_at_step": v.diverged_at_step,
        },
        "interval_level": report.comparison.confidence,
        "hypothesis_changes": list(report.hypothesis_changes),
        "current_hypothesis": asdict(report.current_hypothesis) if report.current_hypothesis else None,
        "added_seeds": list(report.added_seeds),
        "decided_seeds": list(report.decided_seeds),
        "exploratory": ({"outcome": report.exploratory.outcome, "effect": report.exploratory.effect,
                         "effect_ci": report.exploratory.effect_ci, "n_pairs": report.exploratory.n_pairs}
                        if report.exploratory else None),
        "metrics": {
            k: {"candidate": m.candidate, "baseline": m.baseline, "delta": m.delta, "delta_pct": m.delta_pct,
                "ci_low": m.ci_low, "ci_high": m.ci_high, "n": m.n}
            for k, m in report.comparison.metrics.items()
        },
        "pairs": [{"seed": p.seed, "candidate": p.candidate.run_id, "baseline": p.baseline.run_id} for p in report.comparison.pairs],
        "candidate_runs": [{"run_id": r.run_id, "seed": r.seed, "status": r.status, "mlflow_run_id": r.mlflow_run_id}
                           for r in report.candidates],
        "baseline_runs": [{"run_id": r.run_id, "seed": r.seed, "status": r.status, "mlflow_run_id": r.mlflow_run_id}
                          for r in report.baselines],
        "params_diff": [asdict(c) for c in report.params_diff],
        "data_diff": asdict(report.data_diff),
        "cost": {"candidate": asdict(report.candidate_summary), "baseline": asdict(report.baseline_summary)},
        "alerts": [{"run_id": run, **asdict(a)} for run, a in report.alerts],
        "warnings": list(report.warnings),
        "plots": list(plots),
        "context": asdict(report.context),
        "baseline_alerts": [{"run_id": run, **asdict(a)} for run, a in report.baseline_alerts],
        "markdown_chars": len(markdown),
        "truncated": is_truncated(markdown),
    })
    return result


def build_report(
    candidate_dirs: Sequence[RunRecord | str | Path],
    baseline_dirs: Sequence[RunRecord | str | Path] = (),
    *,
    spec: Any = None,
    hypothesis: Any = None,
    out_dir: str | Path | None = None,
    mlflow_url: str | None = None,
    mlflow_client: Any = None,
    experiment: str | None = None,
    baseline_name: str | None = None,
    max_chars: int = GITHUB_COMMENT_LIMIT,
    env: dict[str, str] | None = None,
    claim: str | None = None,
    pngs: bool = True,
) -> BuiltReport:
    """Reads the runs, writes `out_dir/{report.md, *.png, result.json}` and returns them.

    Runs are run directories or `RunRecord`s. The hypothesis comes from `hypothesis`, else
    `spec` (an `ExperimentSpec`, or the path of an experiment YAML / resolved JSON), else the
    first candidate's `spec.resolved.json`. `out_dir` defaults to `<first candidate>/report`.
    With `mlflow_client`, the files are logged to the first candidate's MLflow run.
    """
    candidates = list(candidate_dirs)
    if not candidates:
        raise UsageError("give at least one candidate run")
    cand_records, base_records = _records(candidates), _records(baseline_dirs)
    if hypothesis is None and spec is not None:
        hypothesis = load_hypothesis(spec) if isinstance(spec, str | Path) else spec.hypothesis
    if hypothesis is None and not any(r.hypothesis for r in cand_records):
        raise UsageError("no hypothesis: pass --spec, or a candidate run whose spec.resolved.json has one")
    if out_dir is None:
        first = candidates[0]
        if isinstance(first, RunRecord):
            raise UsageError("out_dir is required when candidates are records")
        out_dir = Path(first) / "report"
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)

    if claim is None and spec is not None and not isinstance(spec, str | Path):
        from reports.prereg import claim_key

        claim = claim_key(spec)
    report = make_report(cand_records, base_records, hypothesis, experiment=experiment, baseline_name=baseline_name,
                         claim=claim)
    from reports.plots import log_to_mlflow, save_plots

    plots = save_plots(report, out) if pngs else []  # pngs=False: no PNG (and no matplotlib import)
    env = env if env is not None else dict(os.environ)
    from datetime import UTC, datetime

    workflow = workflow_run_url(env)
    uri = _tracking_uri(mlflow_client)
    local = bool(uri and uri.startswith("sqlite:///"))  # a store on this machine: `mlflow ui` serves it
    context = ReportContext(
        commit=report.context.commit, dirty=report.context.dirty,
        generated_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        workflow_url=workflow,
        compare_url=_compare_link(report, mlflow_url or (LOCAL_MLFLOW_UI if local else None), mlflow_client),
        mlflow_hint=(f"start its UI first: `mlflow ui --backend-store-uri {uri}`" if local and not mlflow_url
                     else report.context.mlflow_hint),
        artifacts=(f"the `report-{report.experiment}` artifact of the workflow run" if workflow else str(out)),
    )
    report = Report(**{**report.__dict__, "plots": tuple(p.name for p in plots), "context": context})
    markdown = render_markdown(report, mlflow_url=mlflow_url, max_chars=max_chars)
    md_path = out / "report.md"
    md_path.write_text(markdown, encoding="utf-8")
    result_path = out / "result.json"
    files = [md_path, *plots]
    if is_truncated(markdown):  # the comment had to be cut: keep everything next to it
        full_path = out / FULL_REPORT_NAME
        full_path.write_text(render_markdown(report, mlflow_url=mlflow_url, max_chars=2**31), encoding="utf-8")
        files.insert(1, full_path)
    if mlflow_client is not None:
        # The first candidate run trained here: a run reused from another job (fetched from the
        # tracking server, `fetched_from.json`: pipelines.tracked_runs) is that job's, and a
        # job's own MLflow credential cannot write it (docs/operations.md section 4).
        fetched = {_fetched_run(Path(c)) for c in candidates if isinstance(c, str | Path)}
        target = next((r.mlflow_run_id for r in report.candidates if r.mlflow_run_id and r.mlflow_run_id not in fetched),
                      None)
        if target:
            log_to_mlflow(mlflow_client, target, files)
    summary_path = out / SUMMARY_NAME
    summary_path.write_text(summary_text(report), encoding="utf-8")
    files.append(summary_path)
    write_step_summary(markdown, env)
    tmp = result_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report_result(report, markdown, [p.name for p in plots]), indent=2, default=str), encoding="utf-8")
    tmp.replace(result_path)  # last: the report directory exists once this file does
    return BuiltReport(report=report, markdown=markdown, out_dir=out, files=(*files, result_path))
