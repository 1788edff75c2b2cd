"""A real `mlflow server` on 127.0.0.1 for tests (sqlite store, local artifacts, one worker).

    with MlflowServer(tmp_dir) as server:
        client = mlflow.MlflowClient(server.uri)

Or by hand: `python tests/infra/mlflow_server.py DIR [PORT]` (runs until Ctrl-C).
One worker and no job execution: /health answers in ~5 s instead of ~10 s (measured with
mlflow 3.17). The server runs in its own process group; stopping kills the whole tree.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

START_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MlflowServer:
    """Start on `start()`/`__enter__`, stop on `stop()`/`__exit__`; `uri` is the tracking URI."""

    def __init__(self, root: Path, port: int | None = None):
        self.root = Path(root)
        self.port = port or _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.backend_uri = f"sqlite:///{self.root / 'mlflow.db'}"
        self.artifacts = self.root / "artifacts"
        self.log_path = self.root / "server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> MlflowServer:
        self.root.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true",
                   MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.backend_uri,
               "--artifacts-destination", str(self.artifacts), "--host", "127.0.0.1",
               "--port", str(self.port), "--workers", "1"]
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self._proc.returncode}; see {self.log_path}")
            if self.healthy():
                return self
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer /health within {START_TIMEOUT_S:.0f} s; see {self.log_path}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

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

    def __enter__(self) -> MlflowServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "mlflow-test-server")
    with MlflowServer(root, int(sys.argv[2]) if len(sys.argv) > 2 else None) as server:
        print(f"MLFLOW_TRACKING_URI={server.uri}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
