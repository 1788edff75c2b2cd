"""Trusted provenance against a real `mlflow server --app-name basic-auth` on 127.0.0.1.

Users as deployed (pipelines/trusted/provenance.py, docs/operations.md): `trainer` (the
training job, PR code) and `attestor` (the trusted attest and promote jobs), made by
`pipeline provenance setup`; the server's default permission is READ. The review's proof of
concept is replayed as a training job would: PR A's training forges a record for PR B (B's
experiment, B's SHA, `pipeline.pr` = B, verdict supported, a start time in the future) and
tries to write the provenance store and the registry directly. Promotion of B must pick B's
own attested run, or refuse; never A's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from basics.environment import scoped_environ
from pipelines.github.client import PyGithubHost
from pipelines.github.events import PullRequestEvent, PullRequestRef
from pipelines.trusted.promote import CHAMPION, MlflowPromotion, promote_merged
from pipelines.trusted.provenance import (
    AttestationRefused,
    ProvenanceLookup,
    attest,
    setup,
)
from tests.infra.github_emulator import REPO, SHA_A, SHA_B, GitHubEmulator, emulated_repo, emulator_config

ADMIN = ("admin", "admin-password-0123")
TRAINER = ("trainer", "trainer-password-0123")
ATTESTOR = ("attestor", "attestor-password-0123")
MODEL = "lm-auth"
TRAIN_WORKFLOW = ".github/workflows/experiment-train.yml"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class AuthServer:
    """`mlflow server --app-name basic-auth` (needs the `mlflow[auth]` extra), default READ."""

    def __init__(self, root: Path):
        self.root = root
        self.port = _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AuthServer:
        ini = self.root / "basic_auth.ini"
        ini.write_text("[mlflow]\ndefault_permission = READ\n"
                       f"database_uri = sqlite:///{self.root / 'basic_auth.db'}\nadmin_username = {ADMIN[0]}\n"
                       "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                       "auth_cache_ttl_seconds = 60\n")  # one PBKDF2 check per user, not per request
        env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true",
                   MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", MLFLOW_AUTH_CONFIG_PATH=str(ini),
                   MLFLOW_AUTH_ADMIN_PASSWORD=ADMIN[1], MLFLOW_FLASK_SERVER_SECRET_KEY="test-secret-key-0123")
        for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
            env.pop(key, None)
        cmd = [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth",
               "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
               "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1",
               "--port", str(self.port), "--workers", "1"]
        log = (self.root / "server.log").open("ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited; see {self.root / 'server.log'}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError("mlflow server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@contextlib.contextmanager
def as_user(user: tuple[str, str]) -> Iterator[None]:
    """MLflow's client reads the credential from the environment at each request."""
    with scoped_environ(MLFLOW_TRACKING_USERNAME=user[0], MLFLOW_TRACKING_PASSWORD=user[1]):
        yield


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    srv = AuthServer(tmp_path_factory.mktemp("mlflow-auth")).start()
    try:
        done = setup(tracking_uri=srv.uri, model_name=MODEL, reader=TRAINER, attestor=ATTESTOR, admin=ADMIN)
        yield srv.uri, done.provenance_experiment_id
    finally:
        srv.stop()


@pytest.fixture
def gh() -> Iterator[GitHubEmulator]:
    with GitHubEmulator() as emulator:
        yield emulator


def training(uri: str, tmp: Path, *, experiment: str, sha: str, workflow_run: int, pr: int,
             verdict: str = "supported", start_time: int | None = None) -> str:
    """What a training job leaves, made with a non-attestor credential (as PR code would), in
    the launch's job experiment (`<experiment>/job-<run>-1`: attest accepts no other)."""
    from mlflow.tracking import MlflowClient

    with as_user(TRAINER):
        client = MlflowClient(uri)
        name = f"{experiment}/job-{workflow_run}-1"
        exp = client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp else client.create_experiment(name)
        tags = {"pipeline.git_sha": sha, "pipeline.dirty": "false", "pipeline.pr": str(pr),
                "pipeline.github_run_id": str(workflow_run), "pipeline.verdict": verdict}
        run = client.create_run(exp_id, tags=tags, start_time=start_time)
        model = tmp / f"model-{run.info.run_id}"
        model.mkdir()
        (model / "weights.txt").write_text(run.info.run_id)
        client.log_artifacts(run.info.run_id, str(model), "model")
        client.set_terminated(run.info.run_id, "FINISHED")
        return str(run.info.run_id)


def result(*run_ids: str, verdict: str) -> dict:
    return {"candidate_runs": [{"mlflow_run_id": r} for r in run_ids], "verdict": {"outcome": verdict},
            "hypothesis": {"statement": "A larger RoPE base lowers code eval loss."}}


def denied(fn: object) -> bool:
    """403 from the server (MLflow's REST error, or the artifact proxy's HTTP error)."""
    import requests
    from mlflow.exceptions import MlflowException

    try:
        fn()  # type: ignore[operator]
    except (MlflowException, requests.HTTPError) as exc:
        return "403" in str(exc) or "PERMISSION_DENIED" in str(exc)
    return False


def merged(n: int, sha: str = SHA_A) -> PullRequestEvent:
    ref = PullRequestRef(number=n, title="", body="", author="dana", head_sha=sha, head_ref="exp", head_repo=REPO,
                         base_repo=REPO, base_ref="main", state="closed", merged=True, draft=False, labels=())
    return PullRequestEvent(action="closed", pull_request=ref, repo=REPO, sender="erin")


def promote(gh: GitHubEmulator, uri: str, store: str, n: int) -> list:
    with as_user(ATTESTOR):
        registry = MlflowPromotion(uri, MODEL)
        return promote_merged(merged(n), PyGithubHost(emulator_config(gh)), ProvenanceLookup(uri, store), registry,
                              model_name=MODEL, required_approvals=1, bot_login=gh.bot_login, sleep=lambda s: None)


def test_anonymous_is_refused(server: tuple[str, str]) -> None:
    uri, _ = server
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1", timeout=5)
    assert err.value.code == 401


def test_the_trainer_cannot_write_provenance_or_the_registry(server: tuple[str, str], tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri, store = server
    own = training(uri, tmp_path, experiment="own-exp", sha=SHA_B, workflow_run=1, pr=7)
    with as_user(TRAINER):
        client = MlflowClient(uri)
        assert client.get_run(own).data.metrics == {}  # it can read and write its own runs
        assert denied(lambda: client.create_run(store, tags={"pipeline.attested_by": "x"}))
        assert denied(lambda: client.set_experiment_tag(store, "k", "v"))
        assert denied(lambda: client.delete_experiment(store))
        assert denied(lambda: client.create_model_version(MODEL, f"runs:/{own}/model", run_id=own))
        assert denied(lambda: client.set_registered_model_alias(MODEL, CHAMPION, "1"))
        assert denied(lambda: client.delete_registered_model(MODEL))


def test_a_forged_record_of_another_pr_never_promotes(gh: GitHubEmulator, server: tuple[str, str],
                                                      tmp_path: Path) -> None:
    """The review's PoC. B (rope-theta at SHA_A, workflow run 501) trains honestly and its
    report says refuted; A (workflow run 502, its own experiment at SHA_B) forges B's record."""
    from mlflow.tracking import MlflowClient

    uri, store = server
    b = emulated_repo(gh, files=("experiments/rope-theta.yaml",))
    a = emulated_repo(gh, head_sha=SHA_B, files=("experiments/attacker.yaml",))
    gh.add_workflow_run(REPO, 501, path=TRAIN_WORKFLOW, event="issue_comment")
    gh.add_workflow_run(REPO, 502, path=TRAIN_WORKFLOW, event="issue_comment")

    honest = training(uri, tmp_path, experiment="rope-theta", sha=SHA_A, workflow_run=501, pr=b, verdict="refuted")
    with as_user(ATTESTOR):
        attest(tracking_uri=uri, pr=b, sha=SHA_A, experiment="rope-theta", workflow_run_id=501,
               result=result(honest, verdict="refuted"), provenance_id=store)

    # A's training: a run in B's experiment with B's SHA, B's PR, B's workflow run, "supported",
    # a start time a day in the future, and a model.
    future = int(time.time() * 1000) + 86_400_000
    forged = training(uri, tmp_path, experiment="rope-theta", sha=SHA_A, workflow_run=501, pr=b,
                      verdict="supported", start_time=future)
    with as_user(TRAINER):
        client = MlflowClient(uri)
        # ... and it tries the trusted places directly.
        assert denied(lambda: client.create_run(store, tags={
            "pipeline.pr": str(b), "pipeline.sha": SHA_A, "pipeline.experiment": "rope-theta",
            "pipeline.attested_by": "experiment-train.yml/attest", "pipeline.training_run_id": forged,
            "pipeline.github_run_id": "501", "pipeline.verdict": "supported"}))
        assert denied(lambda: client.create_model_version(MODEL, f"runs:/{forged}/model", run_id=forged))
    # A's own attest job (trusted code, A's approved values) refuses A's report naming the forgery.
    with as_user(ATTESTOR), pytest.raises(AttestationRefused, match="not this launch.s `attacker/job-502-1`"):
        attest(tracking_uri=uri, pr=a, sha=SHA_B, experiment="attacker", workflow_run_id=502,
               result=result(forged, verdict="supported"), provenance_id=store)

    gh.add_review(REPO, b, user="erin", state="APPROVED")
    gh.merge(REPO, b, merged_by="mia")
    (outcome,) = promote(gh, uri, store, b)
    assert outcome.promotion is None and any("refuted" in r for r in outcome.gate.reasons)
    with as_user(ATTESTOR):
        with pytest.raises(Exception):  # noqa: B017 - no champion at all
            MlflowClient(uri).get_model_version_by_alias(MODEL, CHAMPION)

    # B retrains (workflow run 503) and its report says supported. Attested without a launch
    # plan, that verdict is the report's own (issue 36: promotion counts only the attest job's);
    # a maintainer's override then promotes B's run, not A's.
    gh.add_workflow_run(REPO, 503, path=TRAIN_WORKFLOW, event="issue_comment")
    retrained = training(uri, tmp_path, experiment="rope-theta", sha=SHA_A, workflow_run=503, pr=b)
    with as_user(ATTESTOR):
        attest(tracking_uri=uri, pr=b, sha=SHA_A, experiment="rope-theta", workflow_run_id=503,
               result=result(retrained, verdict="supported"), provenance_id=store)
    (outcome,) = promote(gh, uri, store, b)
    assert outcome.promotion is None and "pull request's own code" in outcome.gate.reasons[0]
    gh.add_label(REPO, b, "promote-override", actor="mia")
    (outcome,) = promote(gh, uri, store, b)
    assert outcome.promotion is not None and outcome.gate.override_by == "mia", outcome.gate.reasons
    with as_user(ATTESTOR):
        client = MlflowClient(uri)
        champion = client.get_model_version_by_alias(MODEL, CHAMPION)
        assert champion.tags["pipeline.training_run_id"] == retrained != forged
        attestation = champion.run_id
        assert champion.tags["pipeline.attestation_run_id"] == attestation
        assert champion.source.startswith(client.get_run(attestation).info.artifact_uri)
        assert client.get_run(attestation).info.experiment_id == store
    # The model was copied where the trainer cannot overwrite it.
    with as_user(TRAINER):
        assert denied(lambda: MlflowClient(uri).log_text(attestation, "forged", "model/weights.txt"))


def test_attest_refuses_claims_that_do_not_match(server: tuple[str, str], tmp_path: Path) -> None:
    uri, store = server
    run = training(uri, tmp_path, experiment="claims", sha=SHA_A, workflow_run=601, pr=3)
    with as_user(ATTESTOR):
        for kw, match in [(dict(sha=SHA_B), "approved commit"), (dict(workflow_run_id=602), "this workflow run"),
                          (dict(experiment="other"), "not this launch.s `other/job-601-1`")]:
            args = dict(tracking_uri=uri, pr=3, sha=SHA_A, experiment="claims", workflow_run_id=601,
                        result=result(run, verdict="supported"), provenance_id=store) | kw
            with pytest.raises(AttestationRefused, match=match):
                attest(**args)  # type: ignore[arg-type]
        with pytest.raises(AttestationRefused, match="no candidate"):
            attest(tracking_uri=uri, pr=3, sha=SHA_A, experiment="claims", workflow_run_id=601,
                   result={"candidate_runs": []}, provenance_id=store)


def test_result_json_is_read_as_data(tmp_path: Path) -> None:
    from pipelines.trusted.provenance import read_result

    (tmp_path / "result.json").write_text(json.dumps([1]))
    with pytest.raises(AttestationRefused):
        read_result(tmp_path / "result.json")
    (tmp_path / "link.json").symlink_to(tmp_path / "result.json")
    with pytest.raises(AttestationRefused):
        read_result(tmp_path / "link.json")


def test_setup_refuses_a_model_the_trainer_made_first_and_shared(server: tuple[str, str]) -> None:
    """Issue 28: set-up only checked that the attestor *could* write the model; a trainer that
    made the name first and granted the attestor MANAGE kept MANAGE itself (moves `champion`)."""
    from mlflow.server import get_app_client
    from mlflow.tracking import MlflowClient

    from basics.errors import UsageError

    uri, _ = server
    with as_user(TRAINER):
        MlflowClient(uri).create_registered_model("squatted-model")
        get_app_client("basic-auth", tracking_uri=uri).grant_user_permission(
            ATTESTOR[0], "registered_model", "squatted-model", "MANAGE")
    with pytest.raises(UsageError, match=r"registered model `squatted-model`: trainer \(MANAGE\) can write it"):
        setup(tracking_uri=uri, model_name="squatted-model", reader=TRAINER, attestor=ATTESTOR, admin=ADMIN)


def test_promotion_never_creates_the_registered_model_on_a_server(server: tuple[str, str]) -> None:
    """Issue 28: created on first promotion, the model would belong to whoever promoted first."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from basics.errors import PromotionRefused
    from pipelines.trusted.promote import TrainingRecord

    uri, _ = server
    record = TrainingRecord(experiment="x", mlflow_run_id="r", code_version=SHA_A, status="FINISHED", dirty=False,
                            verdict="supported", gates_passed=None, model_source="mlflow-artifacts:/0/r/model")
    with as_user(ATTESTOR), pytest.raises(PromotionRefused, match="pipeline provenance setup"):
        MlflowPromotion(uri, "never-set-up").promote(record, {})
    with as_user(ADMIN), pytest.raises(MlflowException):
        MlflowClient(uri).get_registered_model("never-set-up")
