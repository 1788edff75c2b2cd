"""The emulated runner's expression evaluator behaves like GitHub's where the workflows rely on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.infra.workflow_runner import EmulatedRepository, WorkflowRunner, _read_env_file

CTX = {
    "github": {"event_name": "issue_comment", "repository": "acme/lab",
               "event": {"comment": {"body": "LGTM\n/train higher-lr"}, "issue": {"pull_request": {"url": "x"}},
                         "pull_request": None}},
    "needs": {"authorize": {"outputs": {"launch": "true", "experiments": '["a", "b"]', "pr": "7"}}},
    "steps": {"changed": {"outputs": {"count": "0"}, "outcome": "success"}},
    "inputs": {}, "env": {}, "vars": {}, "secrets": {}, "runner": {"temp": "/tmp"},
}


@pytest.fixture(scope="module")
def runner() -> WorkflowRunner:
    return WorkflowRunner(EmulatedRepository(Path("/nonexistent"), "acme/lab"), Path("/nonexistent"), "http://x", "t")


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("github.event_name == 'ISSUE_COMMENT'", True),  # string comparison ignores case
        ("contains(github.event.comment.body, '/train') && github.event.issue.pull_request != null", True),
        ("startsWith(github.event.comment.body, '/train')", False),
        ("needs.authorize.outputs.launch == 'true' && (github.event_name != 'pull_request' || false)", True),
        ("fromJSON(needs.authorize.outputs.experiments)", ["a", "b"]),
        ("steps.changed.outputs.count != '0'", False),
        ("github.event.pull_request.head.repo.full_name == github.repository", False),
        ("github.event.nothing.here || 'fallback'", "fallback"),
        ("!steps.missing.outputs.x", True),
    ],
)
def test_expressions(runner: WorkflowRunner, expression: str, expected: object) -> None:
    assert runner.evaluate(expression, CTX) == expected


def test_if_without_a_status_function_needs_success(runner: WorkflowRunner) -> None:
    failed, ok = {"failed": True}, {"failed": False}
    assert runner._condition("steps.changed.outcome == 'success'", CTX, ok)
    assert not runner._condition("steps.changed.outcome == 'success'", CTX, failed)
    assert runner._condition("always() && steps.changed.outcome == 'success'", CTX, failed)
    assert runner._condition("failure()", CTX, failed) and not runner._condition("failure()", CTX, ok)


def test_output_files_with_heredoc_values(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.write_text("a=1\nbody<<EOF\nline 1\nline=2\nEOF\nb=x=y\n")
    assert _read_env_file(out) == {"a": "1", "body": "line 1\nline=2", "b": "x=y"}
