"""A credential per training job (issue 28 item 3) against a real `mlflow server --app-name
basic-auth` (default permission READ): the broker (`pipelines.trusted.job_identity`, admin
credential) makes one user per job with EDIT on the job's own experiment only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.trusted import job_identity as jc
from tests.infra.mlflow_auth_server import MlflowAuthServer
from validation.environment import scoped_environ
from validation.errors import UsageError


def as_user(cred: jc.JobCredential | tuple[str, str]):  # noqa: ANN201 - a context manager
    user = (cred.username, cred.password) if isinstance(cred, jc.JobCredential) else cred
    return scoped_environ(MLFLOW_TRACKING_USERNAME=user[0], MLFLOW_TRACKING_PASSWORD=user[1])


def denied(fn: object) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        fn()  # type: ignore[operator]
    except MlflowException as exc:
        return "403" in str(exc) or "PERMISSION_DENIED" in str(exc)
    return False


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowAuthServer]:
    with MlflowAuthServer(tmp_path_factory.mktemp("mlflow-auth")) as srv:
        yield srv


def test_a_job_user_writes_only_its_own_runs_and_is_gone_after_revoke(server: MlflowAuthServer) -> None:
    from mlflow.server import get_app_client
    from mlflow.tracking import MlflowClient

    uri, admin = server.uri, server.admin
    client = MlflowClient(uri)
    # An earlier job's run became the champion; its user was revoked when that job ended.
    old = jc.create(tracking_uri=uri, admin=admin, workflow_run_id=100, attempt=1, experiment="exp-a")
    with as_user(old):
        champion = client.create_run(old.experiment_id).info.run_id
        client.log_metric(champion, "eval/loss", 2.0)
    assert jc.revoke(tracking_uri=uri, admin=admin, username=old.username)
    # Two jobs of the same experiment name (two PRs, or two /train of one PR) at once.
    a = jc.create(tracking_uri=uri, admin=admin, workflow_run_id=101, attempt=1, experiment="exp-a")
    b = jc.create(tracking_uri=uri, admin=admin, workflow_run_id=102, attempt=1, experiment="exp-a")
    with as_user(admin):
        store = client.create_experiment("pipeline-provenance")
    with as_user(b):
        b_run = client.create_run(b.experiment_id).info.run_id
    with as_user(a):
        own = client.create_run(a.experiment_id, tags={"pipeline.github_run_id": "101"}).info.run_id
        client.log_metric(own, "train/loss", 1.5)  # its own run
        client.set_terminated(own, "FINISHED")
        assert client.get_run(champion).data.metrics == {"eval/loss": 2.0}  # it may read
        assert denied(lambda: client.log_metric(b_run, "train/loss", 9.9))  # another job's run
        assert denied(lambda: client.set_tag(champion, "k", "v"))  # the champion's run
        assert denied(lambda: client.log_metric(champion, "eval/loss", 0.1))
        assert denied(lambda: client.create_run(b.experiment_id))  # another job's experiment
        assert denied(lambda: client.create_run(store))  # the provenance store
        auth = get_app_client("basic-auth", tracking_uri=uri)
        assert denied(lambda: auth.update_user_password(b.username, "stolen-password-0123"))
        assert denied(lambda: auth.grant_user_permission(a.username, "experiment", b.experiment_id, "EDIT"))
    with as_user(b):
        client.log_metric(b_run, "train/loss", 1.0)  # B's password still works
    # The broker refuses an experiment someone made first (a job user can create experiments).
    with as_user(a):
        client.create_experiment(jc.job_experiment(103, 1, "exp-a"))
    with pytest.raises(UsageError, match="exists already"):
        jc.create(tracking_uri=uri, admin=admin, workflow_run_id=103, attempt=1, experiment="exp-a")
    assert jc.revoke(tracking_uri=uri, admin=admin, username=a.username)
    assert not jc.revoke(tracking_uri=uri, admin=admin, username=a.username)  # idempotent
    with as_user(a), pytest.raises(Exception, match="401|nauthorized|credentials"):
        client.get_run(own)
    with as_user(admin):
        assert client.get_run(own).data.metrics == {"train/loss": 1.5}  # its runs stay



def test_the_workflow_commands_create_open_and_revoke(server: MlflowAuthServer, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`pipeline job-credential create` (broker job) -> the sealed output -> the GPU job's
    `open` step -> `pipeline job-credential revoke` (cleanup job), as experiment-train.yml runs them."""
    import json

    from cryptography.fernet import Fernet
    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from pipelines.cli import app

    key = Fernet.generate_key().decode()
    out, env_file = tmp_path / "out", tmp_path / "env"
    for name, value in {"MLFLOW_TRACKING_URI": server.uri, "MLFLOW_ADMIN_USERNAME": server.admin[0],
                        "MLFLOW_ADMIN_PASSWORD": server.admin[1], jc.KEY_ENV: key, "GITHUB_OUTPUT": str(out),
                        "GITHUB_RUN_ID": "300", "GITHUB_RUN_ATTEMPT": "2"}.items():
        monkeypatch.setenv(name, value)
    created = CliRunner().invoke(app, ["job-credential", "create", "--experiments", '["exp-c"]'])
    assert created.exit_code == 0, created.output
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert json.loads(outputs["users"]) == ["job-300-2-exp-c"]
    monkeypatch.setenv("JOB_CREDENTIAL_TOKENS", outputs["tokens"])  # the workflow passes the whole map
    monkeypatch.setenv("GITHUB_ENV", str(env_file))
    assert jc.main(["open", "--experiment", "exp-c"]) == 0
    given = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    assert given[jc.EXPERIMENT_ENV] == "exp-c/job-300-2"
    with as_user((given["MLFLOW_TRACKING_USERNAME"], given["MLFLOW_TRACKING_PASSWORD"])):
        client = MlflowClient(server.uri)
        run = client.create_run(client.get_experiment_by_name(given[jc.EXPERIMENT_ENV]).experiment_id)
        client.log_metric(run.info.run_id, "train/loss", 1.0)
    revoked = CliRunner().invoke(app, ["job-credential", "revoke", "--experiments", '["exp-c"]',
                                       "--users", outputs["users"]])
    assert revoked.exit_code == 0 and "job-300-2-exp-c: deleted" in revoked.output, revoked.output
    with as_user((given["MLFLOW_TRACKING_USERNAME"], given["MLFLOW_TRACKING_PASSWORD"])), \
            pytest.raises(Exception, match="401|nauthorized|credentials"):
        MlflowClient(server.uri).get_run(run.info.run_id)
