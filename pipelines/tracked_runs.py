"""Finished runs shared through the tracking server: found by identity, fetched as run directories.

Local `runs/` is one checkout's memory; the tracking server is the memory a team shares. When
a seed run finishes, the flow logs its record (the files the report reads: `RECORD_FILES`) as
the artifacts `pipeline-record/` of its MLflow run, then tags the run `pipeline.record=1` (the
marker: a run without it has no complete record and is not reused). Another checkout that
needs the same identity (tag `pipeline.identity`, `pipelines.identity.RunIdentity.key`) and
has no finished run of it under its own `runs/` asks the server, downloads the record into the
seed directory it would have trained into, and reuses it like a local run: nothing is trained.

A fetched directory has no checkpoints (it cannot be `--continue-from`'d; it is finished) and
says where it came from in `fetched_from.json`. It appears at once and whole (downloaded into
a hidden sibling, then one rename), so a reader never sees half of one.

With a launch plan (`pipelines.trusted.registry`, the GitHub flow with a provenance store), only the
MLflow runs the plan names are reused: trusted code decided them before any PR code ran.
MLflow is best effort: an unreachable server means "not found", and the run is trained.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from basics.files import atomic_write_json, read_json

log = logging.getLogger("pipelines.tracked_runs")

RECORD_DIR = "pipeline-record"
RECORD_TAG = "pipeline.record"
IDENTITY_TAG = "pipeline.identity"
RECORD_FILES = ("result.json", "identity.json", "spec.resolved.json", "metrics.jsonl", "alerts.jsonl",
                "hypothesis.registered.json")
"""What the report and the claim registry read from a seed run directory (`reports.records`)."""
FETCHED_FILE = "fetched_from.json"
_IDENTITY = re.compile(r"^[0-9a-f]{16}$")
_SEARCH_CHUNK = 100  # experiment ids per search_runs request


def publish_record(client: Any, seed_dir: Path) -> str | None:
    """Logs a finished seed run's record to its MLflow run and marks it reusable; returns the
    MLflow run id, or None when there is nothing to publish (not finished, no MLflow run)."""
    result = read_json(seed_dir / "result.json") or {}
    run_id = result.get("mlflow_run_id")
    if client is None or result.get("status") != "finished" or not isinstance(run_id, str):
        return None
    if (seed_dir / FETCHED_FILE).exists():
        return None  # someone else's record, already on the server
    with tempfile.TemporaryDirectory(prefix="record-") as tmp:
        for name in RECORD_FILES:
            if (seed_dir / name).is_file():
                shutil.copy2(seed_dir / name, Path(tmp) / name)
        client.log_artifacts(run_id, tmp, RECORD_DIR)
    client.set_tag(run_id, RECORD_TAG, "1")  # last: the marker
    return run_id


def _experiment_ids(client: Any) -> list[str]:
    ids: list[str] = []
    token = None
    while True:
        page = client.search_experiments(max_results=1000, page_token=token)
        ids += [str(e.experiment_id) for e in page]
        token = getattr(page, "token", None)
        if not token:
            return ids


def find_recorded(client: Any, identity: str, *, allowed: Collection[str] | None = None) -> Any | None:
    """The earliest finished MLflow run with a complete record of `identity` (in any
    experiment: the key does not include the name), restricted to `allowed` run ids if given."""
    assert _IDENTITY.match(identity), "an identity key goes into a filter string"
    if allowed is not None and not allowed:
        return None
    query = (f"tags.`{IDENTITY_TAG}` = '{identity}' and tags.`{RECORD_TAG}` = '1' "
             "and attributes.status = 'FINISHED'")
    found: list[Any] = []
    ids = _experiment_ids(client)
    for start in range(0, len(ids), _SEARCH_CHUNK):
        found += client.search_runs(ids[start:start + _SEARCH_CHUNK], filter_string=query,
                                    order_by=["attributes.start_time ASC"], max_results=50)
    found = [r for r in found if allowed is None or r.info.run_id in allowed]
    return min(found, key=lambda r: r.info.start_time or 0) if found else None


def fetch_record(client: Any, run: Any, dest: Path, *, tracking_uri: str) -> Path | None:
    """Downloads `run`'s record into `dest` (which must not exist); None when the record is not
    a finished run of the identity the run is tagged with (nothing is left behind then)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.fetch-", dir=dest.parent))
    try:
        local = Path(client.download_artifacts(run.info.run_id, RECORD_DIR, str(staging)))
        result, ident = read_json(local / "result.json") or {}, read_json(local / "identity.json") or {}
        if result.get("status") != "finished" or ident.get("identity") != run.data.tags.get(IDENTITY_TAG):
            log.warning("MLflow run %s: its record is not a finished run of its identity; not reused", run.info.run_id)
            return None
        # The record names the run it was published from; the copy says where it came from.
        result["mlflow_run_id"] = run.info.run_id
        atomic_write_json(local / "result.json", result)
        atomic_write_json(local / FETCHED_FILE, {
            "tracking_uri": _without_credentials(tracking_uri), "mlflow_run_id": run.info.run_id,
            "experiment_id": run.info.experiment_id, "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        os.rename(local, dest)
        return dest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fetch_finished(client: Any, identity: str, dest: Path, *, tracking_uri: str,
                   allowed: Collection[str] | None = None) -> Path | None:
    """A finished run of `identity` from the tracking server, as the run directory `dest`; None
    when the server has none (or does not answer, or `dest` exists already)."""
    if client is None or dest.exists():
        return None
    try:
        run = find_recorded(client, identity, allowed=allowed)
        return None if run is None else fetch_record(client, run, dest, tracking_uri=tracking_uri)
    except Exception as exc:  # noqa: BLE001 - best effort: the run is trained instead
        from trainer.mlflow_endpoint import short_error

        log.warning("MLflow lookup of identity %s failed (%s); training it", identity, short_error(exc))
        return None


def _without_credentials(uri: str) -> str:
    return re.sub(r"//[^/@]*@", "//", uri)


def fetched_from(seed_dir: Path) -> dict[str, Any] | None:
    """Where a fetched run directory came from (None for a run trained here)."""
    data = read_json(seed_dir / FETCHED_FILE)
    return data if isinstance(data, dict) else None


__all__ = ["FETCHED_FILE", "RECORD_DIR", "RECORD_FILES", "RECORD_TAG", "fetch_finished", "fetch_record",
           "fetched_from", "find_recorded", "publish_record"]
