"""The project's error hierarchy and exit codes: one registry (like httpx's `_exceptions.py`).

Every `PipelineError` subclass is declared here, and every exit code a pipeline or trainer
process ends with on purpose is a row of `EXIT_CODES`: one meaning per code, and whether
a launcher retries a training process that ended with it (`pipelines.launchers.retry`
reads `no_retry_exit_codes()` instead of keeping its own numbers).

Adapters map library exceptions onto these (`raise GitHubError(...) from exc`); the CLI
prints `str(error)` as one clear line and exits with `error.exit_code`
(`pipelines.exits.fail`), never a traceback, for anything that is the user's input's
fault. Invariants are `assert`s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ExitCode:
    """One exit status with one meaning."""

    code: int
    name: str
    meaning: str
    retry: bool
    """Whether a launcher relaunches a training process that exited with this code."""


EXIT_CODES: tuple[ExitCode, ...] = (
    ExitCode(0, "ok", "finished (or `--detach`: submitted and still running)", retry=False),
    ExitCode(1, "error", "an unexpected failure (a crash)", retry=True),
    ExitCode(2, "input", "usage or spec error: fix the command line or the experiment file", retry=False),
    ExitCode(3, "data", "data sources missing or unreadable, or a cache that does not verify", retry=False),
    ExitCode(4, "data-check", "the distribution checks failed", retry=False),
    ExitCode(5, "training", "training failed or stopped (result.json says why)", retry=True),
    ExitCode(6, "launch", "a launcher could not start, follow or cancel a job", retry=True),
    ExitCode(7, "tracking", "MLflow could not be reached or answered with an error", retry=True),
    ExitCode(8, "github", "the GitHub API failed after retries, or refused the request", retry=True),
    ExitCode(9, "permission", "a user without write access asked for something gated", retry=False),
    ExitCode(10, "promotion-refused", "a merge did not pass the promotion gates", retry=False),
    ExitCode(11, "doctor-refused", "the startup checklist refused the machine", retry=False),
    ExitCode(12, "disk-space", "disk full: not enough free disk to start, or a checkpoint/export write ran out of space",
             retry=False),
    ExitCode(13, "artifact", "a stage reported success but its artifact is missing or broken", retry=True),
    ExitCode(14, "startup", "training failed before its first step (model build, TP plan, vocab, an import error "
             "in a model file): a relaunch would fail the same way; result.json and the console give the first "
             "error line", retry=False),
)
_BY_CODE = {e.code: e for e in EXIT_CODES}
assert len(_BY_CODE) == len(EXIT_CODES), "an exit code has two meanings"


def exit_code(name: str) -> int:
    """The code registered under `name` (a typo is an import-time error, not a silent 1)."""
    return next(e.code for e in EXIT_CODES if e.name == name)


def no_retry_exit_codes() -> dict[int, str]:
    """Exit codes after which a training process is not relaunched, with why."""
    return {e.code: e.meaning for e in EXIT_CODES if not e.retry and e.code != 0}


class PipelineError(Exception):
    """Base of every error a user can cause or fix. `str()` is the one line shown."""

    exit_code: int = exit_code("error")


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

    exit_code = exit_code("input")

    def __init__(self, issues: list[Issue]):
        assert issues, "SpecError needs at least one issue"
        self.issues = issues
        super().__init__("\n".join(i.text() for i in issues))


class UsageError(PipelineError):
    """A command was called wrongly (bad option, missing file)."""

    exit_code = exit_code("input")


class DataError(PipelineError):
    """Data sources missing, unreadable, binary, empty, or a cache that does not verify."""

    exit_code = exit_code("data")


class DataCheckFailed(PipelineError):
    """The distribution checks ran and at least one expectation failed."""

    exit_code = exit_code("data-check")


class TrainingError(PipelineError):
    """Training failed (crash, divergence stop, out of memory below the floor)."""

    exit_code = exit_code("training")


class StartupFailed(TrainingError):
    """Training failed before its first step (result.json `startup_failure`): a relaunch or a
    rerun fails the same way, so the exit code is the trainer's own 14, never retried."""

    exit_code = exit_code("startup")


class DryRunFailed(TrainingError):
    """The dry run at full size (trainer/dry_run.py) failed: a shape that does not split, an op
    that cannot run on fake tensors, a peak over the device or far from the analytic plan."""


class LaunchError(PipelineError):
    """A launcher could not start, follow or cancel a job."""

    exit_code = exit_code("launch")


class TrackingError(PipelineError):
    """MLflow could not be reached or answered with an error."""

    exit_code = exit_code("tracking")


class GitHubError(PipelineError):
    """The GitHub API failed after retries, or refused the request."""

    exit_code = exit_code("github")


class PermissionDenied(GitHubError):
    """A user without write access asked for something gated."""

    exit_code = exit_code("permission")


class PromotionRefused(PipelineError):
    """A merge did not pass the promotion gates; the message says which."""

    exit_code = exit_code("promotion-refused")


class DoctorFailed(LaunchError):
    """The startup checklist found errors on a machine; nothing was launched."""

    exit_code = exit_code("doctor-refused")

    def __init__(self, report: _Report):
        self.report = report
        errors = "; ".join(f"{c.section}/{c.name}: {c.message}" for c in report.errors)
        super().__init__(f"doctor refused the launch on {report.host}: {errors}")


class RunDirBusy(LaunchError):
    """Another live job holds a rank lock of this run directory."""


class DiskSpaceError(PipelineError):
    """Not enough free disk to start work that writes a lot."""

    exit_code = exit_code("disk-space")


class ArtifactError(PipelineError):
    """A stage reported success but its artifact is missing, empty or unparsable."""

    exit_code = exit_code("artifact")


class TransientGitHubError(GitHubError):
    """A failure worth retrying at the application level (5xx, timeout, rate limit).

    `retry_after` is the seconds GitHub asked us to wait (rate-limit reset), if it said.
    """

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class Detached(PipelineError):
    """`--detach`: trainings were submitted and keep running without this process (not a failure)."""

    exit_code = exit_code("ok")


class _Check(Protocol):
    # Read-only (properties): `pipelines.doctor.Check` is a frozen dataclass.
    @property
    def section(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def message(self) -> str: ...


class _Report(Protocol):
    """What `DoctorFailed` reads from `pipelines.doctor.DoctorReport`."""

    host: str

    @property
    def errors(self) -> Sequence[_Check]: ...
