"""The project's error hierarchy (small and documented, like httpx's `_exceptions.py`).

Adapters map library exceptions onto these (`raise GitHubError(...) from exc`); the CLI
prints `str(error)` as one clear line and exits with `error.exit_code`, never a
traceback, for anything that is the user's input's fault. Invariants are `assert`s.
"""

from __future__ import annotations

from dataclasses import dataclass


class PipelineError(Exception):
    """Base of every error a user can cause or fix. `str()` is the one line shown."""

    exit_code: int = 1


@dataclass(frozen=True)
class Issue:
    """One problem in an experiment file, located at the YAML node to change."""

    file: str
    line: int
    col: int
    field: str
    message: str

    def text(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.field}: {self.message}"

    def github(self) -> str:
        # Workflow command: shows inline on the PR diff. Properties and data need escaping.
        def esc_prop(s: str) -> str:
            return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A").replace(":", "%3A").replace(",", "%2C")

        def esc_data(s: str) -> str:
            return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

        return (
            f"::error file={esc_prop(self.file)},line={self.line},col={self.col},"
            f"title={esc_prop(self.field)}::{esc_data(self.field + ': ' + self.message)}"
        )


class SpecError(PipelineError):
    """An experiment file is invalid; carries every issue found, at once."""

    exit_code = 2

    def __init__(self, issues: list[Issue]):
        assert issues, "SpecError needs at least one issue"
        self.issues = issues
        super().__init__("\n".join(i.text() for i in issues))


class UsageError(PipelineError):
    """A command was called wrongly (bad option, missing file)."""

    exit_code = 2


class DataError(PipelineError):
    """Data sources missing, unreadable, binary, empty, or a cache that does not verify."""

    exit_code = 3


class DataCheckFailed(PipelineError):
    """The distribution checks ran and at least one expectation failed."""

    exit_code = 4


class TrainingError(PipelineError):
    """Training failed (crash, divergence stop, out of memory below the floor)."""

    exit_code = 5


class LaunchError(PipelineError):
    """A launcher could not start, follow or cancel a job."""

    exit_code = 6


class TrackingError(PipelineError):
    """MLflow could not be reached or answered with an error."""

    exit_code = 7


class GitHubError(PipelineError):
    """The GitHub API failed after retries, or refused the request."""

    exit_code = 8


class PermissionDenied(GitHubError):
    """A user without write access asked for something gated."""

    exit_code = 9


class PromotionRefused(PipelineError):
    """A merge did not pass the promotion gates; the message says which."""

    exit_code = 10
