"""A credential per training job: an MLflow user that can write only that job's runs.

MLflow's basic-auth app (3.17) grants permissions per experiment (and registered model,
prompt, ...); a run has no permission of its own (its experiment's applies; `run` grants are
wildcard-only). So each training job gets an experiment of its own, made by trusted code:

- `create` (the `job-credentials` broker job, admin credential, default-branch code): user
  `job-<workflow run>-<attempt>-<experiment>` with a random password, the experiment
  `<experiment>/job-<workflow run>-<attempt>` made by the admin (refused when it exists:
  someone else made it first), and EDIT on exactly that experiment for the user. The server's
  default permission (READ) is all it has elsewhere: it cannot write another job's runs, the
  champion's training run, the provenance store or the registry, and a non-admin user can
  change only its own password. The flow logs every run of the job there
  (`PIPELINE_MLFLOW_EXPERIMENT`, read by `trainer.metric_sinks.MlflowSink`).
- The password reaches the GPU job as a Fernet token (`seal`/`unseal`) in the broker's job
  output, keyed by the `JOB_CREDENTIAL_KEY` secret (in the broker's and `gpu-training`'s
  environments) and bound to the workflow run and experiment. Job outputs are visible only
  to the jobs of the same workflow run; the key alone opens nothing another run made.
- `revoke` (an `always()` job after training): deletes the user; its runs stay, read-only.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from validation.errors import UsageError

EXPERIMENT_ENV = "PIPELINE_MLFLOW_EXPERIMENT"
KEY_ENV = "JOB_CREDENTIAL_KEY"
USER_PREFIX = "job-"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")  # experiment names are validated slugs
TOKEN_TTL_S = 4 * 24 * 3600  # the training job's timeout (72 h) and its queue time


def _check(workflow_run_id: int, attempt: int, experiment: str) -> None:
    if int(workflow_run_id) <= 0 or int(attempt) <= 0 or not _NAME.match(experiment):
        raise UsageError(f"job credential: bad workflow run {workflow_run_id!r}, attempt {attempt!r} or "
                         f"experiment {experiment[:100]!r}")


def job_user(workflow_run_id: int, attempt: int, experiment: str) -> str:
    _check(workflow_run_id, attempt, experiment)
    return f"{USER_PREFIX}{int(workflow_run_id)}-{int(attempt)}-{experiment}"


def job_experiment(workflow_run_id: int, attempt: int, experiment: str) -> str:
    """The MLflow experiment every run of one training job is logged in."""
    _check(workflow_run_id, attempt, experiment)
    return f"{experiment}/job-{int(workflow_run_id)}-{int(attempt)}"


def is_job_experiment(name: str, experiment: str, workflow_run_id: int) -> bool:
    """Whether `name` is a job experiment of `experiment` in this workflow run (any attempt)."""
    return re.fullmatch(rf"{re.escape(experiment)}/job-{int(workflow_run_id)}-[1-9][0-9]*", name) is not None


@dataclass(frozen=True)
class JobCredential:
    username: str
    password: str
    experiment: str
    """The job's own MLflow experiment (name)."""
    experiment_id: str
    workflow_run_id: int


@contextmanager
def _as(user: tuple[str, str]) -> Iterator[None]:
    from validation.environment import scoped_environ

    with scoped_environ(MLFLOW_TRACKING_USERNAME=user[0], MLFLOW_TRACKING_PASSWORD=user[1]):
        yield


def create(*, tracking_uri: str, admin: tuple[str, str], workflow_run_id: int, attempt: int,
           experiment: str) -> JobCredential:
    """The job's user, its experiment (made by the admin) and EDIT on it; nothing else."""
    from mlflow.exceptions import MlflowException
    from mlflow.server import get_app_client
    from mlflow.tracking import MlflowClient

    username = job_user(workflow_run_id, attempt, experiment)
    name = job_experiment(workflow_run_id, attempt, experiment)
    password = secrets.token_urlsafe(32)
    with _as(admin):
        auth = get_app_client("basic-auth", tracking_uri=tracking_uri)
        client = MlflowClient(tracking_uri=tracking_uri)
        if client.get_experiment_by_name(name) is not None:
            raise UsageError(f"MLflow experiment {name!r} exists already: someone made it before the broker; "
                             "refusing to hand it to the job (delete it as admin, then /retry)")
        try:
            auth.create_user(username, password)
        except MlflowException as exc:
            raise UsageError(f"cannot create MLflow user {username}: {exc.message}") from None
        exp_id = str(client.create_experiment(name, tags={"pipeline.job_user": username,
                                                          "pipeline.github_run_id": str(int(workflow_run_id))}))
        auth.grant_user_permission(username, "experiment", exp_id, "EDIT")
    return JobCredential(username, password, name, exp_id, int(workflow_run_id))


def revoke(*, tracking_uri: str, admin: tuple[str, str], username: str) -> bool:
    """Delete the job's user (its runs stay, read-only); False when there was none."""
    from mlflow.exceptions import MlflowException
    from mlflow.server import get_app_client

    if not username.startswith(USER_PREFIX):
        raise UsageError(f"{username[:100]!r} is not a job user ({USER_PREFIX}...): not deleted")
    with _as(admin):
        auth = get_app_client("basic-auth", tracking_uri=tracking_uri)
        try:
            auth.get_user(username)
        except MlflowException:
            return False
        auth.delete_user(username)
    return True


# --------------------------------------------------------------------------- the channel


def _fernet(key: str) -> Any:
    from cryptography.fernet import Fernet

    try:
        return Fernet(key.encode())
    except ValueError:
        raise UsageError(f"{KEY_ENV} is not a Fernet key (make one: python -c 'from cryptography.fernet "
                         "import Fernet; print(Fernet.generate_key().decode())')") from None


def seal(cred: JobCredential, key: str) -> str:
    """The credential as a token only a holder of the key opens (a job output)."""
    body = {"username": cred.username, "password": cred.password, "experiment": cred.experiment,
            "experiment_id": cred.experiment_id, "workflow_run_id": cred.workflow_run_id}
    token: bytes = _fernet(key).encrypt(json.dumps(body).encode())
    return token.decode()


def unseal(token: str, key: str, *, workflow_run_id: int, experiment: str) -> JobCredential:
    """Open a token: refused when it is not for this workflow run and experiment, or older than a job."""
    from cryptography.fernet import InvalidToken

    try:
        body = json.loads(_fernet(key).decrypt(token.encode(), ttl=TOKEN_TTL_S))
        cred = JobCredential(str(body["username"]), str(body["password"]), str(body["experiment"]),
                             str(body["experiment_id"]), int(body["workflow_run_id"]))
    except (InvalidToken, ValueError, KeyError, TypeError):
        raise UsageError("the job credential does not open with this key (or is older than a job)") from None
    if cred.workflow_run_id != int(workflow_run_id) or not is_job_experiment(cred.experiment, experiment,
                                                                             workflow_run_id):
        raise UsageError(f"the job credential is for another job ({cred.username}), not {experiment} "
                         f"of workflow run {workflow_run_id}")
    return cred


def admin_from_env() -> tuple[str, str]:
    user, password = os.environ.get("MLFLOW_ADMIN_USERNAME", "admin"), os.environ.get("MLFLOW_ADMIN_PASSWORD", "")
    if not password:
        raise UsageError("MLFLOW_ADMIN_PASSWORD is not set (the broker's environment holds the admin credential)")
    return user, password


# --------------------------------------------------------------------------- the workflow's steps


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


def create_for_launch(*, tracking_uri: str, admin: tuple[str, str], key: str, workflow_run_id: int, attempt: int,
                      experiments: list[str]) -> dict[str, str]:
    """experiment -> sealed credential of its training job (the broker job's output)."""
    _fernet(key)  # a bad key fails before any user is made
    return {name: seal(create(tracking_uri=tracking_uri, admin=admin, workflow_run_id=workflow_run_id,
                              attempt=attempt, experiment=name), key) for name in experiments}


def github_output(name: str, value: str, path: str | None = None) -> None:
    """One single-line output of this step (`$GITHUB_OUTPUT`)."""
    assert "\n" not in value and "\r" not in value
    target = path or os.environ.get("GITHUB_OUTPUT")
    if not target:
        raise UsageError("GITHUB_OUTPUT is not set (run in GitHub Actions, or pass the file)")
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(f"{name}={value}\n")


def open_into_env(token: str, key: str, *, workflow_run_id: int, experiment: str, env_file: str) -> JobCredential:
    """The GPU job's step: mask the password in the log, then hand the credential and the
    job's experiment to the later steps (`$GITHUB_ENV`)."""
    cred = unseal(token, key, workflow_run_id=workflow_run_id, experiment=experiment)
    print(f"::add-mask::{cred.password}", flush=True)
    with open(env_file, "a", encoding="utf-8") as fh:
        fh.write(f"MLFLOW_TRACKING_USERNAME={cred.username}\nMLFLOW_TRACKING_PASSWORD={cred.password}\n"
                 f"{EXPERIMENT_ENV}={cred.experiment}\n")
    return cred


def main(argv: list[str] | None = None) -> int:
    """`python job_credentials.py open --experiment NAME` (the GPU job, a copy of the default
    branch's file): the token from $JOB_CREDENTIAL_TOKEN, or this experiment's from the broker's
    JSON map in $JOB_CREDENTIAL_TOKENS; the key from $JOB_CREDENTIAL_KEY."""
    import argparse

    parser = argparse.ArgumentParser(prog="job_credentials.py")
    sub = parser.add_subparsers(dest="command", required=True)
    opened = sub.add_parser("open", help="the job's credential into $GITHUB_ENV")
    opened.add_argument("--experiment", required=True)
    args = parser.parse_args(argv)
    env = dict(os.environ)
    try:
        if not env.get("JOB_CREDENTIAL_TOKEN") and env.get("JOB_CREDENTIAL_TOKENS"):
            try:
                tokens = json.loads(env["JOB_CREDENTIAL_TOKENS"])
            except ValueError:
                tokens = None
            if not isinstance(tokens, dict):
                raise UsageError("JOB_CREDENTIAL_TOKENS is not the broker's JSON map")
            env["JOB_CREDENTIAL_TOKEN"] = str(tokens.get(args.experiment) or "")
        if not env.get("JOB_CREDENTIAL_TOKEN") and not has_users(env.get("MLFLOW_TRACKING_URI")):
            print("no MLflow server with users (a local store): no job credential")
            return 0
        missing = [n for n in ("JOB_CREDENTIAL_TOKEN", KEY_ENV, "GITHUB_RUN_ID", "GITHUB_ENV") if not env.get(n)]
        if missing:
            raise UsageError(f"set {', '.join(missing)} (the job-credentials job made no credential for this job?)")
        cred = open_into_env(env["JOB_CREDENTIAL_TOKEN"], env[KEY_ENV], workflow_run_id=int(env["GITHUB_RUN_ID"]),
                             experiment=args.experiment, env_file=env["GITHUB_ENV"])
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"MLflow user {cred.username}: writes only experiment {cred.experiment!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
