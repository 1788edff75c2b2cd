"""The MLflow server's check of a training job's identity: its GitHub OIDC token, not a password.

A training job runs the pull request's code from its first byte to its last, so it must hold
nothing that outlives it or reaches another launch. It holds no password at all: every request
it makes to MLflow carries a GitHub Actions OIDC token (`Authorization: Bearer <JWT>`), minted by
GitHub for that job (`permissions: id-token: write`), valid for minutes, signed by GitHub. This
module is the MLflow server's `authorization_function` (basic_auth.ini, docs/operations.md
section 4): it verifies the token's signature against the issuer's keys and checks that it was
minted for a job of *this* repository's default-branch `experiment-train.yml`, in the
`gpu-training` environment. The identity it grants is the launch's MLflow user
`job-<workflow run>-<attempt>` (made by the trusted `job-identity` job, with EDIT on exactly that
launch's job experiments and a password nobody keeps), so a token of one launch can never write
another launch's runs. Basic auth (admin, attestor, reader) goes to MLflow's own check.

Beyond MLflow's per-experiment permissions, a job identity may only *log runs*: it may not
create an experiment or a registered model, change a permission, or delete anything
(`job_may`), so revoking the user leaves nothing it made or shared behind.

Only the standard library, PyJWT and cryptography (both MLflow server dependencies): this runs
inside the MLflow server, which imports nothing else of the project.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

ISSUER_ENV = "PIPELINE_OIDC_ISSUER"
JWKS_ENV = "PIPELINE_OIDC_JWKS_URL"
AUDIENCE_ENV = "PIPELINE_OIDC_AUDIENCE"
REPOSITORY_ENV = "PIPELINE_OIDC_REPOSITORY"
WORKFLOW_ENV = "PIPELINE_OIDC_WORKFLOW_REF"
ENVIRONMENT_ENV = "PIPELINE_OIDC_ENVIRONMENT"
GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
DEFAULT_AUDIENCE = "gitops-train-mlflow"
JOB_USER_PREFIX = "job-"
LEEWAY_S = 30


class IdentityRefused(Exception):
    """The token is not a training job of this repository's default-branch workflow."""


@dataclass(frozen=True)
class OidcPolicy:
    issuer: str
    audience: str
    repository: str
    """owner/name: the `repository` claim."""
    workflow_ref: str
    """`owner/name/.github/workflows/experiment-train.yml@refs/heads/<default branch>`: the
    `job_workflow_ref` claim, so a workflow a pull request edits (its ref is the PR's) is refused."""
    environment: str
    jwks_url: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OidcPolicy:
        env = os.environ if environ is None else environ
        issuer = env.get(ISSUER_ENV, GITHUB_ISSUER).rstrip("/")
        missing = [n for n in (REPOSITORY_ENV, WORKFLOW_ENV) if not env.get(n)]
        if missing:
            raise IdentityRefused(f"the MLflow server has no job-identity policy: set {', '.join(missing)}")
        return cls(issuer=issuer, audience=env.get(AUDIENCE_ENV, DEFAULT_AUDIENCE), repository=env[REPOSITORY_ENV],
                   workflow_ref=env[WORKFLOW_ENV], environment=env.get(ENVIRONMENT_ENV, "gpu-training"),
                   jwks_url=env.get(JWKS_ENV) or f"{issuer}/.well-known/jwks")


def job_user(workflow_run_id: int | str, attempt: int | str) -> str:
    """The launch's MLflow user: one per workflow run attempt of experiment-train.yml."""
    run, att = str(workflow_run_id), str(attempt)
    if not (run.isdigit() and att.isdigit() and int(run) > 0 and int(att) > 0):
        raise IdentityRefused(f"bad workflow run {run[:20]!r} or attempt {att[:20]!r}")
    return f"{JOB_USER_PREFIX}{int(run)}-{int(att)}"


def username_for(claims: Mapping[str, Any], policy: OidcPolicy) -> str:
    """The MLflow user a verified token's claims stand for (pure); `IdentityRefused` says why not."""
    def claim(name: str) -> str:
        value = claims.get(name)
        return value if isinstance(value, str) else ""

    if claim("repository") != policy.repository:
        raise IdentityRefused(f"token of repository {claim('repository')[:100]!r}, not {policy.repository}")
    if claim("job_workflow_ref") != policy.workflow_ref:
        raise IdentityRefused(f"token of workflow {claim('job_workflow_ref')[:200]!r}, not {policy.workflow_ref} "
                              "(a pull request's copy of a workflow has its own ref)")
    if claim("environment") != policy.environment:
        raise IdentityRefused(f"token of a job in environment {claim('environment')[:100]!r}, not "
                              f"{policy.environment!r} (only the gated training job logs runs)")
    return job_user(claim("run_id"), claim("run_attempt"))


def verify(token: str, policy: OidcPolicy) -> dict[str, Any]:
    """The claims of a GitHub OIDC token whose signature, issuer, audience and lifetime hold."""
    import jwt

    try:
        key = _jwks(policy.jwks_url).get_signing_key_from_jwt(token)
        claims: dict[str, Any] = jwt.decode(token, key.key, algorithms=["RS256"], audience=policy.audience,
                                            issuer=policy.issuer, leeway=LEEWAY_S,
                                            options={"require": ["exp", "iat", "iss", "aud"]})
    except jwt.PyJWTError as exc:
        raise IdentityRefused(f"not a valid token of {policy.issuer} for {policy.audience!r}: {exc}") from None
    return claims


@lru_cache(maxsize=4)
def _jwks(url: str) -> Any:
    import jwt

    return jwt.PyJWKClient(url, cache_keys=True, lifespan=300, timeout=10)


# What a job identity may do beyond reading: log its runs (MLflow then checks EDIT on the run's
# experiment, which only the launch's own job experiments grant) and upload their artifacts.
_JOB_WRITES = re.compile(
    r"^/(?:ajax-)?api/2\.0/mlflow/(?:runs/(?:create|update|log-batch|log-metric|log-parameter|set-tag|delete-tag|"
    r"log-inputs|log-outputs|log-model|search)|experiments/(?:search|get-by-name)|metrics/get-history(?:-bulk-interval)?|"
    r"logged-models/search)$"
    r"|^/(?:ajax-)?api/2\.0/mlflow-artifacts/(?:artifacts/|mpu/).+$"
)


def job_may(method: str, path: str) -> bool:
    """Whether a job identity may send this request (pure): every read, and run logging only."""
    if method.upper() in ("GET", "HEAD", "OPTIONS"):
        return True
    if "mlflow-artifacts" in path and method.upper() == "DELETE":
        return False
    return _JOB_WRITES.match(path) is not None


def authenticate() -> Any:
    """MLflow's `authorization_function`: a job's OIDC token, else MLflow's basic auth."""
    from flask import Response, request
    from mlflow.server.auth import authenticate_request_basic_auth, store
    from werkzeug.datastructures import Authorization

    header = request.headers.get("Authorization", "")
    if not header.lower().startswith("bearer "):
        return authenticate_request_basic_auth()
    try:
        policy = OidcPolicy.from_env()
        user = username_for(verify(header.split(None, 1)[1].strip(), policy), policy)
    except IdentityRefused as exc:
        return Response(f"job identity refused: {exc}", 401, {"WWW-Authenticate": 'Bearer realm="mlflow"'})
    if not store.has_user(user, use_primary=True):  # never made for this launch, or revoked after it
        return Response(f"job identity {user} does not exist (not made by job-identity, or revoked)", 401,
                        {"WWW-Authenticate": 'Bearer realm="mlflow"'})
    if not job_may(request.method, request.path):
        return Response(f"job identity {user} may only log runs ({request.method} {request.path[:200]} refused)", 403)
    return Authorization("bearer", {"username": user})
