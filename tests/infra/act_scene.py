"""A pull request on an emulated repository, ready for nektos/act: the `Scene` the act tests
drive (tests/e2e/test_workflows_act.py, tests/e2e/test_workflows_trust_models.py).

`make_scene` builds the origin repository with a PR branch (the tiny experiments of
tests/fixtures/github/workflows/experiments, or higher-lr edited), registers it with the
GitHub emulator (PR 7 by carol; writers maria, carol, rex; reader mallory) and points an
`ActRunner` at the emulator. The Scene builds webhook payloads for that PR and runs the PR
check plus its workflow_run comment.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from tests.act.runner import ActRun, ActRunner
from tests.infra.github_emulator import GitHubEmulator
from tests.infra.workflow_runner import EmulatedRepository

FIXTURES = Path(__file__).parents[1] / "fixtures" / "github" / "workflows"
REPO_NAME = "acme/lab"
PR = 7
TINY = FIXTURES / "experiments"
TRAIN_WORKFLOW = ".github/workflows/experiment-train.yml"


def event_fixture(name: str) -> dict:
    """The webhook payload `tests/fixtures/github/workflows/<name>.json`, for REPO_NAME."""
    payload = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    owner, short = REPO_NAME.split("/")
    payload["repository"].update(full_name=REPO_NAME, name=short, owner={"login": owner}, default_branch="main")
    return payload


@dataclass
class Scene:
    gh: GitHubEmulator
    repo: EmulatedRepository
    act: ActRunner
    experiment: str
    base_sha: str
    head_sha: str
    main_sha: str
    tmp: Path

    # ------------------------------------------------------------------ events

    def pull_request(self, action: str = "opened") -> dict:
        payload = event_fixture("pull_request")
        pr = payload["pull_request"]
        payload.update(action=action, number=PR)
        pr["number"] = PR
        pr["head"].update(sha=self.head_sha, repo={"full_name": REPO_NAME, "fork": False})
        pr["base"].update(sha=self.base_sha, repo={"full_name": REPO_NAME, "fork": False})
        return payload

    def workflow_run(self, run_id: int, conclusion: str) -> dict:
        payload = event_fixture("workflow_run")
        payload["workflow_run"].update(id=run_id, head_sha=self.head_sha, conclusion=conclusion, event="pull_request",
                                       head_repository={"full_name": REPO_NAME},
                                       repository={"full_name": REPO_NAME})
        return payload

    def comment(self, body: str, user: str = "maria") -> dict:
        payload = event_fixture("issue_comment")
        payload["issue"]["number"] = PR
        payload["comment"].update(body=body, user={"login": user, "type": "User"})
        payload["sender"] = {"login": user, "type": "User"}
        return payload

    # ------------------------------------------------------------------ flows

    def pr_checks(self, run_id: int = 501) -> tuple[ActRun, ActRun]:
        checked = self.act.run("experiment-pr.yml", "pull_request", self.pull_request(), sha=self.head_sha,
                               run_id=run_id)
        conclusion = "success" if checked.returncode == 0 and checked["check"].result == "success" else "failure"
        commented = self.act.run("experiment-comment.yml", "workflow_run", self.workflow_run(run_id, conclusion),
                                 sha=self.main_sha, run_id=run_id + 1)
        return checked, commented

    def sticky(self) -> list[dict]:
        marker = f"<!-- gitops-train:experiment={self.experiment} -->"
        return [c for c in self.gh.comments(REPO_NAME, PR) if c["body"].startswith(marker)]


def make_scene(tmp: Path, gh: GitHubEmulator, *, tiny: bool, invalid: bool = False,
               candidate_only: bool = False) -> Scene:
    """`candidate_only` (with `tiny`): the tiny baseline wf-base is already on main and the PR
    adds only wf-candidate, so the PR check validates, plans, prepares and smoke-trains one
    experiment, not two."""
    repo = EmulatedRepository.from_working_tree(tmp / "origin", REPO_NAME)
    repo.git("remote", "add", "origin", f"https://github.com/{REPO_NAME}.git")  # act derives github.repository from it
    if candidate_only:
        shutil.copy(TINY / "wf-base.yaml", repo.path / "experiments" / "wf-base.yaml")
        repo.git("add", "experiments/wf-base.yaml")
        repo.commit("The tiny baseline")
    base_sha = repo.head()
    repo.git("checkout", "-q", "-b", "exp/higher-lr")
    if tiny:
        experiment = "wf-candidate"
        files = [TINY / "wf-candidate.yaml"] if candidate_only else sorted(TINY.glob("*.yaml"))
        for source in files:
            shutil.copy(source, repo.path / "experiments" / source.name)
        changed = [f"experiments/{f.name}" for f in files]
    else:
        experiment, changed = "higher-lr", ["experiments/higher-lr.yaml"]
        spec = repo.path / "experiments" / "higher-lr.yaml"
        text = spec.read_text(encoding="utf-8").replace("description: ", "description: (PR under test) ", 1)
        if invalid:
            text = text.replace("  lr: 6.0e-3", "  lr: -6.0e-3", 1)
            assert "lr: -6.0e-3" in text
        spec.write_text(text, encoding="utf-8")
    repo.git("add", "-A")
    head_sha = repo.commit("Propose an experiment")
    repo.git("checkout", "-q", repo.default_branch)
    main_sha = repo.head()

    gh.add_repo(REPO_NAME)
    for user in ("maria", "carol", "rex"):
        gh.set_permission(REPO_NAME, user, "write")
    gh.set_permission(REPO_NAME, "mallory", "read")
    gh.add_pull(REPO_NAME, number=PR, author="carol", head_sha=head_sha, base_sha=base_sha,
                head_ref="exp/higher-lr", files=changed)
    gh.serve_git(REPO_NAME, str(repo.path))
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}", "PIPELINE_RUNS_ROOT": str(tmp / "runs"),
           "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1", "PIPELINE_GITHUB_SECONDS_BETWEEN_WRITES": "0",
           "PIPELINE_GITHUB_SECONDS_BETWEEN_REQUESTS": "0", "PIPELINE_COMMENT_INTERVAL_S": "1"}
    act = ActRunner(repo.path, REPO_NAME, tmp / "act", gh.base_url, gh.token, env=env,
                    vars={"MLFLOW_TRACKING_URI": env["MLFLOW_TRACKING_URI"]},
                    secrets={"MLFLOW_TRACKING_TOKEN": "not-needed-for-sqlite"})
    return Scene(gh, repo, act, experiment, base_sha, head_sha, main_sha, tmp)
