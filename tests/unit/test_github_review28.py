"""The other findings of the review in issue 28, each reproduced without a server (every test
here failed on the code before the fix): artifact locations the attestor's credential would be
sent to, an override label given for another commit, names from MLflow echoed into logs,
images that slipped past a regex, `/cancel` through public concurrency groups, the head
commit taken from a 250-commit list, and a PR author approving their own launch. The
registry's ownership checks run against a real basic-auth server in
tests/integration/test_github_provenance.py, the locks in tests/unit/test_workflows_policy.py.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# PyGithub's import (about 1 s) at collection, not inside the one test that needs it.
import github  # noqa: F401
import pytest

from pipelines.github.client import (
    Comment,
    GitHubConfig,
    LabelEvent,
    PullRequestInfo,
    PyGithubHost,
    Review,
    WorkflowRunInfo,
)
from pipelines.trusted.promote import TrainingRecord, promote_pull
from pipelines.trusted.provenance import AttestationRefused, check_training_run
from tests.infra.github_emulator import REPO, SHA_A

EXP = "rope-theta"
RUN_ID = "a" * 32


# --------------------------------------------------------------------------- MEDIUM: artifact locations


class FakeMlflow:
    """The calls `attest` makes; every artifact request is recorded."""

    def __init__(self, artifact_uri: str):
        self.artifact_uri = artifact_uri
        self.artifact_calls: list[str] = []

    def get_run(self, rid: str) -> Any:
        tags = {"pipeline.git_sha": SHA_A, "pipeline.dirty": "false", "pipeline.github_run_id": "501"}
        return SimpleNamespace(info=SimpleNamespace(experiment_id="1", artifact_uri=self.artifact_uri,
                                                    status="FINISHED", run_id=rid),
                               data=SimpleNamespace(tags=tags))

    def get_experiment(self, exp_id: str) -> Any:
        return SimpleNamespace(name=f"{EXP}/job-501-1", experiment_id=exp_id)  # the launch's job experiment

    def get_experiment_by_name(self, name: str) -> Any:
        return SimpleNamespace(name=name, experiment_id="9")

    def create_run(self, exp_id: str, **kw: Any) -> Any:
        return SimpleNamespace(info=SimpleNamespace(run_id="b" * 32, artifact_uri="mlflow-artifacts:/9/b/artifacts"))

    def set_terminated(self, *a: Any) -> None:
        pass

    def list_artifacts(self, rid: str, path: str) -> list[str]:
        self.artifact_calls.append(f"list {rid}")
        return ["model/weights"]

    def download_artifacts(self, rid: str, path: str, dst: str) -> str:
        self.artifact_calls.append(f"download {rid}")
        return dst

    def log_artifacts(self, *a: Any) -> None:
        self.artifact_calls.append("log")


@pytest.mark.parametrize("location", ["https://collector.example/steal", "mlflow-artifacts://collector.example/x",
                                      "s3://someone-elses-bucket/x"])
def test_attest_refuses_an_artifact_location_outside_the_server_before_any_download(
        monkeypatch: pytest.MonkeyPatch, location: str) -> None:
    from pipelines.trusted import provenance

    fake = FakeMlflow(location)
    monkeypatch.setattr(provenance, "_client", lambda uri: fake)
    with pytest.raises(AttestationRefused, match="artifact location"):
        provenance.attest(tracking_uri="https://mlflow.internal", pr=7, sha=SHA_A, experiment=EXP,
                          workflow_run_id=501, result={"candidate_runs": [{"mlflow_run_id": RUN_ID}]})
    assert fake.artifact_calls == []  # the attestor's credential never went there
    # The server's own proxy location is read as before.
    fake = FakeMlflow("mlflow-artifacts:/1/" + RUN_ID + "/artifacts")
    monkeypatch.setattr(provenance, "_client", lambda uri: fake)
    provenance.attest(tracking_uri="https://mlflow.internal", pr=7, sha=SHA_A, experiment=EXP, workflow_run_id=501,
                      result={"candidate_runs": [{"mlflow_run_id": RUN_ID}]})
    assert fake.artifact_calls[:2] == [f"list {RUN_ID}", f"download {RUN_ID}"]


def test_artifact_locations_allowed_per_store() -> None:
    from pipelines.trusted.provenance import artifact_location_problem

    server = "https://mlflow.internal"
    assert artifact_location_problem("mlflow-artifacts:/1/r/artifacts", server) is None
    assert artifact_location_problem("mlflow-artifacts://mlflow.internal/1/r/artifacts", server) is None
    assert artifact_location_problem("file:///srv/mlruns/1/r/artifacts", server)  # the server's disk is not ours
    laptop = "sqlite:///tmp/mlflow.db"
    assert artifact_location_problem("file:///home/me/mlruns/1/r/artifacts", laptop) is None
    assert artifact_location_problem("/home/me/mlruns/1/r/artifacts", laptop) is None
    assert artifact_location_problem("http://collector.example/x", laptop)


# --------------------------------------------------------------------------- LOW: names from MLflow


HOSTILE = "exp\n::error::forged\n## Attested `x` @acme/ml <img src=x> [a](http://y)"


def test_names_from_mlflow_are_escaped_in_reasons() -> None:
    (problem,) = check_training_run(run_id="r", experiment_name=HOSTILE, tags={"pipeline.git_sha": SHA_A,
                                    "pipeline.github_run_id": "1"}, experiment=EXP, sha=SHA_A, workflow_run_id=1)
    assert "\n" not in problem and "::" not in problem and "@" not in problem and "<" not in problem
    assert "`x`" not in problem and "](" not in problem
    from pipelines.trusted.provenance import shown

    assert shown("rope-theta v2.1_x") == "rope-theta v2.1_x"


def test_pipeline_attest_writes_one_inert_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pipelines import cli
    from pipelines.trusted import provenance

    def refuse(**kw: Any) -> None:
        raise AttestationRefused(f"run r is in MLflow experiment `{HOSTILE}`")

    monkeypatch.setattr(provenance, "attest", refuse)
    (tmp_path / "result.json").write_text("{}")
    summary = tmp_path / "summary.md"
    result = CliRunner().invoke(cli.app, ["attest", "--result-file", str(tmp_path / "result.json"), "--pr", "7",
                                          "--sha", SHA_A, "--experiment", EXP, "--workflow-run-id", "501"],
                                env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert result.exit_code == 10
    written = summary.read_text()
    assert written.count("\n") == 1 and "::error" not in written and "`x`" not in written
    assert not any(line.startswith("::") or line.startswith("#") for line in result.output.splitlines())


# --------------------------------------------------------------------------- LOW: override bound to the head


class FakeHost:
    """What `promote_pull` asks of GitHub, in memory."""

    def __init__(self, events: list[LabelEvent], run_created: str):
        self.events = events
        self.run_created = run_created
        self.comments: list[Comment] = []

    def pull_request(self, number: int) -> PullRequestInfo:
        return PullRequestInfo(number=number, title="t", author="dana", head_sha=SHA_A, head_ref="exp",
                               head_repo=REPO, base_repo=REPO, state="closed", merged=True,
                               labels=("promote-override",), files=(f"experiments/{EXP}.yaml",))

    def reviews(self, number: int) -> list[Review]:
        return [Review("erin", "APPROVED", SHA_A, "2026-12-01T12:00:00Z", 1)]

    def label_events(self, number: int) -> list[LabelEvent]:
        return self.events

    def permission(self, login: str) -> str:
        return "write"

    def head_pushers(self, number: int) -> tuple[str, ...]:
        return ("dana",)

    def workflow_run(self, run_id: int) -> WorkflowRunInfo:
        return WorkflowRunInfo(run_id, ".github/workflows/experiment-train.yml", "issue_comment", "success", "main",
                               created_at=self.run_created)

    def list_comments(self, number: int) -> list[Comment]:
        return self.comments

    def create_comment(self, number: int, body: str) -> Comment:
        self.comments.append(Comment(len(self.comments) + 1, body, "bot"))
        return self.comments[-1]

    def edit_comment(self, cid: int, body: str) -> Comment:
        self.comments[cid - 1] = Comment(cid, body, "bot")
        return self.comments[cid - 1]

    def delete_comment(self, cid: int) -> None:
        raise AssertionError("no duplicates here")


class Refuted:
    def training_record(self, experiment: str, sha: str, accept: Any = None) -> TrainingRecord:
        return TrainingRecord(experiment=experiment, mlflow_run_id="r", code_version=sha, status="FINISHED",
                              dirty=False, verdict="refuted", gates_passed=None, model_source="m", pr=7,
                              workflow_run_id=501, attestation_run_id="att")


class Registry:
    def __init__(self) -> None:
        self.promoted: list[str] = []

    def promote(self, record: TrainingRecord, tags: Any) -> Any:
        self.promoted.append(record.mlflow_run_id)
        return SimpleNamespace(version="1", previous=None, changed=True)


@pytest.mark.parametrize(("label_at", "pushed_at", "counts"), [
    ("2026-12-01T10:00:00Z", None, False),  # given before this commit's training started (another verdict)
    ("2026-12-01T11:30:00Z", "2026-12-01T11:45:00Z", False),  # the head was force-pushed after it
    ("2026-12-01T11:30:00+00:00", None, True),  # given after the attested training of this head started
])
def test_the_override_counts_only_when_given_after_the_heads_training(label_at: str, pushed_at: str | None,
                                                                      counts: bool) -> None:
    events = [LabelEvent("promote-override", "erin", label_at, 1)]
    if pushed_at:
        events.append(LabelEvent("", "dana", pushed_at, 2, event="head_ref_force_pushed"))
    host, registry = FakeHost(events, run_created="2026-12-01T11:00:00Z"), Registry()
    (outcome,) = promote_pull(7, host, Refuted(), registry, model_name="m", bot_login="bot", sleep=lambda s: None)
    assert bool(registry.promoted) is counts, outcome.gate.reasons
    if not counts:
        assert any("apply it again" in r for r in outcome.gate.reasons)


# --------------------------------------------------------------------------- LOW: images on the rendered HTML


def _outside_images(text: str) -> list[str]:
    """What GitHub's engine (cmark-gfm, raw HTML kept) would show as an outside image."""
    import cmarkgfm
    from cmarkgfm.cmark import Options

    html = cmarkgfm.github_flavored_markdown_to_html(text, options=Options.CMARK_OPT_UNSAFE)
    return re.findall(r"""<(?:img|source)\b[^>]*?\b(?:src|srcset)=["']?((?:[a-z]+:)?//[^"'\s>]+)""", html, re.I)


@pytest.mark.parametrize("text", [
    "![loss](https://tracker.example/p.png 'title')",
    "![loss](https://tracker.example/p.png (title))",
    "![loss [nested] alt](https://tracker.example/p.png)",
    "![loss][r]\n\n[r]:\n  https://tracker.example/p.png",
    "[![badge](https://tracker.example/b.svg 'b')](https://ci.example)",
    '<IMG SRC="//tracker.example/x.gif">',
    '<picture><source srcset="https://tracker.example/a.png 1x"><img src="ok.png"></picture>',
    "![a](<https://tracker.example/p p.png>)",
])
def test_no_outside_image_survives_in_any_spelling(text: str) -> None:
    from pipelines.github.comment import neutralize_untrusted

    assert _outside_images(text), "the sample must be an outside image as GitHub renders it"
    out = neutralize_untrusted(f"Report\n\n{text}\n\n![plot](smoke-loss.png) `![code](https://x.example/c.png 't')`")
    assert _outside_images(out) == []
    assert "![plot](smoke-loss.png)" in out and "`![code](https://x.example/c.png 't')`" in out


# --------------------------------------------------------------------------- LOW: /cancel through the API


class CancelHost:
    def __init__(self) -> None:
        from pipelines.github.client import RunJob

        self.cancelled: list[int] = []
        self.runs = {
            11: (WorkflowRunInfo(11, ".github/workflows/experiment-train.yml", "issue_comment", None, "main",
                                 status="in_progress"), [RunJob("train #7 rope-theta", "in_progress"),
                                                         RunJob("train #7 other-exp", "in_progress")]),
            12: (WorkflowRunInfo(12, ".github/workflows/experiment-train.yml", "pull_request", None, "attack",
                                 status="in_progress"), [RunJob("train #7 rope-theta", "in_progress")]),
            13: (WorkflowRunInfo(13, ".github/workflows/experiment-train.yml", "issue_comment", None, "main",
                                 status="queued"), [RunJob("train #8 rope-theta", "queued")]),
            14: (WorkflowRunInfo(14, ".github/workflows/experiment-train.yml", "workflow_dispatch", None, "main",
                                 status="waiting"), [RunJob("train #7 rope-theta", "completed")]),
        }

    def unfinished_runs(self, workflow_file: str) -> list[WorkflowRunInfo]:
        return [run for run, _ in self.runs.values()]

    def run_jobs(self, run_id: int) -> list[Any]:
        return self.runs[run_id][1]

    def cancel_run(self, run_id: int) -> bool:
        self.cancelled.append(run_id)
        return True


def test_cancel_stops_only_the_trusted_run_training_that_pr_and_experiment() -> None:
    from pipelines.github.cancel import cancel_trainings

    host = CancelHost()
    done = cancel_trainings(host, pr=7, experiments=["rope-theta"], default_branch="main", skip_run=99)
    assert host.cancelled == [11] and done[0].experiments == ("other-exp", "rope-theta")
    assert cancel_trainings(CancelHost(), pr=7, experiments=["nothing-here"], default_branch="main") == []


# --------------------------------------------------------------------------- LOW: the head from the PR object


def test_head_pushers_read_the_head_commit_not_the_last_of_250(monkeypatch: pytest.MonkeyPatch) -> None:
    def user(login: str) -> Any:
        return SimpleNamespace(login=login)

    listed = [SimpleNamespace(sha=f"{i:040x}", author=user("erin"), committer=user("erin")) for i in range(250)]
    head = SimpleNamespace(sha=SHA_A, author=user("dana"), committer=user("mallory"))
    pull = SimpleNamespace(head=SimpleNamespace(sha=SHA_A), get_commits=lambda: listed)
    repo = SimpleNamespace(get_pull=lambda n: pull, get_commit=lambda sha: head if sha == SHA_A else None)
    host = PyGithubHost(GitHubConfig(token="t", repo=REPO), client=SimpleNamespace())
    host._repo = repo
    monkeypatch.setattr(host, "_issue_lazy", lambda n: SimpleNamespace(get_events=lambda: []))
    assert host.head_pushers(7) == ("dana", "mallory")


# --------------------------------------------------------------------------- LOW: the author approving their launch


def _launch_approval() -> Any:
    mod = sys.modules.get("launch_approval")
    if mod is None:
        script = Path(__file__).resolve().parents[2] / ".github" / "scripts" / "launch_approval.py"
        spec = importlib.util.spec_from_file_location("launch_approval", script)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules["launch_approval"] = mod
        spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("approver", "rc"), [("dana", 1), ("Dana", 1), ("erin", 0)])
def test_the_pr_author_cannot_approve_their_own_launch(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str], approver: str,
                                                       rc: int) -> None:
    gate = _launch_approval()
    answers = {
        f"https://api.example/repos/{REPO}/pulls/7": {"user": {"login": "dana"}},
        f"https://api.example/repos/{REPO}/actions/runs/501/approvals": [
            {"state": "approved", "environments": [{"name": "gpu-training"}], "user": {"login": approver}}],
    }
    for key, value in {"GITHUB_API_URL": "https://api.example", "GITHUB_REPOSITORY": REPO, "GITHUB_RUN_ID": "501",
                       "PR_NUMBER": "7", "GITHUB_TOKEN": "t"}.items():
        monkeypatch.setenv(key, value)
    assert gate.main(get=lambda url, token: answers[url]) == rc
    out = capsys.readouterr().out
    assert ("::error::not training" in out) is (rc == 1)
