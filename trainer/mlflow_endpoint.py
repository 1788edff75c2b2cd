"""Where MLflow is and how long a call to it may take: the default tracking URI, an experiment's
artifact location, the one HTTP bound every MLflow call of the project runs under, and a
remembered reachability check.

Imported at module level by `pipelines.cli`, so it imports neither mlflow nor torch: `pipeline
validate` must stay light.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("trainer.mlflow_endpoint")


def default_tracking_uri(repo_root: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(repo_root).resolve()}/mlflow.db"


def artifact_location(tracking_uri: str) -> str | None:
    """Where an experiment created in `tracking_uri` keeps its artifacts (report files, models).

    A sqlite store keeps them in `mlruns/` beside its database file: MLflow's own default is
    `./mlruns` of whatever directory the creating process ran in, so two stores would share
    one folder and one store's artifacts would scatter over working directories. A server
    (http) decides itself (`--default-artifact-root`); so does a file store (None)."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return None
    database = Path(tracking_uri[len(prefix):].split("?", 1)[0])
    if not str(database) or str(database) == ":memory:":
        return None
    return (database.expanduser().resolve().parent / "mlruns").as_uri()


MLFLOW_HTTP_POLICY = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
}
"""The one place that bounds every MLflow call of the project (trainer, orchestration, reports).

MLflow's defaults are a 120 s timeout and 7 retries with exponential backoff (factor 2): one
lookup against a dead server took ~250 s, and the report stage made three (742 s measured).
Here a call costs at most 5 s + one retry after 1 s; an unreachable server is then remembered
(`reachable_client`, the sink's offline mode) rather than asked again. Operators may override
each variable in the environment (setdefault)."""
MLFLOW_RECHECK_S = 60.0


def bound_mlflow_http(env: dict[str, str] | None = None) -> None:
    """Apply `MLFLOW_HTTP_POLICY` to `env` (this process's environment by default) where unset."""
    target: Any = os.environ if env is None else env
    for key, value in MLFLOW_HTTP_POLICY.items():
        target.setdefault(key, value)


_reachable: dict[str, tuple[float, Any]] = {}


def reachable_client(tracking_uri: str) -> Any:
    """An `MlflowClient` for `tracking_uri`, or None when the server does not answer; the answer
    is remembered for `MLFLOW_RECHECK_S`, so a dead server costs one bounded attempt, not one
    per lookup."""
    now = time.monotonic()
    cached = _reachable.get(tracking_uri)
    if cached is not None and now - cached[0] < MLFLOW_RECHECK_S:
        return cached[1]
    bound_mlflow_http()
    client: Any = None
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        client.search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - unreachable or failing: the local records stand in
        log.warning("MLflow at %s unreachable (%s); using the local records", tracking_uri, short_error(exc))
        client = None
    _reachable[tracking_uri] = (now, client)
    return client


def short_error(exc: BaseException) -> str:
    """An MLflow error in one log-sized line: its type and the first 200 characters of its first line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"
