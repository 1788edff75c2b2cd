"""The training job's identity toward MLflow: a GitHub Actions OIDC token, fetched per request.

The training job holds no password. With `permissions: id-token: write` GitHub gives every step
of the job `ACTIONS_ID_TOKEN_REQUEST_URL` and `ACTIONS_ID_TOKEN_REQUEST_TOKEN`, which mint a
short-lived JWT naming this job (repository, workflow, run, attempt, environment). The MLflow
server checks it (pipelines/trusted/mlflow_oidc.py) and maps it to the launch's own user, which
can write only the launch's job experiments. A token lives minutes and the request token dies
with the job: nothing here outlives the job or opens another launch's runs, so PR code that
reads these variables gains nothing it does not already have.

MLflow asks this provider for the request's auth (`MLFLOW_TRACKING_AUTH=github-oidc`, the
`mlflow.request_auth_provider` entry point in pyproject.toml); the token is cached until a
minute before it expires, so a 72-hour training keeps logging live metrics.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import urllib.parse
import urllib.request
from typing import Any

PROVIDER = "github-oidc"
AUDIENCE_ENV = "PIPELINE_OIDC_AUDIENCE"
DEFAULT_AUDIENCE = "gitops-train-mlflow"
REFRESH_BEFORE_S = 60


class OidcUnavailable(RuntimeError):
    """This process is not a GitHub Actions job with `id-token: write`."""


def _expiry(jwt: str) -> float:
    """The token's `exp` (read, not verified: the server verifies)."""
    try:
        payload = jwt.split(".")[1]
        return float(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["exp"])
    except (IndexError, KeyError, ValueError, TypeError):
        return 0.0


def fetch_token(audience: str | None = None, environ: dict[str, str] | None = None) -> str:
    """A fresh OIDC token of this job for `audience` (GitHub's documented request)."""
    env = os.environ if environ is None else environ
    url, bearer = env.get("ACTIONS_ID_TOKEN_REQUEST_URL"), env.get("ACTIONS_ID_TOKEN_REQUEST_TOKEN")
    if not url or not bearer:
        raise OidcUnavailable("no ACTIONS_ID_TOKEN_REQUEST_URL/TOKEN: the job needs `permissions: id-token: write`")
    sep = "&" if "?" in url else "?"
    query = urllib.parse.urlencode({"audience": audience or env.get(AUDIENCE_ENV) or DEFAULT_AUDIENCE})
    request = urllib.request.Request(f"{url}{sep}{query}", headers={"Authorization": f"bearer {bearer}"})
    with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - the runner's own endpoint
        value = json.loads(resp.read().decode("utf-8")).get("value")
    if not isinstance(value, str) or value.count(".") != 2:
        raise OidcUnavailable("the OIDC endpoint answered without a token")
    return value


class _CachedToken:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._token = ""
        self._expires = 0.0

    def get(self) -> str:
        with self._lock:
            if time.time() > self._expires - REFRESH_BEFORE_S:
                self._token = fetch_token()
                self._expires = _expiry(self._token)
            return self._token


_CACHE = _CachedToken()


def _auth_base() -> Any:
    from requests.auth import AuthBase

    class BearerOidc(AuthBase):
        def __call__(self, r: Any) -> Any:
            r.headers["Authorization"] = f"Bearer {_CACHE.get()}"
            return r

    return BearerOidc()


try:  # MLflow is installed wherever the provider is loaded (its entry point); not at import time elsewhere
    from mlflow.tracking.request_auth.abstract_request_auth_provider import RequestAuthProvider as _Base
except ImportError:  # pragma: no cover - a job install without MLflow has no MLflow requests to sign
    _Base = object  # type: ignore[assignment,misc]


class GitHubOidcAuthProvider(_Base):
    """`MLFLOW_TRACKING_AUTH=github-oidc`: every MLflow request carries this job's OIDC token."""

    def get_name(self) -> str:
        return PROVIDER

    def get_auth(self) -> Any:
        return _auth_base()
