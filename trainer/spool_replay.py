"""Metrics a run spooled while MLflow was away, handled after the run: the report's notice of
which runs hold a spool, and `replay_spool` (`pipeline replay-metrics RUN`), which sends it.

The spool itself (RUN/mlflow_spool.jsonl) is written, and resent on the next good flush, by
`trainer.metric_sinks.MlflowSink`; the replay goes through that sink, so each point still lands once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.metric_sinks import RUN_FILE, SPOOL, MlflowSink, read_jsonl_tolerant
from trainer.record import RESULT_FILE, write_result


def spool_notice(run_dirs: list[Path]) -> str:
    """Markdown for a report: which runs hold metrics MLflow never received, and the exact
    command that sends them (each point once). Empty when nothing is spooled."""
    spooled = [Path(d) for d in run_dirs if (Path(d) / SPOOL).is_file()]
    if not spooled:
        return ""
    lines = ["### Metrics waiting for MLflow", "",
             "MLflow could not be reached while these runs trained; their metrics are spooled on disk "
             "and the verdict above was computed from the local records (`metrics.jsonl`, `result.json`). "
             "When the server is back, send them (each point once):", "", "```bash"]
    lines += [f"pipeline replay-metrics {d}" for d in spooled]
    return "\n".join([*lines, "```", ""])


def replay_spool(run_dir: Path, tracking_uri: str | None = None) -> dict[str, Any]:
    """Send a run's spooled metrics to MLflow (creating the run if it never reached the server).

    Updates result.json's `mlflow_run_id` when the run id was not known before. Raises
    `TrackingError` when the server is still unreachable.
    """
    from basics.errors import TrackingError

    run_dir = Path(run_dir)
    saved = json.loads((run_dir / RUN_FILE).read_text()) if (run_dir / RUN_FILE).is_file() else {}
    uri = tracking_uri or saved.get("tracking_uri")
    if not uri or not saved.get("experiment"):
        raise TrackingError(f"{run_dir}: no {RUN_FILE}; nothing to replay")
    pending = len(read_jsonl_tolerant(run_dir / SPOOL)[0])
    sink = MlflowSink(uri, saved["experiment"], run_dir)
    if sink.run_id is None:
        raise TrackingError(f"MLflow at {uri} still unreachable; {pending} records stay in {run_dir / SPOOL}")
    sink.flush(force=True)
    if (run_dir / SPOOL).exists():
        raise TrackingError(f"MLflow at {uri} still unreachable; records stay in {run_dir / SPOOL}")
    result_path = run_dir / RESULT_FILE
    if result_path.is_file():
        result = json.loads(result_path.read_text())
        if result.get("mlflow_run_id") != sink.run_id:
            result["mlflow_run_id"] = sink.run_id
            write_result(run_dir, result)
        if result.get("status") in ("finished", "failed", "stopped", "diverged"):
            sink.close(result["status"])
    return {"run_id": sink.run_id, "records": pending}
