"""`RunRecord`: everything the report needs about one finished run, from either source.

Two thin adapters fill it: `record_from_run_dir` reads the files the trainer and the
orchestrator leave in a run directory (the contract in TEAM.md / ARCHITECTURE.md), and
`records_from_mlflow` reads runs from an MLflow tracking server. Everything downstream
(`compare`, `verdict`, `render_markdown`) works on records only and never touches I/O.

Readers are lenient about optional files (alerts, data-check results, the plan's cost
estimate): a missing optional file is "unknown", shown as such, never an error. A run
directory without `result.json` is not a finished run and is refused.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from basics.environment import COMPARED_KEYS
from basics.errors import PipelineError, TrackingError, UsageError

# Fields of the resolved spec that do not change what is trained; left out of params diffs.
COSMETIC_PARAM_PREFIXES = ("name", "owner", "description", "extends", "schema_ref", "hypothesis.", "sweep.")


@dataclass(frozen=True)
class Alert:
    """One alert the trainer raised (alerts.jsonl line or MLflow tag)."""

    level: str
    kind: str
    message: str
    step: int | None = None


@dataclass(frozen=True)
class DataInfo:
    """What the run trained on: data version, mixture asked for and realised, check outcome."""

    version: str | None = None
    mixture_requested: dict[str, float] = field(default_factory=dict)
    mixture_realised: dict[str, float] = field(default_factory=dict)
    checks_passed: bool | None = None
    """None when the data-check stage left no result."""
    checks_failed: tuple[str, ...] = ()
    """Names of the failed expectations, for the data diff."""
    checks_total: int | None = None
    """Expectations evaluated by the data-check stage (`data_check.json` `total`); None when unknown."""
    checks_met: int | None = None
    check_rows: tuple[dict[str, Any], ...] = ()
    """Per-source profile the checks ran on (documents, tokens, duplicate and empty rates, weights,
    drift against the baseline), as `validation.data.checks` wrote it."""
    checks_against: str | None = None
    """The baseline experiment the drift rules compared with (None: no drift checks)."""


@dataclass(frozen=True)
class Cost:
    """Device-hours used by the run and what the plan estimated beforehand."""

    device_hours: float | None = None
    estimate_device_hours: float | None = None
    """The approved plan's estimate for this run, recorded at launch (`launch_estimate`); None when
    the run has no recorded plan (never re-planned afterwards: see `launch_estimate`)."""
    wall_s: float | None = None
    estimate_wall_s: float | None = None
    """The plan's wall time for this run, recorded with the estimate."""


@dataclass(frozen=True)
class Perf:
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_mem_gb: float | None = None
    parameters: int | None = None
    """The model's parameters (the trainer's `n_params`)."""
    active_parameters: int | None = None
    """Parameters one token passes through (`n_active_params`; = parameters for a dense model)."""


def _count(value: Any) -> int | None:
    number = _finite(value)
    return int(number) if number is not None and number > 0 else None


def _typical(history: dict[str, list[tuple[int, float]]], final: dict[str, float], key: str) -> float | None:
    """The median of a run's logged windows of a rate, else its final value.

    The last window alone is not the run's speed: one slow window (an evaluation, a
    checkpoint, a busy neighbour) made a baseline read 1,199 tokens/s against its own
    16,000 everywhere else and the report call the candidate 13x faster.
    """
    points = history.get(key)
    return float(median(v for _, v in points)) if points else final.get(key)


RATE_KEYS = ("perf/tokens_per_s", "perf/mfu", "perf/step_time_s")
"""Per-window rates: a run's value for them is the median window (`_typical`), not the last."""


def _steady_rates(history: dict[str, list[tuple[int, float]]], final: dict[str, float]) -> dict[str, float]:
    return {k: v for k in RATE_KEYS if (v := _typical(history, final, k)) is not None}


@dataclass(frozen=True)
class RunRecord:
    """One finished (or failed) training run, as the report sees it."""

    run_id: str
    experiment: str
    seed: int | None
    status: str
    final_metrics: dict[str, float]
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    """The resolved spec flattened to dotted keys (`train.lr`)."""
    tags: dict[str, str] = field(default_factory=dict)
    """Identity tags without the `pipeline.` prefix: code_version, data_version, spec_hash,
    env_hash, trainer_version, ..."""
    data: DataInfo = DataInfo()
    alerts: tuple[Alert, ...] = ()
    cost: Cost = Cost()
    perf: Perf = Perf()
    env: dict[str, str] = field(default_factory=dict)
    """The comparable part of the environment fingerprint (see COMPARED_ENV_KEYS)."""
    mlflow_run_id: str | None = None
    mlflow_url: str | None = None
    hypothesis: dict[str, Any] | None = None
    """The run's own `hypothesis` section, if its spec had one."""
    diverged_at_step: int | None = None
    """For status `diverged`: the step at which the trainer declared divergence."""
    non_finite: tuple[str, ...] = ()
    """Metrics whose final value was NaN or infinite: left out of `final_metrics`, never
    replaced by an older history point (the report names them)."""
    registrations: dict[str, dict[str, Any]] = field(default_factory=dict)
    """experiment name -> its preregistered hypothesis (`hypothesis.registered.json`, see
    `reports.prereg`): what the hypothesis was when this run's training started."""

    @property
    def env_hash(self) -> str | None:
        return self.tags.get("env_hash")

    @property
    def trainer_version(self) -> str | None:
        return self.tags.get("trainer_version")


# --------------------------------------------------------------------------- helpers


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts to dotted keys. A list of named items (data sources) is keyed by name,
    so a diff says `data.sources.code.weight` rather than "the whole list changed"."""
    if not isinstance(data, dict):
        return {prefix: data} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, path))
        elif _named_items(value):
            for item in value:
                out.update(flatten({k: v for k, v in item.items() if k != "name"}, f"{path}.{item['name']}"))
        else:
            out[path] = value
    return out


def _named_items(value: Any) -> bool:
    if not isinstance(value, list) or not value or not all(isinstance(i, dict) and "name" in i for i in value):
        return False
    names = [str(i["name"]) for i in value]
    return len(set(names)) == len(names)


# What makes two runs' numbers comparable: the one definition in basics.environment,
# plus `gpu`, the name older trainers recorded the GPU under (runs made before it moved).
COMPARED_ENV_KEYS = (*COMPARED_KEYS, "gpu")


def comparable_env(env: dict[str, Any] | None) -> dict[str, str]:
    return {k: str(env[k]) for k in COMPARED_ENV_KEYS if isinstance(env, dict) and env.get(k) is not None}


def env_hash(env: dict[str, Any] | None) -> str | None:
    """A short stable hash of the comparable part of a recorded environment fingerprint
    (`basics.environment.env_fingerprint` is what the trainer records)."""
    subset = comparable_env(env)
    if not subset:
        return None
    canonical = json.dumps(subset, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def env_diff(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """`torch: 2.13.0 vs 2.14.0` for each comparable key both sides recorded and that differs."""
    return [f"{k}: {a[k]} vs {b[k]}" for k in COMPARED_ENV_KEYS if k in a and k in b and a[k] != b[k]]


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            # The last line may be half-written if the run was killed; earlier ones may not.
            if number == len(lines):
                break
            raise UsageError(f"{path}:{number}: not valid JSON") from None
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _find_number(data: Any, names: tuple[str, ...]) -> float | None:
    """First finite number under any of `names`, searching nested dicts breadth-first."""
    queue = [data]
    while queue:
        node = queue.pop(0)
        if isinstance(node, dict):
            for name in names:
                if name in node and _finite(node[name]) is not None:
                    return _finite(node[name])
            queue.extend(v for v in node.values() if isinstance(v, dict))
    return None


def _alert_from_dict(row: dict[str, Any]) -> Alert:
    step = row.get("step")
    return Alert(
        level=str(row.get("level", "P2")),
        kind=str(row.get("kind") or row.get("name") or row.get("type") or "alert"),
        message=str(row.get("message") or row.get("msg") or ""),
        step=int(step) if isinstance(step, int | float) and not isinstance(step, bool) else None,
    )


def _alert_from_tag(kind: str, text: str) -> Alert:
    match = re.match(r"^(P\d)\s+step\s+(\d+):\s*(.*)$", text, re.S)
    if match is None:
        return Alert(level="P2", kind=kind, message=text)
    return Alert(level=match.group(1), kind=kind, message=match.group(3), step=int(match.group(2)))


def _world_size(params: dict[str, Any]) -> int:
    nodes = int(params.get("resource.nodes") or 1)
    gpus = int(params.get("resource.gpus_per_node") or 0)
    per_node = gpus if gpus else int(params.get("resource.cpu_processes") or 1)
    return nodes * per_node


def _requested_mixture(params: dict[str, Any]) -> dict[str, float]:
    """Mixture weights from flattened params (`data.sources.<name>.weight`) or a raw source list."""
    sources = params.get("data.sources")
    if isinstance(sources, list):
        return {str(s["name"]): float(s["weight"]) for s in sources if isinstance(s, dict) and "name" in s and "weight" in s}
    out = {}
    for key, value in params.items():
        if key.startswith("data.sources.") and key.endswith(".weight") and _finite(value) is not None:
            out[key[len("data.sources."):-len(".weight")]] = float(value)
    return out


def _checks_summary(stage: Any) -> tuple[bool | None, tuple[str, ...]]:
    """Reads a data-check stage result leniently: a `passed`/`success` flag and failed names."""
    if not isinstance(stage, dict):
        return None, ()
    body = stage.get("result", stage) if isinstance(stage.get("result"), dict) else stage
    passed = body.get("passed", body.get("success"))
    failed: list[str] = []
    for key in ("outcomes", "checks", "results", "expectations"):
        items = body.get(key)
        if isinstance(items, list):
            for item in items:
                if isinstance(item, dict) and item.get("passed", item.get("success", True)) is False:
                    name = str(item.get("check") or item.get("name") or item.get("expectation") or "?")
                    failed.append(f"{name} ({item['source']})" if item.get("source") else name)
        elif isinstance(items, dict):
            failed.extend(str(k) for k, v in items.items() if v is False or (isinstance(v, dict) and v.get("passed") is False))
    if passed is None and (failed or any(body.get(k) is not None for k in ("outcomes", "checks"))):
        passed = not failed
    return (bool(passed) if passed is not None else None), tuple(failed)


def _realised_mixture(history: dict[str, list[tuple[int, float]]], result: dict[str, Any]) -> dict[str, float]:
    explicit = result.get("mixture_realised") or result.get("realised_mixture")
    if isinstance(explicit, dict):
        return {str(k): float(v) for k, v in explicit.items() if _finite(v) is not None}
    return {key.removeprefix("data/mix/"): points[-1][1] for key, points in history.items()
            if key.startswith("data/mix/") and points}


# --------------------------------------------------------------------------- run directory


ESTIMATE_KEYS = ("estimate_device_hours", "estimate_wall_s", "estimate_mfu")
"""What `launch_estimate` records in a seed run's identity.json (and so, through the trainer's
`pipeline.<key>` tags, in MLflow)."""


def launch_estimate(spec: Any, measured_cpu: Sequence[Any] = ()) -> dict[str, float]:
    """The plan's estimate for one run of `spec`, to record when the run is launched.

    `spec` must be the `ExperimentSpec` as loaded from the experiment file (what `pipeline plan`
    and the PR's plan priced): `validation.plan` reads which fields the file set (a CPU spec that
    does not set `resource.assumed_mfu` is planned at the measured CPU utilisation), and a spec
    dumped to JSON and read back has every field set. Re-planning a run's `spec.resolved.json`
    afterwards is what priced the demo at 0.35 MFU and called a run that used 83 % of its plan
    "782 % of the estimate"; the report reads this record instead. `measured_cpu`: this machine's
    speed as the approved plan took it (`validation.plan.cpu_speed`). Empty when it cannot be planned."""
    try:
        from validation.plan import make_plan

        compute = make_plan(spec, measured_cpu=measured_cpu).compute
    except (PipelineError, ValueError, ImportError, KeyError, TypeError, AttributeError):
        return {}  # optional context: the report then says no plan was recorded
    return {"estimate_device_hours": round(compute.device_hours, 6), "estimate_wall_s": round(compute.wall_seconds, 1),
            "estimate_mfu": compute.assumed_mfu}


@dataclass(frozen=True)
class CheckSummary:
    passed: bool | None = None
    failed: tuple[str, ...] = ()
    total: int | None = None
    met: int | None = None
    rows: tuple[dict[str, Any], ...] = ()
    against: str | None = None


ROW_KEYS = ("source", "documents", "tokens", "duplicate_rate", "empty_rate", "doc_tokens_p50", "requested_weight",
            "realised_weight", "js_divergence")


def _check_detail(data: Any) -> CheckSummary:
    """Counts and per-source rows of a `data_check.json` (validation.data.checks), leniently."""
    if not isinstance(data, dict):
        return CheckSummary()
    total = data.get("total")
    failed_count = data.get("failed")
    rows = tuple({k: row.get(k) for k in ROW_KEYS if k in row} for row in data.get("rows") or () if isinstance(row, dict))
    against = str(data["baseline"]) if data.get("baseline") else None
    if not isinstance(total, int) or not isinstance(failed_count, int):
        return CheckSummary(rows=rows, against=against)
    return CheckSummary(total=total, met=total - failed_count, rows=rows, against=against)


def _data_check_of(run_dir: Path) -> CheckSummary:
    """The data-check outcome of the experiment a seed directory belongs to.

    Seed runs live in `<experiment run>/train/seed-<n>/`; the `check` stage result is
    `<experiment run>/stages/check.json` (a StageResult whose outputs name the detailed
    `data_check.json`). A run directory with its own `stages/` is looked at first.
    """
    candidates = [run_dir / "stages"]
    if run_dir.parent.name == "train":
        candidates.append(run_dir.parent.parent / "stages")
    for stages in candidates:
        stage_path = stages / "check.json"
        if not stage_path.is_file():
            continue
        stage = _read_json(stage_path)
        if not isinstance(stage, dict):
            continue
        outputs: dict[str, Any] = stage["outputs"] if isinstance(stage.get("outputs"), dict) else {}
        passed = outputs.get("ok", stage.get("status") == "ok" if "status" in stage else None)
        failed: tuple[str, ...] = ()
        summary = CheckSummary()
        detail = Path(str(outputs.get("json", ""))) if outputs.get("json") else None
        if detail is not None and detail.is_file():
            body = _read_json(detail)
            detail_passed, failed = _checks_summary(body)
            passed = detail_passed if detail_passed is not None else passed
            summary = _check_detail(body)
        return CheckSummary((bool(passed) if passed is not None else None), failed, summary.total, summary.met,
                            summary.rows, summary.against)
    return CheckSummary()


def is_divergence_metric(key: str) -> bool:
    """A non-finite value of these means the run diverged: the training loss, or any eval
    metric (a NaN eval loss is a broken model, not a missing number)."""
    return key == "train/loss" or key.startswith("eval/")


def _with_divergence_alert(alerts: tuple[Alert, ...], non_finite: Any, step: int) -> tuple[Alert, ...]:
    """The P0 divergence alert, added when the trainer did not raise one itself."""
    if any(a.level == "P0" and a.kind == "divergence" for a in alerts):
        return alerts
    keys = [k for k in non_finite if is_divergence_metric(k)]
    what = f"non-finite {', '.join(f'`{k}`' for k in keys)}" if keys else "training loss above ln(vocab) + 1"
    return (*alerts, Alert("P0", "divergence", f"{what}: diverged (found by the report)", step))


DIVERGENCE_MARGIN_NATS = 1.0
"""A training loss this far above ln(vocab_size) (uniform guessing) after warm-up is divergence."""


def divergence_step(train_loss: list[tuple[int, float]], first_non_finite: int | None, raw_final: Any,
                    params: dict[str, Any]) -> int | None:
    """The step a run diverged at, judged from its own loss curve, or None.

    Diverged: a non-finite training loss or eval metric (`is_divergence_metric`, logged or
    final: `first_non_finite`, `raw_final`), or a final training loss above ln(vocab_size) +
    DIVERGENCE_MARGIN_NATS after warm-up (worse than guessing uniformly); the step is the
    first non-finite one, else the first step after warm-up from which the loss stayed above
    that line. The trainer's own detector (status `diverged`) takes precedence.
    """
    if first_non_finite is not None or (raw_final is not None and _finite(raw_final) is None):
        return first_non_finite if first_non_finite is not None else (train_loss[-1][0] if train_loss else 0)
    vocab = _finite(params.get("model.vocab_size"))
    if not vocab or not train_loss:
        return None
    limit = math.log(vocab) + DIVERGENCE_MARGIN_NATS
    warmup = int(_finite(params.get("train.warmup_steps")) or 0)
    after = [(s, v) for s, v in train_loss if s > warmup]
    if not after or after[-1][1] <= limit:
        return None
    step = after[-1][0]
    for s, v in reversed(after):
        if v <= limit:
            break
        step = s
    return step


REGISTRATION_FILE = "hypothesis.registered.json"
"""Written by `reports.prereg.register_hypothesis` into a seed run directory."""


def read_registrations(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """experiment name -> registered hypothesis, from a run directory (empty when none)."""
    path = Path(run_dir) / REGISTRATION_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def record_from_run_dir(path: str | Path) -> RunRecord:
    """Reads a run directory: result.json (required), metrics.jsonl, alerts.jsonl,
    spec.resolved.json, identity.json, stages/*.json."""
    run_dir = Path(path).resolve()
    result_path = run_dir / "result.json"
    if not result_path.is_file():
        raise UsageError(f"{run_dir}: not a finished run (no result.json)")
    result = _read_json(result_path)
    if not isinstance(result, dict):
        raise UsageError(f"{result_path}: expected a JSON object")
    identity = _read_json(run_dir / "identity.json") if (run_dir / "identity.json").is_file() else {}
    from validation.resolved import spec_section  # the spec part of a resolved experiment

    spec = spec_section(_read_json(run_dir / "spec.resolved.json")) if (run_dir / "spec.resolved.json").is_file() else {}
    params = flatten(spec)

    history: dict[str, list[tuple[int, float]]] = {}
    first_non_finite: int | None = None
    last_bad: dict[str, bool] = {}
    """key -> whether its latest logged value (by step) was non-finite."""
    last_step: dict[str, int] = {}
    for row in _read_jsonl(run_dir / "metrics.jsonl"):
        value = _finite(row.get("value"))
        key = str(row.get("key", ""))
        if "key" in row and row.get("value") is not None and int(row.get("step", 0)) >= last_step.get(key, -1):
            last_step[key] = int(row.get("step", 0))
            last_bad[key] = value is None
        if value is None and row.get("value") is not None and "key" in row:
            if is_divergence_metric(key):
                step = int(row.get("step", 0))
                first_non_finite = step if first_non_finite is None else min(first_non_finite, step)
        if value is None or "key" not in row:
            continue
        history.setdefault(key, []).append((int(row.get("step", 0)), value))
    for points in history.values():
        points.sort(key=lambda p: p[0])

    raw_final = {str(k): v for k, v in (result.get("final_metrics") or {}).items()}
    final = {k: v for k, v in ((k, _finite(v)) for k, v in raw_final.items()) if v is not None}
    # A final value that is NaN or infinite stays missing: filling in the last finite history
    # point turned a run whose eval loss ended NaN into a clean number (and a verdict).
    non_finite = sorted({k for k, v in raw_final.items() if v is not None and _finite(v) is None}
                        | {k for k, bad in last_bad.items() if bad and k not in raw_final})
    for key, points in history.items():  # anything only in the history: its last value, if finite
        if key not in raw_final and key not in non_finite:
            final.setdefault(key, points[-1][1])
    final.update(_steady_rates(history, final))

    tags = {str(k): str(v) for k, v in identity.items() if v is not None and not isinstance(v, dict | list)}
    env = comparable_env(result.get("env") or identity.get("env"))
    digest = env_hash(env)
    if digest:
        tags["env_hash"] = digest
    trainer_version = result.get("trainer_version") or identity.get("trainer_version")
    if trainer_version:
        tags["trainer_version"] = str(trainer_version)
    export = result.get("export")
    if isinstance(export, dict) and export.get("how"):  # how RUN/model/ loads, from the architecture file
        tags["export"] = str(export["how"])
        tags["export_loadable"] = "true" if export.get("loadable") else "false"

    checks = _data_check_of(run_dir)
    data = DataInfo(
        version=identity.get("data_version") or result.get("data_version"),
        mixture_requested=_requested_mixture(params),
        mixture_realised=_realised_mixture(history, result),
        checks_passed=checks.passed,
        checks_failed=checks.failed,
        checks_total=checks.total,
        checks_met=checks.met,
        check_rows=checks.rows,
        checks_against=checks.against,
    )

    wall_s = _finite(result.get("wall_s"))
    used = _find_number(result, ("device_hours", "gpu_hours_used"))
    if used is None and wall_s is not None:
        world = result.get("world_size")
        used = wall_s * (int(world) if isinstance(world, int) and world > 0 else _world_size(params)) / 3600.0
    # The approved plan's estimate, recorded at launch (`launch_estimate`); never re-planned here.
    estimate = _find_number(result, ("estimate_device_hours", "estimated_device_hours"))
    if estimate is None:
        estimate = _finite(identity.get("estimate_device_hours"))
    estimate_wall = _finite(identity.get("estimate_wall_s"))

    seed = identity.get("seed", params.get("train.seed"))
    diverged_at: Any = result.get("diverged_at_step")
    status = str(result.get("status", "unknown"))
    alerts = tuple(_alert_from_dict(r) for r in _read_jsonl(run_dir / "alerts.jsonl"))
    if status == "finished":  # a safety net for runs the trainer did not mark (older trainers)
        final_bad = next((raw_final[k] for k in non_finite if is_divergence_metric(k) and k in raw_final), None)
        at = divergence_step(history.get("train/loss", []), first_non_finite, final_bad, params)
        if at is not None:
            status, diverged_at = "diverged", at
            alerts = _with_divergence_alert(alerts, non_finite, at)
    return RunRecord(
        run_id=str(identity.get("run_id") or run_dir.name),
        experiment=str(identity.get("experiment") or spec.get("name") or run_dir.parent.name),
        seed=int(seed) if seed is not None else None,
        status=status,
        final_metrics=final,
        history=history,
        params=params,
        tags=tags,
        data=data,
        alerts=alerts,
        cost=Cost(device_hours=used, estimate_device_hours=estimate, wall_s=wall_s, estimate_wall_s=estimate_wall),
        perf=Perf(
            tokens_per_s=_typical(history, final, "perf/tokens_per_s"),
            mfu=_typical(history, final, "perf/mfu"),
            peak_mem_gb=final.get("perf/peak_mem_gb"),
            parameters=_count(result.get("n_params")),
            active_parameters=_count(result.get("n_active_params")),
        ),
        env=env,
        mlflow_run_id=result.get("mlflow_run_id"),
        hypothesis=spec.get("hypothesis") if isinstance(spec.get("hypothesis"), dict) else None,
        diverged_at_step=int(diverged_at) if isinstance(diverged_at, int | float) and not isinstance(diverged_at, bool) else None,
        non_finite=tuple(non_finite),
        registrations=read_registrations(run_dir),
    )


# --------------------------------------------------------------------------- MLflow


def _registrations_from_tags(tags: dict[str, str], experiment: str, start_ms: int | None) -> dict[str, dict[str, Any]]:
    """The preregistered hypothesis the orchestrator put in the run's identity (tag
    `pipeline.hypothesis_registered`), registered when the run started."""
    try:
        hypothesis = json.loads(tags.get("hypothesis_registered") or "null")
    except ValueError:
        return {}
    if not isinstance(hypothesis, dict):
        return {}
    return {str(tags.get("experiment") or experiment): {
        "hypothesis": hypothesis, "seed_list": [], "registered_at_s": (start_ms or 0) / 1000,
        "registered_at": "run start (MLflow tag pipeline.hypothesis_registered)", "results_existed": False}}


def mlflow_run_url(base_url: str | None, experiment_id: str, run_id: str) -> str | None:
    """Link to a run in the MLflow UI, only when a public URL is configured."""
    if not base_url:
        return None
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def records_from_mlflow(
    client: Any,
    experiment_name: str,
    filter_string: str = "",
    *,
    public_url: str | None = None,
    history_keys: tuple[str, ...] = ("train/loss", "eval/loss"),
) -> list[RunRecord]:
    """Finished runs of one MLflow experiment as records (`client` is an `MlflowClient`).

    Tags `pipeline.<key>` carry the identity (the trainer writes them from identity.json);
    parameters are the flattened resolved spec. Only the histories in `history_keys` (and
    the hypothesis metric if given as a tag) are fetched: one request per run and key.
    """
    try:
        from mlflow.exceptions import MlflowException
    except ImportError as exc:  # pragma: no cover - mlflow is a dependency
        raise TrackingError("mlflow is not installed") from exc
    try:
        experiment = client.get_experiment_by_name(experiment_name)
        if experiment is None:
            return []
        runs = client.search_runs([experiment.experiment_id], filter_string=filter_string, max_results=1000)
    except MlflowException as exc:
        raise TrackingError(f"MLflow: cannot read experiment '{experiment_name}': {exc.message}") from exc

    records = []
    for run in runs:
        tags = {k.removeprefix("pipeline."): v for k, v in run.data.tags.items() if k.startswith("pipeline.")}
        params: dict[str, Any] = {}
        for key, raw in run.data.params.items():
            try:
                params[key] = json.loads(raw)
            except (json.JSONDecodeError, TypeError):
                params[key] = raw
        final = {k: float(v) for k, v in run.data.metrics.items() if _finite(v) is not None}
        non_finite = sorted(k for k, v in run.data.metrics.items() if _finite(v) is None)
        keys = set(history_keys) | {k for k in final if k.startswith("data/mix/")}
        if tags.get("metric"):
            keys.add(tags["metric"])
        history: dict[str, list[tuple[int, float]]] = {}
        for key in sorted(keys & set(final)):
            try:
                points = client.get_metric_history(run.info.run_id, key)
            except MlflowException as exc:
                raise TrackingError(f"MLflow: cannot read '{key}' of run {run.info.run_id}: {exc.message}") from exc
            history[key] = sorted((int(p.step), float(p.value)) for p in points if _finite(p.value) is not None)
        final.update(_steady_rates(history, final))
        env = comparable_env({k.removeprefix("env."): v for k, v in run.data.tags.items() if k.startswith("env.")})
        if env_hash(env):
            tags.setdefault("env_hash", env_hash(env) or "")
        # The trainer keeps the latest alert per kind as a tag `alert.<kind>` = "P1 step 40: message".
        alerts = tuple(_alert_from_tag(k.removeprefix("alert."), v) for k, v in sorted(run.data.tags.items())
                       if k.startswith("alert."))
        seed = tags.get("seed", params.get("train.seed"))
        status = {"FINISHED": "finished", "FAILED": "failed", "KILLED": "stopped"}.get(run.info.status, run.info.status.lower())
        diverged_step = _finite(tags.get("diverged_at_step"))
        if tags.get("status") == "diverged" or diverged_step is not None:
            status = "diverged"  # the trainer's divergence outcome (result.json contract), when tagged
        elif status == "finished" and any(is_divergence_metric(k) for k in non_finite):
            status = "diverged"  # a NaN eval or training loss logged as the final value
            alerts = _with_divergence_alert(alerts, non_finite, int(diverged_step or 0))
        wall_s = (run.info.end_time - run.info.start_time) / 1000 if run.info.end_time and run.info.start_time else None
        requested = _requested_mixture(params)
        records.append(
            RunRecord(
                run_id=tags.get("run_id", run.info.run_id),
                experiment=experiment_name,
                seed=int(seed) if seed is not None else None,
                status=status,
                final_metrics=final,
                history=history,
                params=params,
                tags=tags,
                data=DataInfo(
                    version=tags.get("data_version"),
                    mixture_requested=requested,
                    mixture_realised=_realised_mixture(history, {}),
                ),
                alerts=alerts,
                cost=Cost(
                    device_hours=_finite(tags.get("device_hours")) or (wall_s * _world_size(params) / 3600 if wall_s else None),
                    estimate_device_hours=_finite(tags.get("estimate_device_hours")),
                    wall_s=wall_s,
                    estimate_wall_s=_finite(tags.get("estimate_wall_s")),
                ),
                perf=Perf(_typical(history, final, "perf/tokens_per_s"), _typical(history, final, "perf/mfu"),
                          final.get("perf/peak_mem_gb"), _count(params.get("n_params")),
                          _count(params.get("n_active_params"))),
                env=env,
                mlflow_run_id=run.info.run_id,
                mlflow_url=mlflow_run_url(public_url, experiment.experiment_id, run.info.run_id),
                diverged_at_step=int(step) if (step := _finite(tags.get("diverged_at_step"))) is not None else None,
                non_finite=tuple(non_finite),
                registrations=_registrations_from_tags(tags, experiment_name, run.info.start_time),
            )
        )
    return records
