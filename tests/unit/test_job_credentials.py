"""The per-job MLflow credential's pure parts (pipelines/trusted/job_identity.py) and the
places that honour the job's experiment; the server side is tests/integration/test_github_job_credentials.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.trusted import job_identity as jc
from validation.errors import UsageError


def test_the_sealed_credential_opens_only_for_its_job(tmp_path: Path) -> None:
    from cryptography.fernet import Fernet

    key = Fernet.generate_key().decode()
    cred = jc.JobCredential("job-7-1-exp-a", "pw", jc.job_experiment(7, 1, "exp-a"), "3", 7)
    token = jc.seal(cred, key)
    env = tmp_path / "env"
    assert jc.open_into_env(token, key, workflow_run_id=7, experiment="exp-a", env_file=str(env)) == cred
    assert env.read_text().splitlines() == ["MLFLOW_TRACKING_USERNAME=job-7-1-exp-a", "MLFLOW_TRACKING_PASSWORD=pw",
                                            "PIPELINE_MLFLOW_EXPERIMENT=exp-a/job-7-1"]
    with pytest.raises(UsageError, match="another job"):
        jc.unseal(token, key, workflow_run_id=8, experiment="exp-a")
    with pytest.raises(UsageError, match="another job"):
        jc.unseal(token, key, workflow_run_id=7, experiment="exp-b")
    with pytest.raises(UsageError, match="does not open"):
        jc.unseal(token, Fernet.generate_key().decode(), workflow_run_id=7, experiment="exp-a")
    with pytest.raises(UsageError, match="not a Fernet key"):
        jc.seal(cred, "short")


def test_names_are_validated_and_bound_to_the_workflow_run() -> None:
    assert jc.job_user(12, 2, "exp-a") == "job-12-2-exp-a"
    assert jc.is_job_experiment("exp-a/job-12-3", "exp-a", 12)
    for name in ("exp-a/job-13-1", "exp-a/job-12-0", "exp-ab/job-12-1", "exp-a", "x/exp-a/job-12-1"):
        assert not jc.is_job_experiment(name, "exp-a", 12), name
    for bad in ((0, 1, "exp-a"), (1, 1, "Exp\nA"), (1, 0, "exp-a")):
        with pytest.raises(UsageError):
            jc.job_user(*bad)
    assert jc.parse_experiments('["a", "b", "a"]') == ["a", "b"]
    with pytest.raises(UsageError, match="--experiments"):
        jc.parse_experiments('["../x"]')


def test_attestation_accepts_the_jobs_own_experiment_only() -> None:
    from pipelines.trusted.provenance import check_training_run

    tags = {"pipeline.git_sha": "a" * 40, "pipeline.github_run_id": "12"}
    kw = {"run_id": "r", "tags": tags, "experiment": "exp-a", "sha": "a" * 40, "workflow_run_id": 12}
    assert check_training_run(experiment_name="exp-a/job-12-1", **kw) == []
    assert check_training_run(experiment_name="exp-a", **kw) == []
    assert check_training_run(experiment_name="exp-a/job-11-1", **kw)


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
