"""GitHub Actions' OIDC issuer, emulated: JWKS, discovery, and the per-job token endpoint.

GitHub gives a job with `permissions: id-token: write` two variables,
`ACTIONS_ID_TOKEN_REQUEST_URL` and `ACTIONS_ID_TOKEN_REQUEST_TOKEN`; a GET of the URL (plus
`&audience=...`) with `Authorization: bearer <request token>` answers `{"value": "<JWT>"}`, an
RS256 token whose claims name the job (repository, job_workflow_ref, run_id, run_attempt,
environment, sha, ref, ...) and which verifies against `<issuer>/.well-known/jwks`. This server
does the same with its own RSA key, so the MLflow server's check (pipelines/trusted/mlflow_oidc.py)
runs unchanged against it. Claim names and shape follow GitHub's documentation of the token.

    with OidcIssuer() as issuer:
        url, request_token = issuer.register_job({"repository": "acme/lab", "run_id": "9101", ...})
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN_TTL_S = 300  # GitHub's tokens live minutes; the client refreshes before expiry


class OidcIssuer:
    def __init__(self, ttl_s: float = TOKEN_TTL_S) -> None:
        from cryptography.hazmat.primitives.asymmetric import rsa

        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = secrets.token_hex(8)
        self.ttl_s = ttl_s
        self.jobs: dict[str, dict[str, Any]] = {}  # request token -> claims
        self.issued: list[dict[str, Any]] = []  # claims of every token minted
        self._server: ThreadingHTTPServer | None = None

    @property
    def issuer(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def register_job(self, claims: dict[str, Any]) -> tuple[str, str]:
        """(ACTIONS_ID_TOKEN_REQUEST_URL, ACTIONS_ID_TOKEN_REQUEST_TOKEN) for a job with these claims."""
        request_token = secrets.token_urlsafe(24)
        self.jobs[request_token] = dict(claims)
        return f"{self.issuer}/token?api-version=2.0", request_token

    def revoke_job(self, request_token: str) -> None:
        """The job ended: its request token mints nothing more."""
        self.jobs.pop(request_token, None)

    def mint(self, claims: dict[str, Any], audience: str) -> str:
        import jwt

        now = int(time.time())
        body = {"iss": self.issuer, "aud": audience, "iat": now, "nbf": now - 5, "exp": now + int(self.ttl_s),
                "jti": secrets.token_hex(8), **claims}
        body.setdefault("sub", f"repo:{claims.get('repository', '')}:environment:{claims.get('environment', '')}")
        self.issued.append(body)
        return jwt.encode(body, self._key, algorithm="RS256", headers={"kid": self.kid})

    def jwks(self) -> dict[str, Any]:
        from jwt.algorithms import RSAAlgorithm

        key = json.loads(RSAAlgorithm.to_jwk(self._key.public_key()))
        return {"keys": [{**key, "kid": self.kid, "use": "sig", "alg": "RS256"}]}

    # ----------------------------------------------------------------- server

    def start(self) -> OidcIssuer:
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                url = urllib.parse.urlsplit(self.path)
                if url.path == "/.well-known/jwks":
                    return self._send(200, issuer.jwks())
                if url.path == "/.well-known/openid-configuration":
                    return self._send(200, {"issuer": issuer.issuer, "jwks_uri": f"{issuer.issuer}/.well-known/jwks"})
                if url.path == "/token":
                    auth = self.headers.get("Authorization", "")
                    claims = issuer.jobs.get(auth.split(None, 1)[1] if auth.lower().startswith("bearer ") else "")
                    if claims is None:
                        return self._send(401, {"message": "Bad credentials"})
                    audience = urllib.parse.parse_qs(url.query).get("audience", [""])[0] or claims["repository_owner"]
                    return self._send(200, {"count": 1, "value": issuer.mint(claims, audience)})
                return self._send(404, {"message": "Not Found"})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        server = self._server
        threading.Thread(target=lambda: server.serve_forever(poll_interval=0.05), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> OidcIssuer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
