"""The workflows actually work: their own `run:` steps, executed in order.

experiment-pr.yml then experiment-comment.yml, then `/train` (local launcher, CPU)
and promotion on merge, each job in a fresh clone of a repository built from the
working tree, with an emulated runner (tests/workflow_runner.py) and the GitHub
emulator (tests/github_emulator.py) as the API. The asserts are on what a person
would see: the one sticky comment on the pull request.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from github_emulator import GitHubEmulator
from workflow_runner import EmulatedRepository, JobResult, WorkflowRunner

FIXTURES = Path(__file__).parent / "fixtures" / "github" / "workflows"
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
        """`tiny`: the PR adds a very small baseline and candidate (TINY), so that /train
        trains both in seconds; otherwise it edits the example experiment higher-lr."""
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

    def pull_request_payload(self, action: str = "opened") -> dict:
        payload = fixture("pull_request")
        pr = payload["pull_request"]
        payload.update(action=action, number=PR)
        pr["number"] = PR
        pr["head"].update(sha=self.head_sha, repo={"full_name": REPO_NAME, "fork": False})
        pr["base"].update(sha=self.base_sha, repo={"full_name": REPO_NAME, "fork": False})
        return payload

    def run_pr_checks(self) -> tuple[int, dict[str, JobResult]]:
        run_id = 501
        results = self.runner.run_workflow("experiment-pr.yml", "pull_request", self.pull_request_payload(),
                                           sha=self.head_sha, ref=f"refs/pull/{PR}/merge", run_id=run_id)
        return run_id, results

    def workflow_run_payload(self, run_id: int, head_sha: str, conclusion: str) -> dict:
        payload = fixture("workflow_run")
        run = payload["workflow_run"]
        run.update(id=run_id, head_sha=head_sha, conclusion=conclusion,
                   head_repository={"full_name": REPO_NAME}, repository={"full_name": REPO_NAME})
        return payload

    def run_comment(self, run_id: int, head_sha: str, conclusion: str) -> dict[str, JobResult]:
        return self.runner.run_workflow("experiment-comment.yml", "workflow_run",
                                        self.workflow_run_payload(run_id, head_sha, conclusion), sha=self.main_sha)

    def merge(self) -> str:
        """Merge the PR branch into main (a real merge commit); the emulator records it."""
        self.repo.git("merge", "-q", "--no-ff", "-m", f"Merge pull request #{PR}", "exp/higher-lr")
        sha = self.repo.head()
        self.gh.merge(REPO_NAME, PR, merged_by="maria", merge_commit_sha=sha)
        return sha

    def push_payload(self, after: str) -> dict:
        owner, short = REPO_NAME.split("/")
        return {"ref": "refs/heads/main", "before": self.main_sha, "after": after, "created": False,
                "deleted": False, "forced": False, "pusher": {"name": "maria"}, "sender": {"login": "maria"},
                "head_commit": {"id": after}, "commits": [{"id": after}],
                "repository": {"full_name": REPO_NAME, "name": short, "owner": {"login": owner},
                               "default_branch": "main"}}

    def sticky(self) -> list[dict]:
        marker = f"<!-- gitops-train:experiment={self.experiment} -->"
        return [c for c in self.gh.comments(REPO_NAME, PR) if marker in c["body"]]


@pytest.fixture
def flow(tmp_path: Path):
    with GitHubEmulator() as gh:
        yield Flow(tmp_path, gh)


@pytest.fixture
def tiny_flow(tmp_path: Path):
    with GitHubEmulator() as gh:
        yield Flow(tmp_path, gh, tiny=True)


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_pr_checks_then_one_sticky_comment(flow: Flow) -> None:
    run_id, pr_results = flow.run_pr_checks()
    check = pr_results["check"]
    bundle_step = next(s for s in check.steps if s.name == "Upload the result bundle")
    assert bundle_step.outcome == "success", explain(pr_results)
    assert check.result == "success", explain(pr_results)
    # The untrusted PR title (shell syntax in the fixture) never reached a shell.
    assert not Path("/tmp/pwned").exists()
    bundle = flow.runner.artifacts[(run_id, "experiment-bundle")]
    assert (bundle / "pr-number").read_text().strip() == str(PR)
    assert (bundle / "head-sha").read_text().strip() == flow.head_sha
    assert (bundle / "experiments").read_text().split() == [EXPERIMENT]
    files = {p.relative_to(bundle / EXPERIMENT).as_posix() for p in (bundle / EXPERIMENT).rglob("*") if p.is_file()}
    assert {"comment.md", "plan.json", "plan.txt", "smoke.json", "stages.json", "smoke-loss.png"} <= files, files
    assert any(f.startswith("data-check/") and f.endswith(".json") for f in files), files

    comment_results = flow.run_comment(run_id, flow.head_sha, check.result)
    assert comment_results["comment"].result == "success", explain(comment_results)
    (comment,) = flow.sticky()
    assert f"Experiment `{EXPERIMENT}`" in comment["body"]
    assert "Awaiting `/train`" in comment["body"]

    # A second delivery of the same run edits the same comment: still exactly one.
    again = flow.run_comment(run_id, flow.head_sha, check.result)
    assert again["comment"].result == "success", explain(again)
    assert len(flow.sticky()) == 1


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_bundle_for_a_superseded_head_is_refused(flow: Flow) -> None:
    run_id, pr_results = flow.run_pr_checks()
    assert pr_results["check"].steps[-1].outcome == "success", explain(pr_results)
    # The author pushed again after the run: the API's head no longer matches the bundle.
    flow.gh.push(REPO_NAME, PR, "b" * 40)
    results = flow.run_comment(run_id, flow.head_sha, "success")
    job = results["verify"]
    assert job.result == "failure"
    verify = next(s for s in job.steps if s.name == "Verify the bundle against the API")
    assert verify.outcome == "failure" and "stale or foreign bundle" in verify.log
    assert results["comment"].result == "skipped"
    assert flow.sticky() == []


@pytest.mark.e2e
@pytest.mark.timeout(1500)
def test_train_on_cpu_then_promote_on_merge(tiny_flow: Flow) -> None:
    flow = tiny_flow
    # /train binds to the head SHA that the PR checks validated (recorded in the sticky comment).
    run_id, pr_results = flow.run_pr_checks()
    assert pr_results["check"].result == "success", explain(pr_results)
    commented = flow.run_comment(run_id, flow.head_sha, "success")
    assert commented["comment"].result == "success", explain(commented)

    comment = fixture("issue_comment")
    comment["issue"]["number"] = PR
    comment["comment"]["body"] = f"/train {flow.experiment}"
    # The training job's token has expired by the time training ends (GITHUB_TOKEN lives at
    # most 24 h): progress is best effort, and the report job posts with its own token.
    flow.runner.job_tokens["train"] = flow.gh.issue_token(ttl=0)
    train_run_id = 777
    flow.gh.add_workflow_run(REPO_NAME, train_run_id, path=".github/workflows/experiment-train.yml",
                             event="issue_comment")
    results = flow.runner.run_workflow("experiment-train.yml", "issue_comment", comment, sha=flow.main_sha,
                                       run_id=train_run_id)
    authorize, train, report = results["authorize"], results["train"], results["report"]
    assert authorize.result == "success", explain(results)
    assert authorize.outputs["launch"] == "true", explain(results)
    assert authorize.outputs["sha"] == flow.head_sha
    assert train.result == "success", explain(results)
    assert report.result == "success", explain(results)
    # The GPU job ran exactly the approved commit.
    assert flow.repo.git("rev-parse", "HEAD", cwd=train.workspace) == flow.head_sha
    (sticky,) = flow.sticky()
    assert any(word in sticky["body"].lower() for word in ("supported", "refuted", "inconclusive")), sticky["body"]

    # Reviewed on the final head by a writer other than the author, who also accepts the
    # single-seed (inconclusive) verdict with the override label; then merged: the push to
    # main promotes (the merged PR is found through GET /commits/{sha}/pulls).
    flow.gh.add_review(REPO_NAME, PR, user="rex", state="APPROVED", commit_id=flow.head_sha)
    flow.gh.add_label(REPO_NAME, PR, "promote-override", actor="rex")
    merge_sha = flow.merge()
    promoted = flow.runner.run_workflow("experiment-promote.yml", "push", flow.push_payload(merge_sha),
                                        sha=merge_sha, ref="refs/heads/main")
    assert promoted["promote"].result == "success", explain(promoted)
    (sticky,) = flow.sticky()
    assert "Promoted" in sticky["body"] and "champion" in sticky["body"], explain(promoted) + sticky["body"]


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_train_says_so_when_the_gpu_pool_is_short(flow: Flow) -> None:
    run_id, pr_results = flow.run_pr_checks()
    assert pr_results["check"].result == "success", explain(pr_results)
    assert flow.run_comment(run_id, flow.head_sha, "success")["comment"].result == "success"
    flow.gh.add_runner(REPO_NAME, name="gpu-node-1", labels=["gpu", "cpu"], status="online", busy=True)
    flow.runner.secrets["RUNNERS_READ_TOKEN"] = flow.gh.token
    comment = fixture("issue_comment")
    comment["issue"]["number"] = PR
    # The GPU job itself is not run here: this is the moment it would sit in the queue.
    results = flow.runner.run_workflow("experiment-train.yml", "issue_comment", comment, sha=flow.main_sha,
                                       only={"authorize", "capacity"})
    assert results["capacity"].result == "success", explain(results)
    (sticky,) = flow.sticky()
    assert "waiting for 1 runner" in sticky["body"] and "busy" in sticky["body"], sticky["body"]


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_train_from_a_reader_launches_nothing(flow: Flow) -> None:
    flow.gh.set_permission(REPO_NAME, "mallory", "read")
    comment = fixture("issue_comment")
    comment["issue"]["number"] = PR
    comment["comment"].update(body="/train", user={"login": "mallory", "type": "User"},
                              author_association="OWNER")  # the payload lies; the API decides
    comment["sender"] = {"login": "mallory", "type": "User"}
    results = flow.runner.run_workflow("experiment-train.yml", "issue_comment", comment, sha=flow.main_sha)
    assert results["authorize"].result == "success", explain(results)
    assert results["authorize"].outputs.get("launch") == "false", explain(results)
    assert results["authorize"].outputs.get("action") == "refuse", explain(results)
    assert "write access" in results["authorize"].outputs["reason"]
    assert results["train"].result == "skipped"


@pytest.mark.integration
def test_plain_comments_do_not_even_start_the_authorize_job(tmp_path: Path) -> None:
    with GitHubEmulator() as gh:
        flow = Flow(tmp_path, gh)
        comment = fixture("issue_comment")
        comment["issue"]["number"] = PR
        comment["comment"]["body"] = "Looks good, thanks!"
        results = flow.runner.run_workflow("experiment-train.yml", "issue_comment", comment, sha=flow.main_sha)
    assert results["authorize"].result == "skipped"
    assert results["train"].result == "skipped"


@pytest.mark.integration
def test_comments_that_only_mention_commands_install_nothing(tmp_path: Path) -> None:
    with GitHubEmulator() as gh:
        flow = Flow(tmp_path, gh)
        comment = fixture("issue_comment")
        comment["issue"]["number"] = PR
        comment["comment"]["body"] = "see trainer/train.py\n/trainer is a folder\nhttps://ci.invalid/runs/1/retry"
        results = flow.runner.run_workflow("experiment-train.yml", "issue_comment", comment, sha=flow.main_sha)
    authorize = results["authorize"]
    assert authorize.result == "success"
    by_name = {s.name: s.outcome for s in authorize.steps}
    assert by_name["Install the pipeline"] == "skipped", explain(results)
    assert authorize.outputs.get("launch") in ("", None) and results["train"].result == "skipped"


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_cancel_from_a_writer_runs_the_cancel_job_and_launches_nothing(flow: Flow) -> None:
    comment = fixture("issue_comment")
    comment["issue"]["number"] = PR
    comment["comment"]["body"] = "/cancel"
    results = flow.runner.run_workflow("experiment-train.yml", "issue_comment", comment, sha=flow.main_sha,
                                       only={"authorize", "cancel", "train"})
    assert results["authorize"].outputs.get("action") == "cancel", explain(results)
    assert results["authorize"].outputs.get("launch") == "false", explain(results)
    assert results["cancel"].result == "success", explain(results)
    assert results["train"].result == "skipped", explain(results)
