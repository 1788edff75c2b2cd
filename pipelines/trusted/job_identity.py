"""One MLflow identity per launch, bound to its workflow run by GitHub's OIDC token.

MLflow's basic-auth app (3.17) grants permissions per experiment (and registered model,
prompt, ...); a run has no permission of its own (its experiment's applies). So each launch's
training jobs get experiments of their own, made by trusted code:

- `create` (the `job-identity` job: GitHub-hosted, default-branch code, the MLflow admin
  credential): the user `job-<workflow run>-<attempt>` with a random password that is thrown
  away at once (no one ever logs in with it), per experiment of the launch the experiment
  `<experiment>/job-<workflow run>-<attempt>` made by the admin (refused when it exists: someone
  made it first), and EDIT on exactly those experiments. The server's default permission (READ)
  is all the user has elsewhere.
- The training job never receives a secret: it asks GitHub for an OIDC token of its own job
  (`id-token: write`, pipelines/github/oidc_token.py), and the MLflow server maps a token of
  this repository's default-branch experiment-train.yml in the `gpu-training` environment to
  that user (pipelines/trusted/mlflow_oidc.py), allowing run logging only: no experiment,
  registered model or permission can be created or changed by a job identity.
- `revoke` (an `always()` job after training): deletes the user; its runs stay, read-only. It
  also deletes any experiment the user holds MANAGE on and any grant it holds besides its job
  experiments (none can exist while the server runs the check above; a server that ran without
  it is cleaned up here).
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from basics.errors import UsageError
from pipelines.trusted.mlflow_oidc import JOB_USER_PREFIX, IdentityRefused
from pipelines.trusted.mlflow_oidc import job_user as _job_user

EXPERIMENT_ENV = "PIPELINE_MLFLOW_EXPERIMENT"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")  # experiment names are validated slugs


def job_user(workflow_run_id: int, attempt: int) -> str:
    """The launch's MLflow user (what the server maps the job's OIDC token to)."""
    try:
        return _job_user(workflow_run_id, attempt)
    except IdentityRefused as exc:
        raise UsageError(f"job identity: {exc}") from None


def job_experiment(workflow_run_id: int, attempt: int, experiment: str) -> str:
    """The MLflow experiment every run of one training job is logged in."""
    job_user(workflow_run_id, attempt)
    if not _NAME.match(experiment):
        raise UsageError(f"job identity: bad experiment {experiment[:100]!r}")
    return f"{experiment}/job-{int(workflow_run_id)}-{int(attempt)}"


def is_job_experiment(name: str, experiment: str, workflow_run_id: int, attempt: int) -> bool:
    """Whether `name` is the job experiment of `experiment` in exactly this launch (run and attempt)."""
    return name == f"{experiment}/job-{int(workflow_run_id)}-{int(attempt)}"


@dataclass(frozen=True)
class LaunchIdentity:
    username: str
    experiments: dict[str, str]
    """experiment -> its job experiment's MLflow id."""


@contextmanager
def _as(user: tuple[str, str]) -> Iterator[None]:
    from basics.environment import scoped_environ

    with scoped_environ(MLFLOW_TRACKING_USERNAME=user[0], MLFLOW_TRACKING_PASSWORD=user[1], MLFLOW_TRACKING_AUTH=None):
        yield


def create(*, tracking_uri: str, admin: tuple[str, str], workflow_run_id: int, attempt: int,
           experiments: list[str]) -> LaunchIdentity:
    """The launch's user, its job experiments (made by the admin) and EDIT on them; nothing else."""
    from mlflow.exceptions import MlflowException
    from mlflow.server import get_app_client
    from mlflow.tracking import MlflowClient

    username = job_user(workflow_run_id, attempt)
    names = {e: job_experiment(workflow_run_id, attempt, e) for e in experiments}
    with _as(admin):
        auth = get_app_client("basic-auth", tracking_uri=tracking_uri)
        client = MlflowClient(tracking_uri=tracking_uri)
        for name in names.values():
            if client.get_experiment_by_name(name) is not None:
                raise UsageError(f"MLflow experiment {name!r} exists already: someone made it before this launch; "
                                 "refusing to hand it to the job (delete it as admin, then /retry)")
        try:
            # The password is never written anywhere: the job authenticates by its OIDC token.
            auth.create_user(username, secrets.token_urlsafe(32))
        except MlflowException as exc:
            raise UsageError(f"cannot create MLflow user {username}: {exc.message}") from None
        ids = {}
        for experiment, name in names.items():
            exp_id = str(client.create_experiment(name, tags={"pipeline.job_user": username,
                                                              "pipeline.github_run_id": str(int(workflow_run_id)),
                                                              "pipeline.github_run_attempt": str(int(attempt))}))
            auth.grant_user_permission(username, "experiment", exp_id, "EDIT")
            ids[experiment] = exp_id
    return LaunchIdentity(username, ids)


def revoke(*, tracking_uri: str, admin: tuple[str, str], username: str) -> list[str]:
    """Delete the launch's user and whatever it made or shared; what was done, one line each."""
    from mlflow.exceptions import MlflowException
    from mlflow.server import get_app_client
    from mlflow.tracking import MlflowClient

    if not username.startswith(JOB_USER_PREFIX):
        raise UsageError(f"{username[:100]!r} is not a job user ({JOB_USER_PREFIX}...): not deleted")
    done: list[str] = []
    with _as(admin):
        auth = get_app_client("basic-auth", tracking_uri=tracking_uri)
        client = MlflowClient(tracking_uri=tracking_uri)
        try:
            auth.get_user(username)
        except MlflowException:
            return [f"{username}: not there"]
        # Experiments the user holds MANAGE on were made by it (job experiments are made by the admin,
        # who grants EDIT): a server without the job-identity check let it create them. Delete them.
        for exp in client.search_experiments(max_results=10_000):
            try:
                perm = auth.get_user_permission(username, "experiment", str(exp.experiment_id)).permission
            except MlflowException:
                continue
            if perm == "MANAGE":
                client.delete_experiment(exp.experiment_id)
                done.append(f"{username}: deleted experiment {exp.experiment_id} it had made")
        auth.delete_user(username)
        done.append(f"{username}: deleted (its runs stay, read-only)")
    return done


def admin_from_env() -> tuple[str, str]:
    user, password = os.environ.get("MLFLOW_ADMIN_USERNAME", "admin"), os.environ.get("MLFLOW_ADMIN_PASSWORD", "")
    if not password:
        raise UsageError("MLFLOW_ADMIN_PASSWORD is not set (the job-identity environment holds the admin credential)")
    return user, password


def has_users(tracking_uri: str | None) -> bool:
    """Whether the tracking store is a server (with users); a local store (sqlite, files) has none."""
    return (tracking_uri or "").startswith(("http://", "https://"))


def parse_experiments(text: str) -> list[str]:
    """`authorize`'s `experiments` output (a JSON list of validated names)."""
    try:
        names = json.loads(text)
    except ValueError:
        names = None
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and _NAME.match(n) for n in names):
        raise UsageError(f"--experiments: not a JSON list of experiment names: {text[:100]!r}")
    return list(dict.fromkeys(names))


def github_output(name: str, value: str, path: str | None = None) -> None:
    """One single-line output of this step (`$GITHUB_OUTPUT`)."""
    assert "\n" not in value and "\r" not in value
    target = path or os.environ.get("GITHUB_OUTPUT")
    if not target:
        raise UsageError("GITHUB_OUTPUT is not set (run in GitHub Actions, or pass the file)")
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(f"{name}={value}\n")
