"""Metric sinks: MLflow (batched, spooled when the server is away), metrics.jsonl, and a null sink.

Exactly once: every sink keeps a per-key high-water mark of the steps it has recorded
(MLflow: read back from the server with `get_metric_history` when a run is resumed or a
spool is replayed; metrics.jsonl: read back from the file). A point whose step is not
above its key's mark is dropped. Keys are logged in increasing step order, so a resumed
run that repeats steps, or a replay after a half-acknowledged request, records each
(key, step) once.

Only rank 0 builds a real sink; the other ranks get `NullSink`.

Where MLflow is and how long a call may take: `trainer.mlflow_endpoint`; a spool after its
run (report notice, `pipeline replay-metrics`): `trainer.spool_replay`.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from trainer.mlflow_endpoint import artifact_location, bound_mlflow_http, short_error

log = logging.getLogger("trainer.metric_sinks")

SPOOL = "mlflow_spool.jsonl"
RUN_FILE = "mlflow_run.json"
# log_batch limits of the MLflow REST API.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_TAGS_PER_BATCH = 100
OFFLINE_RETRY_S = 60.0  # while unreachable, one connection attempt per minute (at most one timeout)


class MetricSink(Protocol):
    """Where metrics go. Five methods and the run id; a disabled destination is `NullSink`."""

    @property
    def run_id(self) -> str | None:
        """The tracking server's run id (None while offline or disabled); checkpoints carry it."""
        ...

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...

    def set_tags(self, tags: dict[str, str]) -> None: ...

    def log_params(self, params: dict[str, Any]) -> None: ...

    def flush(self, wait: bool = True) -> None: ...

    def close(self, status: str) -> None: ...


class NullSink:
    run_id: str | None = None

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def set_tags(self, tags: dict[str, str]) -> None:
        pass

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def flush(self, wait: bool = True) -> None:
        pass

    def close(self, status: str) -> None:
        pass


class FanoutSink:
    """Sends every call to several sinks (metrics.jsonl + MLflow)."""

    def __init__(self, *sinks: Any):
        self.sinks = sinks

    @property
    def run_id(self) -> str | None:
        return next((s.run_id for s in self.sinks if getattr(s, "run_id", None)), None)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for s in self.sinks:
            s.log_metrics(step, metrics)

    def set_tags(self, tags: dict[str, str]) -> None:
        for s in self.sinks:
            s.set_tags(tags)

    def log_params(self, params: dict[str, Any]) -> None:
        for s in self.sinks:
            s.log_params(params)

    def flush(self, wait: bool = True) -> None:
        for s in self.sinks:
            s.flush(wait=wait)

    def close(self, status: str) -> None:
        for s in self.sinks:
            s.close(status)


def filter_new_points(
    points: list[tuple[str, int, float, int]], high_water: dict[str, int]
) -> list[tuple[str, int, float, int]]:
    """Keep the points (key, step, value, ts) above their key's mark, each (key, step) once. Pure;
    updates `high_water` for the points it keeps."""
    kept = []
    for key, step, value, ts in points:
        if step > high_water.get(key, -1):
            kept.append((key, step, value, ts))
            high_water[key] = step
    return kept


def read_jsonl_tolerant(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Records of a JSON Lines file, and the byte length of its complete lines.

    A process killed mid-write leaves a partial last line: it is ignored (and the caller
    truncates the file to the returned length before appending).
    """
    if not path.is_file():
        return [], 0
    data = path.read_bytes()
    records, good = [], 0
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            records.append(json.loads(line))
        except ValueError:
            break
        good += len(line)
    return records, good


class JsonlMetrics:
    """RUN/metrics.jsonl: one {"step","key","value"} per point, each (key, step) once across resumes."""

    run_id: str | None = None

    def __init__(self, path: Path):
        import fcntl

        self.path = Path(path)
        records: list[dict[str, Any]] = []
        good = 0
        if self.path.is_file():
            # Read (and cut a torn last line) under the same flock `flush` writes under: read
            # unlocked, another writer's append in flight looks torn, and cutting it lost points.
            with open(self.path, "r+b") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                try:
                    records, good = read_jsonl_tolerant(self.path)
                    if good != os.fstat(fh.fileno()).st_size:
                        fh.truncate(good)
                finally:
                    fcntl.flock(fh, fcntl.LOCK_UN)
        self.high_water: dict[str, int] = {}
        self._absorb(records)
        self._seen = good  # bytes of the file already folded into the marks
        self._pending: list[tuple[str, int, float, int]] = []

    def _absorb(self, records: list[dict[str, Any]]) -> None:
        for r in records:
            self.high_water[r["key"]] = max(self.high_water.get(r["key"], -1), r["step"])

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        ts = int(time.time() * 1000)
        self._pending.extend((k, step, float(v), ts) for k, v in metrics.items())

    def set_tags(self, tags: dict[str, str]) -> None:
        pass

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def flush(self, wait: bool = True) -> None:
        """Append the new points under an exclusive flock of the file, after folding in whatever
        another writer appended since our last look: even two racing writers (which the run
        lock, `trainer.runlock`, should never let happen) record each (key, step) once."""
        import fcntl

        pending, self._pending = self._pending, []
        if not pending:
            return
        with open(self.path, "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                fh.seek(self._seen)
                tail = fh.read()
                if tail:
                    complete = tail[: tail.rfind(b"\n") + 1]
                    self._absorb([json.loads(line) for line in complete.splitlines() if line.strip()])
                    self._seen += len(complete)
                points = filter_new_points(pending, self.high_water)
                if points:
                    data = "".join(json.dumps({"step": s, "key": k, "value": v}) + "\n" for k, s, v, _ in points)
                    fh.write(data.encode())
                    fh.flush()
                    self._seen = fh.tell()
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def close(self, status: str) -> None:
        self.flush()


def _quiet_http() -> None:
    # A dead server must cost seconds per flush, not MLflow's default minutes of retries.
    bound_mlflow_http()
    from basics.environment import apply_offline_env

    apply_offline_env()


class MlflowSink:
    """MLflow through `MlflowClient.log_batch`, one call per flush (never one per point).

    When the server cannot be reached, points, tags and params are appended to
    RUN/mlflow_spool.jsonl; the next successful flush (or `trainer.spool_replay.replay_spool`)
    sends them first.
    The run id lives in RUN/mlflow_run.json as soon as it exists, so a resumed process
    continues the same MLflow run.
    """

    def __init__(self, tracking_uri: str, experiment: str, run_dir: Path, run_id: str | None = None,
                 run_name: str | None = None):
        _quiet_http()
        self.tracking_uri = tracking_uri
        # On GitHub every run of a training job goes to the job's own MLflow experiment, the
        # only one its credential may write (pipelines/trusted/job_identity.py).
        job_experiment = os.environ.get("PIPELINE_MLFLOW_EXPERIMENT")
        self.experiment = job_experiment or experiment
        self.run_dir = Path(run_dir)
        self.spool = self.run_dir / SPOOL
        self.run_file = self.run_dir / RUN_FILE
        saved = json.loads(self.run_file.read_text()) if self.run_file.is_file() else {}
        if job_experiment and saved.get("experiment") not in (None, job_experiment):
            saved = {}  # an earlier job's run in its own experiment: this job continues in a new MLflow run
        self.run_id: str | None = run_id or saved.get("run_id")
        self.run_name = run_name or saved.get("run_name") or self.run_dir.name
        self.high_water: dict[str, int] = {}
        self._client: Any = None
        # Filled by the training thread (front), handed to the sender in one swap per flush.
        self._front_metrics: list[tuple[str, int, float, int]] = []
        self._front_tags: dict[str, str] = {}
        self._front_params: dict[str, str] = {}
        # Owned by whoever holds _io_lock (the background sender, or a waiting flush).
        self._pending_metrics: list[tuple[str, int, float, int]] = []
        self._pending_tags: dict[str, str] = {}
        self._pending_params: dict[str, str] = {}
        self._offline_since: float | None = None
        self._io_lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._worker: threading.Thread | None = None
        self.calls = 0  # log_batch requests made (for the overhead benchmark)
        self._write_run_file()
        self._connect()

    # ---------------------------------------------------------------- protocol

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        ts = int(time.time() * 1000)
        self._front_metrics.extend((k, step, float(v), ts) for k, v in metrics.items())

    def set_tags(self, tags: dict[str, str]) -> None:
        self._front_tags.update({k: str(v)[:5000] for k, v in tags.items()})

    def log_params(self, params: dict[str, Any]) -> None:
        self._front_params.update({k: str(v)[:6000] for k, v in params.items()})

    def flush(self, wait: bool = True, force: bool = False) -> None:
        """Send what was logged since the last flush.

        wait=False hands it to a background sender and returns at once (the training loop's
        log-interval flush: the HTTP round trip leaves the step time). wait=True (checkpoints,
        close) returns only when everything logged so far is acknowledged or spooled to disk,
        so a checkpoint never covers a step whose points could still be lost.
        """
        batch = (self._front_metrics, self._front_tags, self._front_params)
        self._front_metrics, self._front_tags, self._front_params = [], {}, {}
        if not wait:
            if self._worker is None:
                self._worker = threading.Thread(target=self._sender, name="mlflow-sender", daemon=True)
                self._worker.start()
            self._queue.put((batch, force))
            return
        self._queue.join()
        with self._io_lock:
            self._take(batch)
            self._flush_now(force)

    def _sender(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                batch, force = item
                with self._io_lock:
                    self._take(batch)
                    self._flush_now(force)
            except Exception as exc:  # noqa: BLE001 - never let the sender die silently
                log.warning("MLflow sender: %s", short_error(exc))
            finally:
                self._queue.task_done()

    def _take(self, batch: tuple[list[Any], dict[str, str], dict[str, str]]) -> None:
        self._pending_metrics.extend(batch[0])
        self._pending_tags.update(batch[1])
        self._pending_params.update(batch[2])

    def _flush_now(self, force: bool) -> None:
        if not (self._pending_metrics or self._pending_tags or self._pending_params or self.spool.exists()):
            return
        if self._offline_since is not None and not force and time.monotonic() - self._offline_since < OFFLINE_RETRY_S:
            self._spool_pending()
            return
        try:
            if self._client is None or self.run_id is None:
                self._connect(raise_errors=True)
            self._replay_spool_file()
            self._send(self._pending_metrics, self._pending_tags, self._pending_params)
            self._pending_metrics, self._pending_tags, self._pending_params = [], {}, {}
            self._offline_since = None
        except Exception as exc:  # noqa: BLE001 - any transport/server error means "spool and go on"
            if self._offline_since is None:
                log.warning("MLflow at %s unreachable (%s); spooling to %s", self.tracking_uri, short_error(exc), self.spool)
            self._offline_since = time.monotonic()
            self._spool_pending()

    def close(self, status: str) -> None:
        """Flush (retrying once even if offline) and mark the run FINISHED / FAILED / KILLED.

        status "preempted" leaves the run RUNNING: the resumed process continues it.
        """
        self.flush(wait=True, force=True)
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout=60)
            self._worker = None
        if self._offline_since is not None or self.run_id is None or status == "preempted":
            return
        mlflow_status = {"finished": "FINISHED", "failed": "FAILED", "diverged": "FAILED",
                         "stopped": "KILLED"}.get(status, "FINISHED")
        try:
            self._client.set_terminated(self.run_id, mlflow_status)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not mark MLflow run %s %s: %s", self.run_id, mlflow_status, short_error(exc))

    # ---------------------------------------------------------------- internals

    def _write_run_file(self) -> None:
        from basics.files import atomic_write_json

        atomic_write_json(self.run_file, {"run_id": self.run_id, "experiment": self.experiment,
                                          "run_name": self.run_name, "tracking_uri": self.tracking_uri})

    def _connect(self, raise_errors: bool = False) -> None:
        try:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=self.tracking_uri)
            if self.run_id is None:
                exp = client.get_experiment_by_name(self.experiment)
                exp_id = exp.experiment_id if exp else client.create_experiment(
                    self.experiment, artifact_location=artifact_location(self.tracking_uri))
                run = client.create_run(exp_id, run_name=self.run_name)
                self.run_id = run.info.run_id
                self._write_run_file()
            else:
                run = client.get_run(self.run_id)
                if run.info.status != "RUNNING":
                    client.update_run(self.run_id, status="RUNNING")
                self._load_high_water(client, run)
            self._client = client
            self._offline_since = None
        except Exception as exc:  # noqa: BLE001
            self._client = None
            self._offline_since = time.monotonic()
            log.warning("MLflow at %s unreachable (%s); metrics go to %s until it is back",
                        self.tracking_uri, short_error(exc), self.spool)
            if raise_errors:
                raise

    def _load_high_water(self, client: Any, run: Any) -> None:
        for key in run.data.metrics:
            history = client.get_metric_history(self.run_id, key)
            if history:
                self.high_water[key] = max(self.high_water.get(key, -1), max(m.step for m in history))

    def _send(self, metrics: list[tuple[str, int, float, int]], tags: dict[str, str], params: dict[str, str]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        points = filter_new_points(metrics, dict(self.high_water))
        tag_items = [RunTag(k, v) for k, v in tags.items()]
        param_items = [Param(k, v) for k, v in params.items()]
        while points or tag_items or param_items:
            chunk_m, points = points[:MAX_METRICS_PER_BATCH], points[MAX_METRICS_PER_BATCH:]
            chunk_t, tag_items = tag_items[:MAX_TAGS_PER_BATCH], tag_items[MAX_TAGS_PER_BATCH:]
            room = MAX_METRICS_PER_BATCH - len(chunk_m) - len(chunk_t)
            chunk_p, param_items = param_items[: min(MAX_PARAMS_PER_BATCH, room)], param_items[min(MAX_PARAMS_PER_BATCH, room) :]
            try:
                self._client.log_batch(self.run_id, metrics=[Metric(k, v, ts, s) for k, s, v, ts in chunk_m],
                                       params=chunk_p, tags=chunk_t)
            except Exception as exc:
                # A param logged earlier with another value (MLflow params are immutable) must
                # not block metrics forever: retry without params.
                if chunk_p and "param" in str(exc).lower() and ("changing" in str(exc).lower() or "already" in str(exc).lower()):
                    self._client.log_batch(self.run_id, metrics=[Metric(k, v, ts, s) for k, s, v, ts in chunk_m],
                                           params=[], tags=chunk_t)
                else:
                    raise
            self.calls += 1
            for k, s, _, _ in chunk_m:  # acknowledged: advance the marks
                self.high_water[k] = max(self.high_water.get(k, -1), s)

    def _spool_pending(self) -> None:
        if not (self._pending_metrics or self._pending_tags or self._pending_params):
            return
        with open(self.spool, "a") as fh:
            for k, s, v, ts in self._pending_metrics:
                fh.write(json.dumps({"t": "m", "k": k, "s": s, "v": v, "ts": ts}) + "\n")
            for k, text in self._pending_tags.items():
                fh.write(json.dumps({"t": "tag", "k": k, "v": text}) + "\n")
            for k, text in self._pending_params.items():
                fh.write(json.dumps({"t": "param", "k": k, "v": text}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self._pending_metrics, self._pending_tags, self._pending_params = [], {}, {}

    def _replay_spool_file(self) -> int:
        if not self.spool.exists():
            return 0
        records, _ = read_jsonl_tolerant(self.spool)
        # Refresh the marks from the server: a request that timed out may have landed.
        self._load_high_water(self._client, self._client.get_run(self.run_id))
        metrics = [(r["k"], r["s"], r["v"], r["ts"]) for r in records if r["t"] == "m"]
        tags = {r["k"]: r["v"] for r in records if r["t"] == "tag"}
        params = {r["k"]: r["v"] for r in records if r["t"] == "param"}
        self._send(metrics, tags, params)
        self.spool.unlink()
        log.info("replayed %d spooled MLflow points from %s", len(metrics), self.spool)
        return len(metrics)
