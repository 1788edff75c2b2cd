"""The per-launch MLflow identity's pure parts (pipelines/trusted/job_identity.py) and the
places that honour the job's experiment; the server side is tests/integration/test_github_job_credentials.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from basics.errors import UsageError
from pipelines.trusted import job_identity as jc


def test_names_are_validated_and_bound_to_the_launch() -> None:
    assert jc.job_user(12, 2) == "job-12-2"
    assert jc.job_experiment(12, 3, "exp-a") == "exp-a/job-12-3"
    assert jc.is_job_experiment("exp-a/job-12-3", "exp-a", 12, 3)
    # Issue 36: any attempt of the run was accepted; another attempt is another launch.
    for name in ("exp-a/job-12-1", "exp-a/job-13-3", "exp-ab/job-12-3", "exp-a", "x/exp-a/job-12-3"):
        assert not jc.is_job_experiment(name, "exp-a", 12, 3), name
    for bad in ((0, 1), (1, 0)):
        with pytest.raises(UsageError):
            jc.job_user(*bad)
    with pytest.raises(UsageError):
        jc.job_experiment(1, 1, "Exp\nA")
    assert jc.parse_experiments('["a", "b", "a"]') == ["a", "b"]
    with pytest.raises(UsageError, match="--experiments"):
        jc.parse_experiments('["../x"]')


def test_attestation_accepts_this_launchs_own_experiment_only() -> None:
    """Issue 36: attest accepted a plain `<experiment>` (which any job could create and fill)
    and a job experiment of any attempt."""
    from pipelines.trusted.provenance import check_training_run

    tags = {"pipeline.git_sha": "a" * 40, "pipeline.github_run_id": "12"}
    kw = {"run_id": "r", "tags": tags, "experiment": "exp-a", "sha": "a" * 40, "workflow_run_id": 12, "attempt": 2}
    assert check_training_run(experiment_name="exp-a/job-12-2", **kw) == []
    assert check_training_run(experiment_name="exp-a", **kw)
    assert check_training_run(experiment_name="exp-a/job-12-1", **kw)
    assert check_training_run(experiment_name="exp-a/job-11-2", **kw)
    # A local store (a laptop) has one identity: its runs are in `<experiment>`.
    assert check_training_run(experiment_name="exp-a", server=False, **kw) == []


def test_the_mlflow_sink_logs_to_the_jobs_experiment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from trainer import metric_sinks
    from trainer.metric_sinks import RUN_FILE, MlflowSink

    monkeypatch.setattr(metric_sinks, "_quiet_http", lambda: None)  # it sets process-wide defaults
    monkeypatch.setattr(MlflowSink, "_connect", lambda self, raise_errors=False: None)  # no server here
    (tmp_path / RUN_FILE).write_text(json.dumps({"run_id": "r-earlier", "experiment": "exp-a/job-11-1"}))
    monkeypatch.setenv(jc.EXPERIMENT_ENV, "exp-a/job-12-1")
    sink = MlflowSink("http://127.0.0.1:9", "exp-a", tmp_path)
    assert sink.experiment == "exp-a/job-12-1" and sink.run_id is None  # another job's run is not continued
    monkeypatch.delenv(jc.EXPERIMENT_ENV)
    assert MlflowSink("http://127.0.0.1:9", "exp-a", tmp_path).experiment == "exp-a"


def test_prepare_data_defaults_to_the_shared_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pipeline data prepare` and `pipeline smoke` pass no cache root: PIPELINE_DATA_CACHE applies."""
    from pipelines.dataprep import prepare

    seen = []

    def stop(data: object, repo: Path, cache_root: Path) -> None:
        seen.append(cache_root)
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare, "compute_version", stop)
    monkeypatch.setenv("PIPELINE_DATA_CACHE", str(tmp_path / "shared"))
    with pytest.raises(KeyboardInterrupt):
        prepare.prepare_data(object(), tmp_path / "repo")  # type: ignore[arg-type]
    monkeypatch.delenv("PIPELINE_DATA_CACHE")
    with pytest.raises(KeyboardInterrupt):
        prepare.prepare_data(object(), tmp_path / "repo")  # type: ignore[arg-type]
    assert seen == [(tmp_path / "shared").resolve(), (tmp_path / "repo" / "data" / "cache").resolve()]
