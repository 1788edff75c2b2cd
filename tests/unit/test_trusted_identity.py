"""Issue 36: the training job holds no secret; its identity is its launch, checked by trusted code.

Pure parts: which OIDC claims the MLflow server accepts and what a job identity may request
(pipelines/trusted/mlflow_oidc.py), the launch's own run directory (pipelines/rundir.py), the
boundary between the trusted package and the code a training job runs, and the workflow that
wires it (no key, no token in a step's `env:`).
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest
import yaml

from pipelines.rundir import LAUNCH_NONCE_ENV, LAUNCH_OWNER_FILE, launch_root
from pipelines.trusted.mlflow_oidc import IdentityRefused, OidcPolicy, job_may, username_for

ROOT = Path(__file__).resolve().parents[2]
POLICY = OidcPolicy(issuer="https://token.actions.githubusercontent.com", audience="gitops-train-mlflow",
                    repository="acme/lab", workflow_ref="acme/lab/.github/workflows/experiment-train.yml@refs/heads/main",
                    environment="gpu-training", jwks_url="https://token.actions.githubusercontent.com/.well-known/jwks")
CLAIMS = {"repository": "acme/lab", "job_workflow_ref": POLICY.workflow_ref, "environment": "gpu-training",
          "run_id": "9101", "run_attempt": "2"}


def test_a_training_jobs_token_stands_for_its_launch_only() -> None:
    assert username_for(CLAIMS, POLICY) == "job-9101-2"


@pytest.mark.parametrize(("claim", "value", "why"), [
    ("repository", "mallory/lab", "repository"),
    # A pull request's own copy of a workflow (pull_request event) has the PR's ref.
    ("job_workflow_ref", "acme/lab/.github/workflows/experiment-train.yml@refs/pull/7/merge", "workflow"),
    ("job_workflow_ref", "acme/lab/.github/workflows/experiment-pr.yml@refs/heads/main", "workflow"),
    ("environment", "", "environment"),
    ("run_id", "9101; drop", "workflow run"),
    ("run_attempt", "0", "workflow run"),
])
def test_a_token_of_any_other_job_is_refused(claim: str, value: str, why: str) -> None:
    with pytest.raises(IdentityRefused, match=why):
        username_for({**CLAIMS, claim: value}, POLICY)


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("GET", "/api/2.0/mlflow/experiments/get", True),
    ("POST", "/api/2.0/mlflow/runs/create", True),
    ("POST", "/api/2.0/mlflow/runs/log-batch", True),
    ("POST", "/api/2.0/mlflow/runs/search", True),
    ("PUT", "/api/2.0/mlflow-artifacts/artifacts/3/abc/artifacts/model/model.safetensors", True),
    ("POST", "/api/2.0/mlflow/experiments/create", False),
    ("POST", "/api/2.0/mlflow/experiments/permissions/create", False),
    ("PATCH", "/api/2.0/mlflow/experiments/permissions/update", False),
    ("POST", "/api/2.0/mlflow/registered-models/create", False),
    ("POST", "/api/2.0/mlflow/model-versions/create", False),
    ("POST", "/api/2.0/mlflow/registered-models/alias", False),
    ("POST", "/api/2.0/mlflow/runs/delete", False),
    ("DELETE", "/api/2.0/mlflow-artifacts/artifacts/3/abc/artifacts/model", False),
    ("POST", "/api/2.0/mlflow/users/update-password", False),
])
def test_a_job_identity_may_only_read_and_log_runs(method: str, path: str, allowed: bool) -> None:
    assert job_may(method, path) is allowed


def test_the_policy_is_refused_without_its_repository_and_workflow() -> None:
    with pytest.raises(IdentityRefused, match="PIPELINE_OIDC_REPOSITORY"):
        OidcPolicy.from_env({})


def test_a_launch_sets_aside_a_directory_it_did_not_make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 36: a training job planted `stages/train.json` where another launch would look."""
    monkeypatch.delenv(LAUNCH_NONCE_ENV, raising=False)
    planted = tmp_path / "launch-9104-1-wf-candidate" / "20261204" / "wf-candidate" / "r1" / "stages"
    planted.mkdir(parents=True)
    (planted / "train.json").write_text('{"identity": "forged"}', encoding="utf-8")
    root = launch_root(tmp_path, "9104-1-wf-candidate")
    assert root == tmp_path / "launch-9104-1-wf-candidate"
    assert [p.name for p in root.iterdir()] == [LAUNCH_OWNER_FILE]  # fresh: nothing planted is read
    (aside,) = tmp_path.glob("launch-9104-1-wf-candidate.planted-*")
    assert (aside / "20261204" / "wf-candidate" / "r1" / "stages" / "train.json").is_file()
    # The launch (and the processes it starts) keeps its own directory on later calls.
    (root / "work").mkdir()
    assert launch_root(tmp_path, "9104-1-wf-candidate") == root and (root / "work").is_dir()
    # Someone else's process (another launch, no token of this one) never adopts it.
    monkeypatch.setenv(LAUNCH_NONCE_ENV, "0" * 32)
    other = launch_root(tmp_path, "9104-1-wf-candidate")
    assert not (other / "work").exists() and os.environ[LAUNCH_NONCE_ENV] != "0" * 32


def test_a_malformed_launch_id_is_refused(tmp_path: Path) -> None:
    from basics.errors import UsageError

    with pytest.raises(UsageError, match="PIPELINE_LAUNCH_ID"):
        launch_root(tmp_path, "../../etc")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_training_side_imports_nothing_of_the_trusted_package() -> None:
    """The boundary a reviewer sees: basics/, trainer/, models/, reports/, validation/ and the pipelines
    modules outside pipelines/trusted/ (what a training job runs) never import it, except the
    CLI's command registrations of the trusted jobs (imported inside those commands only)."""
    offenders = []
    for package in ("basics", "trainer", "models", "reports", "validation", "pipelines"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("pipelines/trusted/") or rel == "pipelines/cmd_github.py":
                continue
            if any(name.startswith("pipelines.trusted") for name in _imports(path)):
                offenders.append(rel)
    assert offenders == []


def test_the_training_job_holds_no_secret_and_prints_no_token() -> None:
    """Issue 36 (HIGH): the step holding JOB_CREDENTIAL_KEY ran after the PR's install, and the
    sealed tokens were in its printed `env:`. The training job now reads no secret at all and
    no other job's output in any `env:`; its identity is its OIDC token."""
    doc = yaml.safe_load((ROOT / ".github" / "workflows" / "experiment-train.yml").read_text(encoding="utf-8"))
    train = doc["jobs"]["train"]
    text = yaml.safe_dump(train)
    assert re.findall(r"secrets\.[A-Z_]+", text) == []
    assert train["permissions"]["id-token"] == "write"
    assert train["env"]["MLFLOW_TRACKING_AUTH"] == "github-oidc"
    assert not any("JOB_CREDENTIAL" in str(step.get("env", {})) for step in train["steps"])
    # Only the plan (trusted decisions, no secret) reaches PR code from another job's outputs.
    used = set(re.findall(r"needs\.([a-z-]+)\.outputs\.([a-z_]+)", text))
    assert used <= {("authorize", "sha"), ("authorize", "pr"), ("authorize", "experiments"), ("authorize", "launch"),
                    ("plan", "plan")}, used


def test_the_attestors_write_credential_is_only_where_it_writes() -> None:
    """Issue 36 (LOW): `plan` and `report` only read the registry, so they get the reader's login."""
    doc = yaml.safe_load((ROOT / ".github" / "workflows" / "experiment-train.yml").read_text(encoding="utf-8"))
    holders = {job for job, spec in doc["jobs"].items() if "MLFLOW_ATTESTOR" in yaml.safe_dump(spec)}
    assert holders == {"attest"}
    assert {job for job, spec in doc["jobs"].items() if spec.get("environment") == "provenance"} == {"attest"}
    assert "PIPELINE_REGISTRY_MODEL" in yaml.safe_dump(doc["jobs"]["attest"])
