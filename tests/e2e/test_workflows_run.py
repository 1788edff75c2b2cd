"""What nektos/act cannot do: give each job its own GITHUB_TOKEN.

tests/e2e/test_workflows_act.py runs every workflow with act. act hands one token to every
job of a run, so the scenario "the training job's token never writes (it only reads the PR
head before any PR code) and the short report job posts with its own, fresh token" (issue
14 item 3, issue 19 item 6) runs here,
with the emulated runner (tests/infra/workflow_runner.py), which mints tokens per job.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.github.client import PyGithubHost
from pipelines.github.comment import StickyComment, parse_state
from tests.infra.github_emulator import GitHubEmulator, emulator_config
from tests.infra.workflow_runner import EmulatedRepository, JobResult, WorkflowRunner

FIXTURES = Path(__file__).parents[1] / "fixtures" / "github" / "workflows"
REPO_NAME = "acme/lab"
PR = 7
EXPERIMENT = "higher-lr"
# A very small baseline and candidate the /train test adds in its PR (trains in seconds).
TINY = FIXTURES / "experiments"


def fixture(name: str, repo: str = REPO_NAME) -> dict:
    payload = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    owner, short = repo.split("/")
    payload["repository"].update(full_name=repo, name=short, owner={"login": owner})
    return payload


def explain(results: dict[str, JobResult]) -> str:
    return "\n".join(f"=== job {j}: {r.result}\n{r.log()}" for j, r in results.items())


class Flow:
    """A repository, a PR branch that changes one experiment, the emulator and a runner."""

    def __init__(self, tmp: Path, gh: GitHubEmulator, tiny: bool = False):
        """`tiny`: the PR adds a very small baseline and candidate (TINY, on one small demo
        source), so that /train trains both in seconds; otherwise it edits the example
        experiment higher-lr."""
        self.gh = gh
        self.repo = EmulatedRepository.from_working_tree(tmp / "origin", REPO_NAME)
        self.base_sha = self.repo.head()
        self.repo.git("checkout", "-q", "-b", "exp/higher-lr")
        if tiny:
            self.experiment, files = "wf-candidate", sorted(TINY.glob("*.yaml"))
            for source in files:
                (self.repo.path / "experiments" / source.name).write_bytes(source.read_bytes())
            changed = [f"experiments/{f.name}" for f in files]
        else:
            self.experiment, changed = EXPERIMENT, [f"experiments/{EXPERIMENT}.yaml"]
            spec = self.repo.path / "experiments" / f"{EXPERIMENT}.yaml"
            spec.write_text(spec.read_text(encoding="utf-8").replace(
                "description: ", "description: (PR under test) ", 1), encoding="utf-8")
        self.repo.git("add", "-A")
        self.head_sha = self.repo.commit("Propose higher-lr")
        self.repo.git("checkout", "-q", self.repo.default_branch)
        self.main_sha = self.repo.head()

        gh.add_repo(REPO_NAME)
        gh.set_permission(REPO_NAME, "maria", "write")
        gh.set_permission(REPO_NAME, "carol", "write")
        gh.set_permission(REPO_NAME, "rex", "write")
        gh.add_pull(REPO_NAME, number=PR, author="carol", head_sha=self.head_sha, base_sha=self.base_sha,
                    head_ref="exp/higher-lr", files=changed)
        # The contents API serves this repository's commits (/train re-validates the files at the SHA).
        gh.serve_git(REPO_NAME, str(self.repo.path))
        env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}", "PIPELINE_RUNS_ROOT": str(tmp / "runs"),
               "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
        self.runner = WorkflowRunner(self.repo, tmp / "jobs", gh.base_url, gh.token, extra_env=env,
                                     vars={"MLFLOW_TRACKING_URI": env["MLFLOW_TRACKING_URI"]},
                                     secrets={"MLFLOW_TRACKING_TOKEN": "not-needed-for-sqlite"})
        (tmp / "jobs").mkdir()

    def sticky(self) -> list[dict]:
        marker = f"<!-- gitops-train:experiment={self.experiment} -->"
        return [c for c in self.gh.comments(REPO_NAME, PR) if marker in c["body"]]


@pytest.fixture
def tiny_flow(tmp_path: Path):
    with GitHubEmulator() as gh:
        yield Flow(tmp_path, gh, tiny=True)


@pytest.mark.timeout(1200)
def test_the_report_lands_although_the_training_jobs_token_expired(tiny_flow: Flow) -> None:
    flow = tiny_flow
    # The checks passed on the head (what experiment-comment records; act runs that part).
    host = PyGithubHost(emulator_config(flow.gh, repo=REPO_NAME))
    StickyComment.for_experiment(host, PR, flow.experiment, author=flow.gh.bot_login).upsert(
        "Awaiting `/train`", {"validated_sha": flow.head_sha}, head_sha=flow.head_sha)

    comment = fixture("issue_comment")
    comment["issue"]["number"] = PR
    comment["comment"]["body"] = f"/train {flow.experiment}"
    # GITHUB_TOKEN lives at most 24 h; a training may take 72. Since issue 19 the training
    # job's token can only read (its first step asks for the PR head with it) and PR code is
    # handed no token at all: every comment comes from the short report job, with its own.
    train_token = flow.gh.issue_token()
    flow.runner.job_tokens["train"] = train_token
    flow.runner.extra_env["PIPELINE_COMMENT_INTERVAL_S"] = "0.5"  # progress would be posted if a token were there
    results = flow.runner.run_workflow("experiment-train.yml", "issue_comment", comment, sha=flow.main_sha,
                                       only={"authorize", "plan", "job-identity", "train", "attest", "report"})
    assert results["authorize"].outputs.get("launch") == "true", explain(results)
    assert results["train"].result == "success", explain(results)
    assert results["report"].result == "success", explain(results)
    used = flow.gh.requests_by_token(train_token)
    assert used and all(method == "GET" for method, _, _ in used), used  # the head check, nothing written
    (sticky,) = flow.sticky()
    assert any(w in sticky["body"].lower() for w in ("supported", "refuted", "inconclusive")), sticky["body"]
    assert parse_state(sticky["body"])["validated_sha"] == flow.head_sha
