"""Trusted provenance: what promotion believes about a training run, written by main's code.

The training job runs the pull request's code with its launch's MLflow identity (its GitHub OIDC
token, pipelines/trusted/mlflow_oidc.py). Anything that code writes (run tags, start times,
metrics, artifacts, the verdict tag) is PR-controlled, so promotion reads none of it.

After training, the `attest` job of `experiment-train.yml` (GitHub-hosted, default-branch code,
environment `provenance` with the *attestor* credential the training job never sees):

1. takes the PR, SHA, experiment and workflow run id from `authorize` (trusted job outputs);
2. reads the candidate MLflow run ids and the verdict from the report artifact **of this
   workflow run** (only this run's training job can upload it; another PR cannot);
3. checks each run against what it must be: in the MLflow experiment of that name, tagged with
   the approved SHA, not dirty, tagged with this workflow run id;
4. writes one *attestation* run into the provenance experiment (writable by the attestor only:
   the trainer has the default READ there), with the PR, SHA, experiment, workflow run, the
   training run ids, their status and the verdict (the one it computed itself from the
   attested metrics under the launch plan, `pipeline.verdict_by=trusted`, for a single
   experiment and a sweep's winner alike; without a plan the report's own, tagged
   `pipeline.verdict_by=report`, which promotion does not accept), and copies the first candidate's `model/`
   artifacts into it (a place the trainer cannot overwrite later). It reads artifacts only
   from the server's own `mlflow-artifacts:` location (`artifact_location_problem`): the
   attestor's credential goes wherever the client fetches them, and an experiment's artifact
   location is chosen by whoever made the experiment (PR code).

Promotion (`ProvenanceLookup`) reads only attestations, and registers the model from the
attestation run's own artifacts. The registered model is created by the operator's set-up
(`pipeline provenance setup`), so the trainer has only READ on it: it cannot create versions or
move aliases. Set-up refuses a store or model on which anyone but the attestor holds more than
READ (a trainer that created the name first keeps MANAGE); promotion never creates the model
on a server. Set-up also creates the provenance experiment and prints its id; promotion looks
the store up by that id (`MLFLOW_PROVENANCE_EXPERIMENT_ID`), because a trainer could create an
experiment of the same *name* first on a fresh server, never one with a given id.

Credentials: MLflow's own `MLFLOW_TRACKING_USERNAME` / `MLFLOW_TRACKING_PASSWORD` (the
`basic-auth` app of `mlflow server`, `mlflow[auth]`).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from basics.environment import scoped_environ
from pipelines.trusted.promote import RunFilter, TrainingRecord
from pipelines.trusted.registry import (  # the registry reads them too
    _NAME,
    _SHA,
    ATTESTED_BY,
    PROVENANCE_EXPERIMENT,
    VERDICTS,
)

MODEL_DIR = "model"


class AttestationRefused(RuntimeError):
    """The training job's claims do not match the runs in MLflow: nothing is attested."""


@dataclass(frozen=True)
class Attestation:
    run_id: str  # the attestation run in the provenance experiment
    training_run_ids: tuple[str, ...]
    verdict: str | None
    status: str


# --------------------------------------------------------------------------- pure checks


def candidate_run_ids(result: Mapping[str, Any]) -> tuple[str, ...]:
    """The candidate MLflow run ids of a report's result.json, first (the verdict's) first."""
    ids: list[str] = []
    for entry in result.get("candidate_runs") or ():
        rid = entry.get("mlflow_run_id") if isinstance(entry, Mapping) else None
        if isinstance(rid, str) and re.fullmatch(r"[0-9a-f]{32}", rid) and rid not in ids:
            ids.append(rid)
    return tuple(ids)


def verdict_of(result: Mapping[str, Any]) -> str | None:
    outcome = (result.get("verdict") or {}).get("outcome") if isinstance(result.get("verdict"), Mapping) else None
    return outcome if outcome in VERDICTS else None


def shown(text: str, limit: int = 100) -> str:
    """A name read from MLflow (PR-chosen) made safe for a log line, a job summary or markdown:
    every character but letters, digits, space, `.`, `_` and `-` is written as `\\uXXXX`, so no
    newline, workflow command (`::`), backtick, link, mention or HTML survives."""
    out = "".join(c if c.isascii() and (c.isalnum() or c in " ._-") else f"\\u{ord(c):04x}" for c in text[:limit])
    return out + ("..." if len(text) > limit else "")


def check_training_run(
    *, run_id: str, experiment_name: str, tags: Mapping[str, str], experiment: str, sha: str, workflow_run_id: int,
    attempt: int = 1, server: bool = True,
) -> list[str]:
    """Why this MLflow run is not the training the attestation is for ([] = it is).

    On a tracking server (`server`) only a run in this launch's own job experiment counts
    (`<experiment>/job-<run>-<attempt>`, made by the trusted `job-identity` job and writable by
    this launch's identity alone): tags are the job's to write, so a run elsewhere that claims
    this workflow run proves nothing. A local store (a laptop) has one identity: `<experiment>`."""
    problems = []
    from pipelines.trusted.job_identity import is_job_experiment

    own = is_job_experiment(experiment_name, experiment, workflow_run_id, attempt)
    if not own and (server or experiment_name != experiment):
        problems.append(f"run {run_id} is in MLflow experiment {shown(experiment_name)!r}, not this launch's "
                        f"`{experiment}/job-{workflow_run_id}-{attempt}`")
    if tags.get("pipeline.git_sha") != sha:
        problems.append(f"run {run_id} was not made from the approved commit `{sha[:12]}`")
    if tags.get("pipeline.dirty", "false").lower() == "true":
        problems.append(f"run {run_id} was made from a working tree with uncommitted changes")
    if tags.get("pipeline.github_run_id") != str(workflow_run_id):
        problems.append(f"run {run_id} is not tagged with this workflow run ({workflow_run_id})")
    return problems


def artifact_location_problem(artifact_uri: str, tracking_uri: str | None) -> str | None:
    """Why the attestor must not read from this artifact location (None = it may).

    The attestor's credential goes wherever the client fetches artifacts. On a tracking server
    the only place is the server's own proxy, `mlflow-artifacts:` with no host of its own (a
    `mlflow-artifacts://other-host/...` is fetched from that host); an `http(s)://`, `s3://`...
    location chosen by PR code (an experiment's artifact location) is refused. A local store
    (sqlite or a folder: a laptop, the tests) has one identity and no credential: local paths."""
    parts = urlsplit(artifact_uri)
    scheme = parts.scheme.lower()
    track = urlsplit(tracking_uri or "")
    if scheme == "mlflow-artifacts" and parts.netloc in ("", track.netloc) and track.scheme in ("http", "https"):
        return None
    local_store = track.scheme.lower() not in ("http", "https", "databricks")
    if local_store and scheme in ("", "file") and parts.netloc in ("", "localhost"):
        return None
    expected = "the server's own `mlflow-artifacts:` location" if not local_store else "a local path"
    return f"artifact location {shown(artifact_uri, 200)!r} is not {expected}: nothing is downloaded from it"


# --------------------------------------------------------------------------- MLflow adapter


def _is_server(tracking_uri: str | None) -> bool:
    """A tracking server has users (job identities); a local store (sqlite, files) has one."""
    from pipelines.trusted.job_identity import has_users

    return has_users(tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"))


def _client(tracking_uri: str | None) -> Any:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def provenance_experiment_id(client: Any, experiment_id: str | None = None) -> str | None:
    """The provenance store: by id when configured (the deployment), else by name (tests, a laptop)."""
    if experiment_id:
        return str(client.get_experiment(experiment_id).experiment_id)
    exp = client.get_experiment_by_name(PROVENANCE_EXPERIMENT)
    return None if exp is None else str(exp.experiment_id)


def attest(
    *,
    tracking_uri: str | None,
    pr: int,
    sha: str,
    experiment: str,
    workflow_run_id: int,
    result: Mapping[str, Any],
    provenance_id: str | None = None,
    attempt: int = 1,
    plan: Any = None,
    trusted_code: bool = False,
) -> Attestation:
    """Check the training job's claims against MLflow and write the attestation (attestor credential).

    With the launch plan (`pipelines.trusted.registry.ExperimentPlan`, from the trusted `plan` job;
    single experiments and sweeps alike) the verdict recorded is the one trusted code computes
    from the attested metrics against the claim's registration (`pipeline.verdict_by=trusted`;
    the report's own is kept as `pipeline.reported_verdict`), candidate
    runs the plan let the job reuse need not be this job's, and the launch goes into the
    trusted registry (`trusted_code`: the commit's code outside experiments/ is the default
    branch's, so its runs may be reused by any launch)."""
    if not _SHA.match(sha) or not _NAME.match(experiment) or pr <= 0 or workflow_run_id <= 0:
        raise AttestationRefused("malformed PR, SHA, experiment or workflow run id")
    ids = candidate_run_ids(result)
    if not ids:
        raise AttestationRefused("the report names no candidate MLflow run")
    client = _client(tracking_uri)
    problems: list[str] = []
    statuses = []
    if plan is None:  # the attest job names the plan file the trusted `plan` job wrote
        from pipelines.launch_plan import launch_plan
        from pipelines.trusted.registry import trusted_code_at

        given = launch_plan()
        plan = given.for_experiment(experiment) if given is not None and given.sha == sha else None
        trusted_code = plan is not None and trusted_code_at(Path.cwd(), plan)
    reused = set(plan.reuse.get("candidate", ())) if plan is not None else set()
    for rid in ids:
        run = client.get_run(rid)
        exp_name = client.get_experiment(run.info.experiment_id).name
        problems += [] if rid in reused else check_training_run(
            run_id=rid, experiment_name=exp_name, tags=run.data.tags, experiment=experiment, sha=sha,
            workflow_run_id=workflow_run_id, attempt=attempt, server=_is_server(tracking_uri))
        where = artifact_location_problem(run.info.artifact_uri, tracking_uri)
        if where:  # checked before any request to it: the attestor's credential would go there
            problems.append(f"run {rid}: {where}")
        statuses.append(run.info.status)
    if problems:
        raise AttestationRefused("; ".join(problems))
    status = "FINISHED" if all(s == "FINISHED" for s in statuses) else next(s for s in statuses if s != "FINISHED")
    # Without a configured id (a laptop, a test store) the store is found, or made, by name. A
    # deployment sets the id: a trainer could make an experiment of that name on a fresh server
    # (the attestor then cannot write it, so this fails closed), never one with a given id.
    store = provenance_experiment_id(client, provenance_id) or str(client.create_experiment(PROVENANCE_EXPERIMENT))
    verdict = verdict_of(result)
    trusted = None
    if plan is not None:
        from pipelines.trusted.registry import TrustedRegistry, attested_facts, trusted_verdict

        registry = TrustedRegistry(client, store)
        facts, fact_problems = attested_facts(client, registry, plan, result, sha=sha, workflow_run_id=workflow_run_id,
                                             attempt=attempt, server=_is_server(tracking_uri))
        trusted = trusted_verdict(plan, facts, result.get("hypothesis") or {}, verdict)
    hypothesis = str((result.get("hypothesis") or {}).get("statement") or "")[:5000]
    tags = {
        "pipeline.pr": str(pr), "pipeline.sha": sha, "pipeline.experiment": experiment,
        "pipeline.github_run_id": str(workflow_run_id), "pipeline.training_run_id": ids[0],
        "pipeline.training_run_ids": ",".join(ids), "pipeline.training_status": status,
        "pipeline.verdict": verdict or "", "pipeline.hypothesis": hypothesis, "pipeline.attested_by": ATTESTED_BY,
        # No plan for this experiment: the verdict is the report's own (PR code computed it), and
        # promotion does not accept it (pipelines/trusted/promote.py: only `trusted` counts).
        "pipeline.verdict_by": "report",
    }
    if trusted is not None:
        from pipelines.trusted.registry import verdict_tags

        tags |= {"pipeline.verdict": trusted.outcome, "pipeline.reported_verdict": verdict or "",
                 "pipeline.verdict_by": "trusted", "pipeline.launch_kind": plan.kind,
                 "pipeline.record_problems": "; ".join(fact_problems)[:5000], **verdict_tags(trusted)}
    run = client.create_run(store, tags=tags, run_name=f"pr-{pr}-{experiment}-{sha[:12]}")
    where = artifact_location_problem(run.info.artifact_uri, tracking_uri)
    if where:
        client.set_terminated(run.info.run_id, "FAILED")
        raise AttestationRefused(f"the provenance store's {where}")
    try:
        _copy_model(client, ids[0], run.info.run_id)
    except Exception:
        client.set_terminated(run.info.run_id, "FAILED")
        raise
    client.set_terminated(run.info.run_id, "FINISHED")
    if trusted is not None:
        from pipelines.trusted.registry import record_attested

        record_attested(registry, plan, facts, pr=pr, sha=sha, attestation_run_id=run.info.run_id,
                        trusted_code=trusted_code)
        return Attestation(run.info.run_id, ids, trusted.outcome, status)
    return Attestation(run.info.run_id, ids, verdict, status)


def _copy_model(client: Any, src_run: str, dst_run: str) -> None:
    """The candidate's `model/` artifacts into the attestation run (nothing when it logged none)."""
    if not client.list_artifacts(src_run, MODEL_DIR):
        return
    with tempfile.TemporaryDirectory() as tmp:
        local = client.download_artifacts(src_run, MODEL_DIR, tmp)
        client.log_artifacts(dst_run, local, MODEL_DIR)


class ProvenanceLookup:
    """`TrainingLookup` over attestations only: never a tag or a start time the trainer wrote."""

    def __init__(self, tracking_uri: str | None, provenance_id: str | None = None):
        self.client = _client(tracking_uri)
        self.provenance_id = provenance_id

    def training_record(self, experiment: str, sha: str, accept: RunFilter | None = None) -> TrainingRecord | None:
        """The latest attestation for `experiment` at `sha` that `accept` admits (the attestor
        set its start time, so "latest" is the last attested training, not a writer's claim)."""
        assert _SHA.match(sha) and _NAME.match(experiment), "validated values only: they go into a filter string"
        store = provenance_experiment_id(self.client, self.provenance_id)
        if store is None:
            return None
        runs = self.client.search_runs(
            [store], filter_string=(f"tags.`pipeline.sha` = '{sha}' and tags.`pipeline.experiment` = '{experiment}' "
                                    f"and tags.`pipeline.attested_by` = '{ATTESTED_BY}'"),
            order_by=["attributes.start_time DESC"], max_results=50,
        )
        admitted = [r for r in runs if r.info.status == "FINISHED" and (accept is None or accept(r.data.tags))]
        if not admitted:
            return None
        best = admitted[0]
        tags = best.data.tags
        return TrainingRecord(
            experiment=experiment,
            mlflow_run_id=tags["pipeline.training_run_id"],
            code_version=sha,
            status=tags.get("pipeline.training_status", "UNKNOWN"),
            dirty=False,  # the attestor refused dirty runs
            verdict=tags.get("pipeline.verdict") or None,
            verdict_by=tags.get("pipeline.verdict_by") or None,
            gates_passed=None,
            model_source=f"{best.info.artifact_uri.rstrip('/')}/{MODEL_DIR}",
            hypothesis=tags.get("pipeline.hypothesis", ""),
            pr=int(tags["pipeline.pr"]),
            workflow_run_id=int(tags["pipeline.github_run_id"]),
            attestation_run_id=best.info.run_id,
        )


# --------------------------------------------------------------------------- operator set-up


@dataclass(frozen=True)
class SetupResult:
    provenance_experiment_id: str
    model_name: str


# Rights another user may hold on the provenance store and the registered model.
OTHERS_MAY_HOLD = frozenset({"READ", "NO_PERMISSIONS"})
OWNER_NEEDS = frozenset({"EDIT", "MANAGE"})


def rights_problems(what: str, permissions: Mapping[str, str], *, owner: str) -> list[str]:
    """Why `what` is not the attestor's alone (pure): `permissions` is user -> effective MLflow
    permission (explicit, through a role, or the server's default) of every non-admin user."""
    others = sorted(f"{u} ({p})" for u, p in permissions.items() if u != owner and p.upper() not in OTHERS_MAY_HOLD)
    problems = []
    if others:
        problems.append(f"{what}: {', '.join(others)} can write it; only `{owner}` may (someone made it first, "
                        "shared it, or the server's default permission is above READ)")
    if permissions.get(owner, "").upper() not in OWNER_NEEDS:
        problems.append(f"{what}: `{owner}` cannot write it ({permissions.get(owner, 'unknown')})")
    return problems


def setup(
    *, tracking_uri: str, model_name: str, reader: tuple[str, str], attestor: tuple[str, str],
    admin: tuple[str, str],
) -> SetupResult:
    """Users, the provenance experiment and the registered model, made with the attestor's
    credential (so it holds MANAGE; the reader, the `plan` and `report` jobs' read-only login,
    keeps the server's default READ). No training login is made: a training job's identity
    is made per launch and revoked after it (pipelines/trusted/job_identity.py). Idempotent.

    Refuses (`UsageError`) a store or a model on which any non-admin user other than the
    attestor holds more than READ, as the basic-auth app resolves it (explicit grants, roles,
    the default): a trainer that made the name first would keep MANAGE. Needs the `basic-auth`
    app with `default_permission = READ` (docs/operations.md)."""
    from mlflow.exceptions import MlflowException
    from mlflow.server import get_app_client
    from mlflow.server.auth.routes import LIST_USERS

    from basics.errors import UsageError

    def login(user: tuple[str, str]) -> None:
        os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = user

    # The caller's credential (or none) is back afterwards, whoever logged in last.
    with scoped_environ(MLFLOW_TRACKING_USERNAME=admin[0], MLFLOW_TRACKING_PASSWORD=admin[1]):
        auth = get_app_client("basic-auth", tracking_uri=tracking_uri)
        for name, password in (reader, attestor):
            try:
                auth.get_user(name)
            except MlflowException:
                auth.create_user(name, password)
        login(attestor)
        client = _client(tracking_uri)
        exp = client.get_experiment_by_name(PROVENANCE_EXPERIMENT)
        exp_id = str(exp.experiment_id) if exp else str(client.create_experiment(PROVENANCE_EXPERIMENT))
        try:
            client.get_registered_model(model_name)
        except MlflowException:
            client.create_registered_model(model_name, description="Promoted by the GitOps training pipeline on merge.")
        login(admin)  # only an admin may list users and read their permissions
        users = [u["username"] for u in auth._request(LIST_USERS, "GET").get("users", []) if not u.get("is_admin")]

        def rights(resource_type: str, resource_id: str) -> dict[str, str]:
            return {u: auth.get_user_permission(u, resource_type, resource_id).permission for u in users}

        problems = (rights_problems(f"provenance experiment {exp_id} (`{PROVENANCE_EXPERIMENT}`)",
                                    rights("experiment", exp_id), owner=attestor[0])
                    + rights_problems(f"registered model `{model_name}`", rights("registered_model", model_name),
                                      owner=attestor[0]))
        if problems:
            raise UsageError("refusing to use them: " + "; ".join(problems)
                             + ". Delete them as admin (or choose another --model-name) and run setup again")
        login(attestor)
        probe = client.create_run(exp_id, run_name="setup-probe")
        client.delete_run(probe.info.run_id)
        client.set_registered_model_tag(model_name, "pipeline.registry_owner", attestor[0])
        return SetupResult(exp_id, model_name)


def read_result(path: Path) -> dict[str, Any]:
    """A result.json from the report artifact (data written by the trained commit's code)."""
    if path.is_symlink() or not path.is_file() or path.stat().st_size > 5_000_000:
        raise AttestationRefused(f"no usable {path.name} in the report artifact")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise AttestationRefused(f"{path.name} is not a JSON object")
    return data


__all__: Sequence[str] = (
    "ATTESTED_BY", "PROVENANCE_EXPERIMENT", "Attestation", "AttestationRefused", "ProvenanceLookup",
    "attest", "candidate_run_ids", "check_training_run", "read_result", "setup", "verdict_of",
)
