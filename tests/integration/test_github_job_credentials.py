"""An MLflow identity per launch, bound to GitHub's OIDC token (issue 36), against a real
`mlflow server --app-name basic-auth` (default permission READ) whose authorization function is
pipelines/trusted/mlflow_oidc.py, and an emulated GitHub OIDC issuer (tests/infra/oidc_issuer.py).

The trusted `job-identity` job (admin credential) makes the launch's user and its job
experiments; the training job has no password: its requests carry its own OIDC token, fetched
through the same provider the workflow configures (`MLFLOW_TRACKING_AUTH=github-oidc`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from basics.environment import scoped_environ
from basics.errors import UsageError
from pipelines.trusted import job_identity as jc
from tests.infra.mlflow_auth_server import MlflowAuthServer
from tests.infra.oidc_issuer import OidcIssuer

REPO = "acme/lab"
WORKFLOW = f"{REPO}/.github/workflows/experiment-train.yml@refs/heads/main"


def job_claims(run_id: int, attempt: int = 1, **overrides: str) -> dict[str, str]:
    return {"repository": REPO, "repository_owner": "acme", "run_id": str(run_id), "run_attempt": str(attempt),
            "job_workflow_ref": WORKFLOW, "workflow_ref": WORKFLOW, "environment": "gpu-training",
            "ref": "refs/heads/main", **overrides}


def denied(fn: Any) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        fn()
    except MlflowException as exc:
        return any(code in str(exc) for code in ("401", "403", "PERMISSION_DENIED", "UNAUTHENTICATED"))
    return False


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MlflowAuthServer, OidcIssuer]]:
    with OidcIssuer() as issuer, MlflowAuthServer(tmp_path_factory.mktemp("mlflow-oidc"), oidc={
            "PIPELINE_OIDC_ISSUER": issuer.issuer, "PIPELINE_OIDC_REPOSITORY": REPO,
            "PIPELINE_OIDC_WORKFLOW_REF": WORKFLOW}) as srv:
        yield srv, issuer


def as_admin(server: MlflowAuthServer):  # noqa: ANN201 - a context manager
    return scoped_environ(MLFLOW_TRACKING_USERNAME=server.admin[0], MLFLOW_TRACKING_PASSWORD=server.admin[1],
                          MLFLOW_TRACKING_AUTH=None, MLFLOW_TRACKING_TOKEN=None)


def as_job(issuer: OidcIssuer, claims: dict[str, str]):  # noqa: ANN201 - a context manager
    """The training job's environment: no password, its OIDC request URL and token, the provider."""
    url, request_token = issuer.register_job(claims)
    return scoped_environ(MLFLOW_TRACKING_USERNAME=None, MLFLOW_TRACKING_PASSWORD=None, MLFLOW_TRACKING_TOKEN=None,
                          MLFLOW_TRACKING_AUTH="github-oidc", ACTIONS_ID_TOKEN_REQUEST_URL=url,
                          ACTIONS_ID_TOKEN_REQUEST_TOKEN=request_token)


def with_token(token: str):  # noqa: ANN201 - a context manager
    return scoped_environ(MLFLOW_TRACKING_USERNAME=None, MLFLOW_TRACKING_PASSWORD=None, MLFLOW_TRACKING_AUTH=None,
                          MLFLOW_TRACKING_TOKEN=token)


def _fresh_provider_cache() -> None:
    from pipelines.github import oidc_token

    oidc_token._CACHE._expires = 0.0  # each scene is another job: its own token


def test_a_launch_writes_only_its_own_runs_creates_nothing_and_is_gone_after_revoke(
        lab: tuple[MlflowAuthServer, OidcIssuer]) -> None:
    from mlflow.server import get_app_client
    from mlflow.tracking import MlflowClient

    server, issuer = lab
    uri, admin = server.uri, server.admin
    client = MlflowClient(uri)
    # An earlier launch's run became the champion; its user was revoked when that launch ended.
    old = jc.create(tracking_uri=uri, admin=admin, workflow_run_id=100, attempt=1, experiments=["exp-a"])
    _fresh_provider_cache()
    with as_job(issuer, job_claims(100)):
        champion = client.create_run(old.experiments["exp-a"]).info.run_id
        client.log_metric(champion, "eval/loss", 2.0)
    assert jc.revoke(tracking_uri=uri, admin=admin, username=old.username)[-1].endswith("deleted (its runs stay, read-only)")
    # Two launches of the same experiment name (two PRs, or two /train of one PR) at once.
    a = jc.create(tracking_uri=uri, admin=admin, workflow_run_id=101, attempt=1, experiments=["exp-a"])
    b = jc.create(tracking_uri=uri, admin=admin, workflow_run_id=102, attempt=1, experiments=["exp-a"])
    with as_admin(server):
        store = client.create_experiment("pipeline-provenance")
    _fresh_provider_cache()
    with as_job(issuer, job_claims(102)):
        b_run = client.create_run(b.experiments["exp-a"]).info.run_id
    _fresh_provider_cache()
    with as_job(issuer, job_claims(101)):
        own = client.create_run(a.experiments["exp-a"], tags={"pipeline.github_run_id": "101"}).info.run_id
        client.log_metric(own, "train/loss", 1.5)  # its own run
        client.set_terminated(own, "FINISHED")
        assert client.get_run(champion).data.metrics == {"eval/loss": 2.0}  # it may read
        assert denied(lambda: client.log_metric(b_run, "train/loss", 9.9))  # another launch's run
        assert denied(lambda: client.set_tag(champion, "k", "v"))  # the champion's run
        assert denied(lambda: client.create_run(b.experiments["exp-a"]))  # another launch's experiment
        assert denied(lambda: client.create_run(store))  # the provenance store
        # Nothing it could leave behind: no experiment (a planted job experiment of a later
        # launch), no grant (sharing with a standing login), no deletion, no model.
        assert denied(lambda: client.create_experiment(jc.job_experiment(103, 1, "exp-a")))
        auth = get_app_client("basic-auth", tracking_uri=uri)
        assert denied(lambda: auth.grant_user_permission("someone", "experiment", a.experiments["exp-a"], "MANAGE"))
        assert denied(lambda: auth.update_user_password(b.username, "stolen-password-0123"))
        assert denied(lambda: client.delete_run(own))
        assert denied(lambda: client.create_registered_model("gitops-train"))
    # Revoked: its token maps to a user that no longer exists.
    assert jc.revoke(tracking_uri=uri, admin=admin, username=a.username)
    assert jc.revoke(tracking_uri=uri, admin=admin, username=a.username) == [f"{a.username}: not there"]
    _fresh_provider_cache()
    with as_job(issuer, job_claims(101)):
        assert denied(lambda: client.log_metric(own, "train/loss", 0.1))
    with as_admin(server):
        assert client.get_run(own).data.metrics == {"train/loss": 1.5}  # its runs stay
    # A launch whose job experiment someone made first is refused by the trusted job.
    with as_admin(server):
        client.create_experiment(jc.job_experiment(104, 1, "exp-a"))
    with pytest.raises(UsageError, match="exists already"):
        jc.create(tracking_uri=uri, admin=admin, workflow_run_id=104, attempt=1, experiments=["exp-a"])


@pytest.mark.parametrize("claims", [
    job_claims(105, job_workflow_ref=f"{REPO}/.github/workflows/experiment-train.yml@refs/pull/7/merge"),
    job_claims(105, job_workflow_ref=f"{REPO}/.github/workflows/experiment-pr.yml@refs/heads/main"),
    job_claims(105, repository="mallory/lab"),
    job_claims(105, environment="provenance"),
], ids=["a PR's copy of the workflow", "another workflow", "another repository", "another environment"])
def test_a_token_of_any_other_job_is_refused(lab: tuple[MlflowAuthServer, OidcIssuer], claims: dict[str, str]) -> None:
    from mlflow.tracking import MlflowClient

    server, issuer = lab
    made = jc.create(tracking_uri=server.uri, admin=server.admin, workflow_run_id=int(claims["run_id"]) + len(
        issuer.issued), attempt=1, experiments=["exp-b"])
    claims = {**claims, "run_id": made.username.split("-")[1]}
    with with_token(issuer.mint(claims, "gitops-train-mlflow")):
        assert denied(lambda: MlflowClient(server.uri).create_run(made.experiments["exp-b"]))


def test_a_forged_expired_or_misaddressed_token_is_refused(lab: tuple[MlflowAuthServer, OidcIssuer]) -> None:
    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa
    from mlflow.tracking import MlflowClient

    server, issuer = lab
    made = jc.create(tracking_uri=server.uri, admin=server.admin, workflow_run_id=200, attempt=1, experiments=["exp-c"])
    client = MlflowClient(server.uri)
    good = issuer.mint(job_claims(200), "gitops-train-mlflow")
    with with_token(good):
        client.create_run(made.experiments["exp-c"])  # the genuine token works
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = jwt.encode(jwt.decode(good, options={"verify_signature": False}), other_key, algorithm="RS256",
                        headers={"kid": issuer.kid})
    stale = dict(jwt.decode(good, options={"verify_signature": False}), exp=1, iat=0, nbf=0)
    for token in (forged, issuer.mint(job_claims(200), "another-audience"),
                  jwt.encode(stale, issuer._key, algorithm="RS256", headers={"kid": issuer.kid})):
        with with_token(token):
            assert denied(lambda: client.create_run(made.experiments["exp-c"]))


def test_the_workflow_commands_hand_on_nothing_secret(lab: tuple[MlflowAuthServer, OidcIssuer], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`pipeline job-identity create` (job-identity job) -> outputs -> `pipeline job-identity
    revoke` (revoke-identity job), as experiment-train.yml runs them: the outputs name the user
    only, and the training job's identity is its OIDC token."""
    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from pipelines.cli import app

    server, issuer = lab
    out = tmp_path / "out"
    for name, value in {"MLFLOW_TRACKING_URI": server.uri, "MLFLOW_ADMIN_USERNAME": server.admin[0],
                        "MLFLOW_ADMIN_PASSWORD": server.admin[1], "GITHUB_OUTPUT": str(out),
                        "GITHUB_RUN_ID": "300", "GITHUB_RUN_ATTEMPT": "2"}.items():
        monkeypatch.setenv(name, value)
    created = CliRunner().invoke(app, ["job-identity", "create", "--experiments", '["exp-d", "exp-e"]'])
    assert created.exit_code == 0, created.output
    assert out.read_text().splitlines() == ['users=["job-300-2"]']  # no password, no token
    _fresh_provider_cache()
    with as_job(issuer, job_claims(300, attempt=2)):
        client = MlflowClient(server.uri)
        run = client.create_run(client.get_experiment_by_name("exp-e/job-300-2").experiment_id)
        client.log_metric(run.info.run_id, "train/loss", 1.0)
    revoked = CliRunner().invoke(app, ["job-identity", "revoke", "--users", json.dumps(["job-300-2"])])
    assert revoked.exit_code == 0 and "job-300-2: deleted" in revoked.output, revoked.output
    _fresh_provider_cache()
    with as_job(issuer, job_claims(300, attempt=2)):
        assert denied(lambda: MlflowClient(server.uri).log_metric(run.info.run_id, "train/loss", 0.5))
