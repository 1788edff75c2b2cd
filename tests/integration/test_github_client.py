"""The PyGithub adapter against the emulator: errors become one clear line of the
project's own types; pagination, retries and rate limits behave as documented."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from basics.errors import GitHubError, PermissionDenied
from pipelines.github.client import PyGithubHost, TransientGitHubError
from tests.infra.github_emulator import REPO, GitHubEmulator, emulated_repo, emulator_config


@pytest.fixture
def gh() -> Iterator[GitHubEmulator]:
    with GitHubEmulator() as emulator:
        yield emulator


def test_comments_are_read_across_every_page(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    for i in range(7):
        gh.add_comment(REPO, n, user="erin", body=f"comment {i}")
    from github import Auth, Github

    client = Github(base_url=gh.base_url, auth=Auth.Token(gh.token), per_page=3,
                    seconds_between_requests=0, seconds_between_writes=0)
    host = PyGithubHost(emulator_config(gh), client=client)
    assert [c.body for c in host.list_comments(n)] == [f"comment {i}" for i in range(7)]
    assert len(gh.requests_made("GET", r"/comments$")) == 3


def test_pull_request_facts_come_from_the_api(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh, files=("experiments/rope-theta.yaml", "README.md"))
    gh.push(REPO, n, "c" * 40)
    pr = PyGithubHost(emulator_config(gh)).pull_request(n)
    assert pr.head_sha == "c" * 40 and pr.author == "dana" and not pr.is_fork
    assert pr.files == ("experiments/rope-theta.yaml", "README.md")


def test_fork_is_detected_from_head_repo(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh, head_repo="mallory/lab")
    assert PyGithubHost(emulator_config(gh)).pull_request(n).is_fork


def test_permission_is_the_role_including_maintain(gh: GitHubEmulator) -> None:
    emulated_repo(gh)
    host = PyGithubHost(emulator_config(gh))
    assert [host.permission(u) for u in ("erin", "mia", "frank", "acme", "ghost")] == \
        ["write", "maintain", "read", "admin", "none"]


def test_bad_token_is_one_line_about_credentials(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    with pytest.raises(GitHubError, match=r"^read pull request #\d+: bad credentials \(401\): check GITHUB_TOKEN$"):
        PyGithubHost(emulator_config(gh, token="wrong")).pull_request(n)


def test_missing_pull_request_is_not_found(gh: GitHubEmulator) -> None:
    emulated_repo(gh)
    with pytest.raises(GitHubError, match=r"not found \(404\)"):
        PyGithubHost(emulator_config(gh)).pull_request(999)


def test_forbidden_write_is_permission_denied(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    c = gh.add_comment(REPO, n, user="erin", body="not ours")
    with pytest.raises(PermissionDenied, match=r"forbidden \(403\)"):
        PyGithubHost(emulator_config(gh)).edit_comment(c["id"], "hijack")


def test_persistent_5xx_on_reads_ends_as_retry_error_mapped(gh: GitHubEmulator) -> None:
    # urllib3 gives up with requests.exceptions.RetryError, not a GithubException.
    n = emulated_repo(gh)
    gh.inject("GET", rf"/pulls/{n}$", status=502, count=50)
    with pytest.raises(TransientGitHubError, match="kept failing"):
        PyGithubHost(emulator_config(gh, retries=2)).pull_request(n)


def test_rate_limit_on_reads_waits_for_reset_then_succeeds(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    gh.inject("GET", rf"/pulls/{n}$", status=403, rate_limit_reset=int(time.time()))
    assert PyGithubHost(emulator_config(gh)).pull_request(n).number == n
    assert [e[2] for e in gh.requests_made("GET", rf"/pulls/{n}$")] == [403, 200]


def test_rate_limit_reset_beyond_the_cap_fails_fast(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    gh.inject("GET", rf"/pulls/{n}$", status=403, rate_limit_reset=int(time.time()) + 3600)
    with pytest.raises(GitHubError, match=r"rate limit; it resets in \d+s, longer than we wait"):
        PyGithubHost(emulator_config(gh, max_rate_limit_wait=5)).pull_request(n)
    assert len(gh.requests_made("GET", rf"/pulls/{n}$")) == 1


def test_slow_answers_time_out_with_a_clear_message(gh: GitHubEmulator) -> None:
    n = emulated_repo(gh)
    gh.inject("GET", rf"/pulls/{n}$", delay=2.5, count=10)
    with pytest.raises(TransientGitHubError, match="no answer from GitHub within 1s|cannot reach GitHub"):
        PyGithubHost(emulator_config(gh, timeout=1, retries=1)).pull_request(n)


def test_rate_limit_endpoint_reads_through_pygithub(gh: GitHubEmulator) -> None:
    host = PyGithubHost(emulator_config(gh))
    assert host.gh.get_rate_limit().resources.core.remaining == 4999
