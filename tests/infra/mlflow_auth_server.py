"""`mlflow server --app-name basic-auth` on 127.0.0.1 for tests (needs the `mlflow[auth]` extra).

    with MlflowAuthServer(tmp_dir) as server:      # admin: server.admin; default permission READ
        ...
    MlflowAuthServer(tmp_dir, oidc={...})          # also training jobs' GitHub OIDC tokens
                                                   # (pipelines/trusted/mlflow_oidc.py; the
                                                   # PIPELINE_OIDC_* settings of docs/operations.md)

sqlite stores, proxied artifacts (`--artifacts-destination`), one worker; the server runs in
its own process group and stopping kills the whole tree.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.infra.mlflow_server import _free_port

ADMIN = ("admin", "admin-password-0123")
FUNCTION = "mlflow.server.auth:authenticate_request_basic_auth"
OIDC_FUNCTION = "pipelines.trusted.mlflow_oidc:authenticate"


class MlflowAuthServer:
    def __init__(self, root: Path, admin: tuple[str, str] = ADMIN, default_permission: str = "READ",
                 oidc: dict[str, str] | None = None):
        self.root = Path(root)
        self.oidc = oidc
        self.admin = admin
        self.default_permission = default_permission
        self.port = _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log_path = self.root / "server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> MlflowAuthServer:
        self.root.mkdir(parents=True, exist_ok=True)
        ini = self.root / "basic_auth.ini"
        oidc = self.oidc
        ini.write_text(f"[mlflow]\ndefault_permission = {self.default_permission}\n"
                       f"database_uri = sqlite:///{self.root / 'basic_auth.db'}\nadmin_username = {self.admin[0]}\n"
                       f"authorization_function = {FUNCTION if oidc is None else OIDC_FUNCTION}\n"
                       "auth_cache_ttl_seconds = 60\n")  # one PBKDF2 check per user, not per request
        env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true",
                   MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", MLFLOW_AUTH_CONFIG_PATH=str(ini),
                   MLFLOW_AUTH_ADMIN_PASSWORD=self.admin[1], MLFLOW_FLASK_SERVER_SECRET_KEY="test-secret-key-0123")
        for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
            env.pop(key, None)
        if self.oidc is not None:  # the server imports the project's check: the operator installs it there
            env.update(self.oidc, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        cmd = [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth",
               "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
               "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1",
               "--port", str(self.port), "--workers", "1"]
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self._proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer /health; see {self.log_path}")

    def stop(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        try:
            os.killpg(self._proc.pid, signal.SIGTERM)
            self._proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        except ProcessLookupError:
            pass

    def __enter__(self) -> MlflowAuthServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
