"""The state kept on the trusted side, proven through the workflow itself (issue 28 item 6).

`.github/workflows/experiment-train.yml` runs job by job in the emulated runner
(tests/infra/workflow_runner.py: a fresh clone per job, a GitHub token per job, which act
cannot give) against the GitHub emulator and a real `mlflow server --app-name basic-auth`,
configured as docs/operations.md section 4 tells an operator: the server checks training jobs'
GitHub OIDC tokens (pipelines/trusted/mlflow_oidc.py, against the emulated issuer
tests/infra/oidc_issuer.py), `pipeline provenance setup` (users `reader` and `attestor`, the
provenance store, the registered model), then the variables `MLFLOW_TRACKING_URI`,
`MLFLOW_PROVENANCE_EXPERIMENT_ID`, the shared `PIPELINE_RUNS_DIR` and `PIPELINE_DATA_CACHE`,
and the secrets scoped per environment as GitHub scopes them (`provenance`: the attestor's;
`provenance-read`: the reader's; `job-identity`: the admin's; `gpu-training`: none). Each
step's log starts with its `env:` as the Actions runner prints it, and the PR's own Makefile
runs at `make setup-train`. One server, one repository and one pull request (the tiny baseline
and candidate of tests/fixtures/github/workflows/experiments) for the module, three launches:

1. `/train wf-candidate`: trains both, registers the claim (confirmatory, seed 1234; one
   seed: inconclusive) and attests;
2. `/train wf-candidate` again, in fresh workspaces: the plan reuses both attested runs and
   nothing is trained; the report still lands;
3. one push that renames the candidate and adds a seed, and whose `reports/` code (run by the
   training job, tests/fixtures/github/workflows/state/forge.py) forges a registration, an
   attestation, other jobs' metrics and the champion alias with the job's own identity (its
   OIDC token), tries to create experiments and grants, and rewrites its report's verdict to
   `supported`; and whose Makefile's `setup-train` (PR code at install time) collects every
   value it can read; `/train wf-candidate-v2`:
   planned exploratory (the registration of launch 1 stays in force, the headline says so),
   one new seed of each role trained, every forgery refused with 403, and the attestation,
   the registry and what promotion reads are the trusted ones.

Each launch is a module fixture built on the one before, so every test also passes alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from basics.environment import scoped_environ
from pipelines.github.client import PyGithubHost
from pipelines.github.comment import StickyComment
from pipelines.launch_plan import CONFIRMATORY, EXPLORATORY, ExperimentPlan, LaunchPlan
from pipelines.tracked_runs import FETCHED_FILE
from tests.infra.github_emulator import GitHubEmulator, emulator_config
from tests.infra.mlflow_auth_server import MlflowAuthServer
from tests.infra.oidc_issuer import OidcIssuer
from tests.infra.workflow_runner import EmulatedRepository, JobResult, WorkflowRunner

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).parents[1] / "fixtures" / "github" / "workflows"
TINY = FIXTURES / "experiments"
FORGE = FIXTURES / "state" / "forge.py"
REPO_NAME = "acme/lab"
PR = 7
ATTESTOR = ("attestor", "attestor-password-0123")
READER = ("reader", "reader-password-0123")
JOBS = {"authorize", "plan", "job-identity", "train", "attest", "report"}
WORKFLOW_REF = f"{REPO_NAME}/.github/workflows/experiment-train.yml@refs/heads/main"
NOT_SET_HERE = {
    "PIPELINE_DATA_ROOTS": "unset: the demo data lives under data/",
    "PIPELINE_REGISTRY_MODEL": "unset: the default `gitops-train`, the name `provenance setup` made",
    "RUNNERS_READ_TOKEN": "the informational `capacity` job is not run",
}
"""The workflow's variables and secrets this deployment leaves unset, and why."""


def explain(results: dict[str, JobResult]) -> str:
    return "\n".join(f"=== job {j}: {r.result}\n{r.log()}" for j, r in results.items() if r.result != "skipped")


@dataclass
class Launch:
    run_id: int
    sha: str
    experiment: str
    results: dict[str, JobResult]
    plan: ExperimentPlan
    report_token: str

    def log(self, job: str) -> str:
        return self.results[job].log()


class Lab:
    """The MLflow server set up by the operator, the repository with the PR, the runner."""

    def __init__(self, tmp: Path, server: MlflowAuthServer, gh: GitHubEmulator, oidc: OidcIssuer):
        from typer.testing import CliRunner

        from pipelines.cli import app

        self.server, self.gh, self.uri = server, gh, server.uri
        # docs/operations.md section 4: once, as the operator.
        done = CliRunner().invoke(app, ["provenance", "setup", "--tracking-uri", self.uri], env={
            "MLFLOW_ADMIN_USERNAME": server.admin[0], "MLFLOW_ADMIN_PASSWORD": server.admin[1],
            "MLFLOW_READER_PASSWORD": READER[1], "MLFLOW_ATTESTOR_PASSWORD": ATTESTOR[1]})
        assert done.exit_code == 0, done.output
        self.store_id = re.search(r"MLFLOW_PROVENANCE_EXPERIMENT_ID=(\S+)", done.output).group(1)  # type: ignore[union-attr]

        self.repo = EmulatedRepository.from_working_tree(tmp / "origin", REPO_NAME)
        self.base_sha = self.repo.head()
        self.repo.git("checkout", "-q", "-b", "exp/higher-lr")
        for source in sorted(TINY.glob("*.yaml")):
            (self.repo.path / "experiments" / source.name).write_bytes(source.read_bytes())
        self.repo.git("add", "-A")
        self.sha1 = self.repo.commit("Propose wf-candidate")
        self.repo.git("checkout", "-q", self.repo.default_branch)
        self.main_sha = self.repo.head()

        gh.add_repo(REPO_NAME)
        for login in ("maria", "carol"):
            gh.set_permission(REPO_NAME, login, "write")
        gh.add_pull(REPO_NAME, number=PR, author="carol", head_sha=self.sha1, base_sha=self.base_sha,
                    head_ref="exp/higher-lr", files=["experiments/wf-base.yaml", "experiments/wf-candidate.yaml"])
        self._serve_experiments(self.sha1)
        self.host = PyGithubHost(emulator_config(gh, repo=REPO_NAME))
        (tmp / "jobs").mkdir()
        # The repository's variables and the environments' secrets (docs/operations.md section 2),
        # each secret only in its environment; storage shared by every runner.
        self.shared = tmp / "shared"
        self.runner = WorkflowRunner(
            self.repo, tmp / "jobs", gh.base_url, gh.token,
            extra_env={"MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"},
            vars={"MLFLOW_TRACKING_URI": self.uri, "MLFLOW_PROVENANCE_EXPERIMENT_ID": self.store_id,
                  "PIPELINE_RUNS_DIR": str(self.shared / "runs"), "PIPELINE_DATA_CACHE": str(self.shared / "cache")},
            env_secrets={
                "provenance": {"MLFLOW_ATTESTOR_USERNAME": ATTESTOR[0], "MLFLOW_ATTESTOR_PASSWORD": ATTESTOR[1]},
                "provenance-read": {"MLFLOW_READER_USERNAME": READER[0], "MLFLOW_READER_PASSWORD": READER[1]},
                "job-identity": {"MLFLOW_ADMIN_USERNAME": server.admin[0], "MLFLOW_ADMIN_PASSWORD": server.admin[1]},
            },
            oidc=oidc)
        self.secret_values = [ATTESTOR[1], READER[1], server.admin[1]]

    # ----------------------------------------------------------------- the PR

    def push(self, message: str, change) -> str:  # noqa: ANN001 - a callable on the checkout
        """A commit on the PR branch; the emulator's PR head and files follow it."""
        self.repo.git("checkout", "-q", "exp/higher-lr")
        change(self.repo.path)
        self.repo.git("add", "-A")
        sha = self.repo.commit(message)
        files = self.repo.git("diff", "--name-only", self.base_sha, sha).split()
        self.repo.git("checkout", "-q", self.repo.default_branch)
        self.gh.push(REPO_NAME, PR, sha)
        self._serve_experiments(sha)
        self.gh.repos[REPO_NAME].files[PR] = [{"filename": f, "status": "added"} for f in files]
        return sha

    def _serve_experiments(self, sha: str) -> None:
        """The contents API's view of `sha` (what `authorize` re-validates): experiments/ only,
        read from git once (the emulator's `serve_git` reads every file of the commit)."""
        import subprocess

        names = self.repo.git("ls-tree", "-r", "--name-only", sha, "--", "experiments").split()
        self.gh.add_tree(REPO_NAME, sha, {n: subprocess.run(["git", "show", f"{sha}:{n}"], cwd=self.repo.path,
                                                            capture_output=True, check=True).stdout for n in names})

    def train(self, experiment: str, sha: str, run_id: int, *, revoke: bool = False) -> Launch:
        """`/train <experiment>` by a writer, after the PR checks passed on `sha` (what
        experiment-comment records; act runs that part)."""
        sticky = StickyComment.for_experiment(self.host, PR, experiment, author=self.gh.bot_login)
        if sticky.state().get("validated_sha") != sha:
            sticky.upsert("Awaiting `/train`", {"validated_sha": sha}, head_sha=sha)
        payload = json.loads((FIXTURES / "issue_comment.json").read_text(encoding="utf-8"))
        payload["repository"].update(full_name=REPO_NAME, name="lab", owner={"login": "acme"})
        payload["issue"]["number"] = PR
        payload["comment"]["body"] = f"/train {experiment}"
        token = self.gh.issue_token()
        self.runner.job_tokens["report"] = token
        jobs = JOBS | {"revoke-identity"} if revoke else JOBS
        results = self.runner.run_workflow("experiment-train.yml", "issue_comment", payload, sha=self.main_sha,
                                           run_id=run_id, only=jobs)
        for job in jobs:
            assert results[job].result == "success", explain(results)
        plan = LaunchPlan.from_json(results["plan"].outputs["plan"])
        (entry,) = plan.experiments
        assert plan.sha == sha and entry.experiment == experiment
        return Launch(run_id, sha, experiment, results, entry, token)

    # ----------------------------------------------------------------- MLflow, as admin

    def client(self) -> Any:
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)

    def admin(self):  # noqa: ANN201 - a context manager
        return scoped_environ(MLFLOW_TRACKING_USERNAME=self.server.admin[0],
                              MLFLOW_TRACKING_PASSWORD=self.server.admin[1])

    def training_runs(self, launch: Launch | None = None) -> list[Any]:
        """Training runs (every experiment but the provenance store); of one launch: the runs in
        its job's own experiment (`<experiment>/job-<run>-<attempt>`, made by the broker)."""
        client = self.client()
        if launch is not None:
            own = client.get_experiment_by_name(f"{launch.experiment}/job-{launch.run_id}-1")
            assert own is not None, "the broker made the job's experiment"
            return list(client.search_runs([own.experiment_id], max_results=1000))
        ids = [e.experiment_id for e in client.search_experiments() if e.experiment_id != self.store_id]
        return list(client.search_runs(ids, max_results=1000))

    def store(self, query: str) -> list[Any]:
        return list(self.client().search_runs([self.store_id], query, max_results=1000))

    def attestation(self, launch: Launch) -> dict[str, str]:
        (run,) = self.store(f"tags.`pipeline.github_run_id` = '{launch.run_id}' and "
                            "tags.`pipeline.attested_by` = 'experiment-train.yml/attest'")
        return dict(run.data.tags)

    def sticky(self, experiment: str) -> str:
        """The experiment's sticky comment as shown (without its hidden markers)."""
        marker = f"<!-- gitops-train:experiment={experiment} -->"
        (body,) = [c["body"] for c in self.gh.comments(REPO_NAME, PR) if marker in c["body"]]
        return re.sub(r"^(<!--.*?-->\n)+", "", body)


def _posted(lab: Lab, launch: Launch) -> bool:
    """The launch's report job wrote the sticky comment with its own token."""
    return any(method in ("POST", "PATCH") and "/comments" in path
               for method, path, _ in lab.gh.requests_by_token(launch.report_token))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("state")
    with OidcIssuer() as oidc, GitHubEmulator() as gh, MlflowAuthServer(tmp / "mlflow", oidc={
            "PIPELINE_OIDC_ISSUER": oidc.issuer, "PIPELINE_OIDC_REPOSITORY": REPO_NAME,
            "PIPELINE_OIDC_WORKFLOW_REF": WORKFLOW_REF}) as server:
        yield Lab(tmp, server, gh, oidc)


@pytest.fixture(scope="module")
def first(lab: Lab) -> Launch:
    return lab.train("wf-candidate", lab.sha1, 9101, revoke=True)


@pytest.fixture(scope="module")
def second(lab: Lab, first: Launch) -> Launch:
    return lab.train("wf-candidate", lab.sha1, 9102)


def _rename_and_add_a_seed(checkout: Path) -> None:
    old = checkout / "experiments" / "wf-candidate.yaml"
    text = old.read_text(encoding="utf-8").replace("name: wf-candidate", "name: wf-candidate-v2", 1)
    text = text.replace("  baseline: wf-base", "  baseline: wf-base\n  seeds: 2", 1)
    old.unlink()
    (checkout / "experiments" / "wf-candidate-v2.yaml").write_text(text, encoding="utf-8")


def _forge_from_the_training_job(checkout: Path) -> None:
    (checkout / "reports" / "forge.py").write_bytes(FORGE.read_bytes())
    # PR code at install time: the PR's own Makefile target, run by `make setup-train`.
    makefile = checkout / "Makefile"
    makefile.write_text(makefile.read_text(encoding="utf-8").replace(
        "setup-train:\n", "setup-train:\n\t@$(PY) reports/forge.py install\n", 1), encoding="utf-8")
    prereg = checkout / "reports" / "prereg.py"
    prereg.write_text(prereg.read_text(encoding="utf-8") + "\nfrom reports import forge as _forge  # noqa: E402,F401\n",
                      encoding="utf-8")


@pytest.fixture(scope="module")
def renamed(lab: Lab, first: Launch) -> tuple[Launch, dict[str, dict[str, float]]]:
    """One push: the candidate renamed with a second seed, and `reports/` code that forges
    (tests/fixtures/github/workflows/state/forge.py). Returns the launch and every run's
    metrics before it."""
    with lab.admin():
        before = {r.info.run_id: dict(r.data.metrics) for r in lab.training_runs() + lab.store("")}

    def change(checkout: Path) -> None:
        _rename_and_add_a_seed(checkout)
        _forge_from_the_training_job(checkout)

    sha = lab.push("Rename wf-candidate to wf-candidate-v2 with two seeds; improve the report", change)
    return lab.train("wf-candidate-v2", sha, 9103), before


# --------------------------------------------------------------------------- the tests


def test_the_deployment_is_configured_as_the_operations_guide_says(lab: Lab) -> None:
    """Every variable and secret experiment-train.yml reads is set here (or deliberately left
    unset), each one documented for the operator; `provenance setup` made the store and model."""
    workflow = (Path(__file__).parents[2] / ".github" / "workflows" / "experiment-train.yml").read_text(encoding="utf-8")
    read = set(re.findall(r"\b(?:vars|secrets)\.([A-Z][A-Z0-9_]*)", workflow))
    configured = set(lab.runner.vars) | set(lab.runner.secrets) | {
        name for scoped in lab.runner.env_secrets.values() for name in scoped}
    assert read == configured | set(NOT_SET_HERE), (read, configured)
    guide = (Path(__file__).parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    assert [name for name in sorted(read) if name not in guide] == []
    with lab.admin():
        assert lab.client().get_experiment(lab.store_id).name == "pipeline-provenance"
        assert lab.client().get_registered_model("gitops-train").tags["pipeline.registry_owner"] == ATTESTOR[0]


@pytest.mark.timeout(600)
def test_the_first_train_registers_the_claim_and_attests_both_runs(lab: Lab, first: Launch) -> None:
    plan = first.plan
    assert plan.kind == CONFIRMATORY and plan.new_registration and plan.seeds == (1234,)
    assert plan.reuse == {"candidate": (), "baseline": ()}
    with lab.admin():
        # Both runs in the job's own experiment (made by the broker, writable by the job's user only).
        trained = lab.training_runs(first)
        assert sorted(r.data.tags["pipeline.experiment"] for r in trained) == ["wf-base", "wf-candidate"]
        assert len(lab.training_runs()) == 2
        tags = lab.attestation(first)
        assert tags["pipeline.verdict_by"] == "trusted" and tags["pipeline.launch_kind"] == CONFIRMATORY
        assert tags["pipeline.record_problems"] == ""  # both runs recorded as this job's, reusable
        assert tags["pipeline.verdict"] == "inconclusive"  # one seed: no noise estimate
        (registration,) = lab.store("tags.`pipeline.registry` = 'registration'")
        entry = json.loads(registration.data.tags["pipeline.registration"])
        assert entry["claim"] == plan.claim and entry["seed_list"] == [1234] and entry["experiment"] == "wf-candidate"
        assert len(lab.store("tags.`pipeline.registry` = 'run'")) == 2
        # The job's user was deleted when the job ended.
        from mlflow.server import get_app_client

        with pytest.raises(Exception, match="RESOURCE_DOES_NOT_EXIST|not found|404"):
            get_app_client("basic-auth", tracking_uri=lab.uri).get_user("job-9101-1")
    assert _posted(lab, first)
    assert lab.sticky("wf-candidate").startswith("**Verdict (trusted, from attested metrics): inconclusive**")


@pytest.mark.timeout(600)
def test_a_second_train_in_fresh_workspaces_reuses_the_attested_runs_and_trains_nothing(
        lab: Lab, first: Launch, second: Launch) -> None:
    with lab.admin():
        by_role = {r.data.tags["pipeline.experiment"]: r.info.run_id for r in lab.training_runs(first)}
        # The trusted plan (before any PR code) names the first launch's attested runs.
        assert second.plan.kind == CONFIRMATORY and not second.plan.new_registration
        assert second.plan.reuse == {"candidate": (by_role["wf-candidate"],), "baseline": (by_role["wf-base"],)}
        # Nothing trained: no run of this workflow run, the job's own experiment stays empty.
        assert lab.training_runs(second) == [] and len(lab.training_runs()) == 2
        tags = lab.attestation(second)
        assert tags["pipeline.training_run_ids"] == by_role["wf-candidate"] and tags["pipeline.verdict_by"] == "trusted"
        # No second registration, no new run records: the reused runs have theirs.
        assert len(lab.store("tags.`pipeline.registry` = 'registration'")) == 1
        assert len(lab.store("tags.`pipeline.registry` = 'run'")) == 2
    # A fresh workspace and its own launch directory on the shared storage: its runs were fetched
    # from MLflow into it (not read from the first launch's directory), no checkpoint.
    workspace = second.results["train"].workspace
    assert workspace is not None and workspace != first.results["train"].workspace
    own = lab.shared / "runs" / f"launch-{second.run_id}-1-wf-candidate"
    seed_dirs = sorted(p.parent for p in own.rglob(FETCHED_FILE))
    assert len(seed_dirs) == 2, sorted(str(p) for p in (lab.shared / "runs").rglob("*"))
    assert sorted(p.name for p in (lab.shared / "runs").iterdir()) == [
        f"launch-{first.run_id}-1-wf-candidate", f"launch-{second.run_id}-1-wf-candidate"]
    assert not [p for d in seed_dirs for p in d.rglob("*") if "checkpoint" in p.name]
    # The report still lands.
    assert _posted(lab, second)
    assert lab.sticky("wf-candidate").startswith("**Verdict (trusted, from attested metrics): inconclusive**")


@pytest.mark.timeout(600)
def test_a_rename_with_new_seeds_after_an_inconclusive_registration_is_exploratory(
        lab: Lab, first: Launch, renamed: tuple[Launch, dict[str, Any]]) -> None:
    launch = renamed[0]
    plan = launch.plan
    assert plan.claim == first.plan.claim  # a rename and more seeds: the same claim
    assert plan.kind == EXPLORATORY and not plan.new_registration and plan.seeds == (1234, 1235)
    assert plan.registration is not None and plan.registration["seed_list"] == [1234]
    with lab.admin():
        by_role = {r.data.tags["pipeline.experiment"]: r.info.run_id for r in lab.training_runs(first)}
        assert plan.reuse["candidate"] == (by_role["wf-candidate"],) and plan.reuse["baseline"] == (by_role["wf-base"],)
        trained = [r for r in lab.training_runs(launch) if r.data.tags.get("pipeline.identity")]
        assert sorted((r.data.tags["pipeline.experiment"], r.data.tags["pipeline.seed"]) for r in trained) == [
            ("wf-base", "1235"), ("wf-candidate-v2", "1235")]  # only the new seed, of both roles
        tags = lab.attestation(launch)
        assert tags["pipeline.launch_kind"] == EXPLORATORY and tags["pipeline.verdict"] == "inconclusive"
        (registration,) = lab.store("tags.`pipeline.registry` = 'registration'")  # still the first one only
        entry = json.loads(registration.data.tags["pipeline.registration"])
        assert entry["experiment"] == "wf-candidate" and entry["seed_list"] == [1234]
        assert lab.store("tags.`pipeline.registry` = 'seeds' and tags.`pipeline.kind` = 'exploratory'")
    body = lab.sticky("wf-candidate-v2")
    assert body.startswith("**Verdict (trusted, from attested metrics): inconclusive** (this launch was exploratory: "
                           "the claim's registration decides)"), body[:500]


@pytest.mark.timeout(600)
def test_a_training_job_that_forges_the_trusted_side_changes_nothing_attest_or_promotion_reads(
        lab: Lab, renamed: tuple[Launch, dict[str, Any]]) -> None:
    from pipelines.trusted.provenance import ProvenanceLookup

    launch, before = renamed
    temp = launch.results["train"].workspace.parent / "_temp"  # type: ignore[union-attr]
    attempts = json.loads((temp / "forgery.json").read_text(encoding="utf-8"))
    # The PR's code ran in the training job with the job's own credential: every write to the
    # trusted side, to another job's runs or to the registry answered 403.
    assert int(attempts.pop("other jobs' runs found")) == 2, attempts  # the first launch's
    assert attempts.pop("own experiment: forged registration") == "written"
    assert attempts.pop("report: verdict supported") == "written"
    assert {"store: new registration", "store: attestation saying supported", "store: edit the registration",
            "store: a run record's metric snapshot", "another job's run 0: metric", "registry: model version",
            "registry: champion alias", "job identity: create an experiment",
            "job identity: share its experiment"} <= set(attempts)
    assert all(v == "denied" for v in attempts.values()), attempts
    with lab.admin():
        # The attestation carries the trusted verdict; the report's forged one is only noted.
        tags = lab.attestation(launch)
        assert tags["pipeline.verdict"] == "inconclusive" and tags["pipeline.reported_verdict"] == "supported"
        assert tags["pipeline.launch_kind"] == EXPLORATORY and tags["pipeline.verdict_by"] == "trusted"
        # The registry: one registration (the first launch's, not the forged one), every earlier
        # run and record with the metrics it had; no `supported` anywhere in the store.
        (registration,) = lab.store("tags.`pipeline.registry` = 'registration'")
        assert json.loads(registration.data.tags["pipeline.registration"])["seed_list"] == [1234]
        after = {r.info.run_id: dict(r.data.metrics) for r in lab.training_runs() + lab.store("")}
        assert {k: after[k] for k in before} == before
        assert not lab.store("tags.`pipeline.verdict` = 'supported'")
        # What promotion reads: the attest job's record, and no version or alias in the registry.
        record = ProvenanceLookup(lab.uri, lab.store_id).training_record("wf-candidate-v2", launch.sha)
        assert record is not None and record.verdict == "inconclusive" and record.workflow_run_id == launch.run_id
        assert lab.client().search_model_versions("name = 'gitops-train'") == []
    body = lab.sticky("wf-candidate-v2")
    assert "own report says `supported`" in body and "**Verdict: supported** (forged)" in body


@pytest.mark.timeout(600)
def test_pr_code_at_install_import_and_training_holds_no_secret(
        lab: Lab, first: Launch, second: Launch, renamed: tuple[Launch, dict[str, Any]]) -> None:
    """Issue 36: the training job held the credential-sealing key after the PR's own install,
    and its sealed tokens sat in a step's printed `env:`. Now no job that runs PR code holds
    any secret of the deployment: what the PR's Makefile (install) and its imported code
    (training) could read, and every printed log of every job, contain none of them, and no
    OIDC token is ever printed."""
    launch = renamed[0]
    temp = launch.results["train"].workspace.parent / "_temp"  # type: ignore[union-attr]
    leaks = {when: (temp / f"leak-{when}.json").read_text(encoding="utf-8") for when in ("install", "training")}
    assert all(leaks.values())
    seen = json.loads(leaks["training"])["env"]
    assert seen.get("MLFLOW_TRACKING_AUTH") == "github-oidc" and "MLFLOW_TRACKING_PASSWORD" not in seen
    for secret in lab.secret_values:
        assert [when for when, text in leaks.items() if secret in text] == []
        for done in (first, second, launch):
            assert [job for job, r in done.results.items() if secret in r.log()] == []
    for done in (first, second, launch):
        printed = "\n".join(r.log() for r in done.results.values())
        assert re.search(r"eyJ[A-Za-z0-9_-]{10,}\.eyJ", printed) is None  # no JWT in any log
    # The tokens the job could mint name its own launch only (the server maps them to job-<run>-<attempt>).
    assert {(c["run_id"], c["environment"]) for c in lab.runner.oidc.issued} <= {
        (str(d.run_id), "gpu-training") for d in (first, second, launch)}
