"""`pipeline comment | chatops | promote` end to end in-process: env as GitHub Actions sets
it, the emulator as the API, outputs to $GITHUB_OUTPUT, one line per error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.infra.github_emulator import REPO, SHA_A, GitHubEmulator, emulated_repo

FIXTURES = Path(__file__).parents[1] / "fixtures" / "github"
MARKER = "<!-- gitops-train:experiment=rope-theta -->"


@pytest.fixture
def gh() -> Iterator[GitHubEmulator]:
    with GitHubEmulator() as emulator:
        yield emulator


def env_for(gh: GitHubEmulator, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"GITHUB_TOKEN": gh.token, "GITHUB_API_URL": gh.base_url, "GITHUB_REPOSITORY": REPO,
            "GITHUB_OUTPUT": str(tmp_path / "output"), "PIPELINE_GITHUB_SECONDS_BETWEEN_REQUESTS": "0",
            "PIPELINE_GITHUB_SECONDS_BETWEEN_WRITES": "0", "GITHUB_EVENT_NAME": "", **extra}


def invoke(args: list[str], env: dict[str, str]):  # noqa: ANN201 - click's Result
    from pipelines.cli import app

    return CliRunner().invoke(app, args, env=env)


def test_comment_then_train_comment_launches(gh: GitHubEmulator, tmp_path: Path) -> None:
    n = emulated_repo(gh)
    env = env_for(gh, tmp_path)
    body = tmp_path / "report.md"
    body.write_text("## `rope-theta`: validated\n")
    first = invoke(["comment", "--pr", str(n), "--experiment", "rope-theta", "--body-file", str(body),
                    "--validated-sha", SHA_A], env)
    assert first.exit_code == 0, first.output
    second = invoke(["comment", "--pr", str(n), "--experiment", "rope-theta", "--stage", "training"], env)
    assert second.exit_code == 0, second.output
    (sticky,) = gh.comments(REPO, n)
    assert sticky["body"].startswith(MARKER) and "Training" in sticky["body"]

    event = json.loads((FIXTURES / "issue_comment.created.pr.json").read_text())
    event["issue"]["number"] = n
    event["comment"]["body"] = "/train rope-theta"
    path = tmp_path / "event.json"
    path.write_text(json.dumps(event))
    decided = invoke(["chatops", "--event-path", str(path)], env)
    assert decided.exit_code == 0, decided.output
    outputs = dict(line.split("=", 1) for line in (tmp_path / "output").read_text().splitlines())
    assert outputs["launch"] == "true" and outputs["sha"] == SHA_A and outputs["pr"] == str(n)


def test_comment_without_a_token_is_a_dry_run(tmp_path: Path) -> None:
    body = tmp_path / "b.md"
    body.write_text("hello")
    env = {"GITHUB_TOKEN": "", "GITHUB_REPOSITORY": ""}
    out = tmp_path / "comments"
    for _ in range(2):
        result = invoke(["comment", "--pr", "3", "--experiment", "rope-theta", "--body-file", str(body),
                         "--out-dir", str(out)], env)
        assert result.exit_code == 0 and "dry run" in result.output
    (written,) = out.glob("pr-3-comment-*.md")
    assert written.read_text().startswith(MARKER) and written.read_text().endswith("hello")


def test_user_mistakes_are_one_line(gh: GitHubEmulator, tmp_path: Path) -> None:
    env = env_for(gh, tmp_path)
    bad_name = invoke(["comment", "--pr", "1", "--experiment", "Bad Name", "--body-file", __file__], env)
    assert bad_name.exit_code == 2 and bad_name.output.count("\n") == 1 and "Traceback" not in bad_name.output
    missing = invoke(["chatops", "--event-path", str(tmp_path / "nope.json")], env)
    assert missing.exit_code == 2 and "no such event file" in missing.output
    emulated_repo(gh)
    gone = invoke(["comment", "--pr", "99", "--experiment", "rope-theta", "--body-file", __file__], env)
    assert gone.exit_code == 8 and "not found (404)" in gone.output


def test_promote_on_an_unmerged_close_does_nothing(gh: GitHubEmulator, tmp_path: Path) -> None:
    result = invoke(["promote", "--event-path", str(FIXTURES / "pull_request.closed.unmerged.json")],
                    env_for(gh, tmp_path))
    assert result.exit_code == 0 and "not a merged pull request" in result.output
    assert gh.requests_made() == []


def test_promote_refusal_is_explained_and_strict_exits_10(gh: GitHubEmulator, tmp_path: Path) -> None:
    n = emulated_repo(gh)
    gh.merge(REPO, n, merged_by="mia")
    event = json.loads((FIXTURES / "pull_request.closed.merged.json").read_text())
    event["number"] = event["pull_request"]["number"] = n
    path = tmp_path / "merged.json"
    path.write_text(json.dumps(event))
    env = env_for(gh, tmp_path, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    relaxed = invoke(["promote", "--event-path", str(path)], env)
    assert relaxed.exit_code == 0 and "refused rope-theta" in relaxed.output
    strict = invoke(["promote", "--event-path", str(path), "--strict"], env)
    assert strict.exit_code == 10
    (sticky,) = gh.comments(REPO, n)
    assert "Not promoted" in sticky["body"] and "no training run" in sticky["body"]
