"""The GitHub client's configuration from the environment GitHub Actions sets; a repository
that is not `owner/name` is one clear line."""

from __future__ import annotations

import pytest

from basics.errors import UsageError
from pipelines.github.client import GitHubConfig


def test_config_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme/lab")
    monkeypatch.setenv("GITHUB_TOKEN", "t")
    monkeypatch.delenv("GITHUB_API_URL", raising=False)
    monkeypatch.setenv("PIPELINE_GITHUB_SECONDS_BETWEEN_WRITES", "0")
    config = GitHubConfig.from_env()
    assert (config.repo, config.api_url, config.seconds_between_writes) == ("acme/lab", "https://api.github.com", 0.0)
    monkeypatch.setenv("GITHUB_REPOSITORY", "not a repo; rm -rf /")
    with pytest.raises(UsageError, match="no repository"):
        GitHubConfig.from_env()
