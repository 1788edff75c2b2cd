"""Conformance with GitHub's real webhook payloads in ../shared (skipped when absent): the
parser reads them, they are served to PyGithub through the emulator, and the emulator's own
objects carry their fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.github.events import guess_event_name, parse_event
from tests.infra.github_emulator import GitHubEmulator, emulator_config

REAL = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "github" / "webhooks"


# --------------------------------------------------------------------------- conformance

REAL_PAYLOADS = sorted(REAL.glob("*.json")) if REAL.is_dir() else []
needs_real = pytest.mark.skipif(not REAL_PAYLOADS, reason="../shared/fixtures/github/webhooks not present")


@needs_real
@pytest.mark.parametrize("path", REAL_PAYLOADS, ids=lambda p: p.name)
def test_real_payload_parses_and_is_served_to_pygithub(path: Path) -> None:
    from pipelines.github.client import PyGithubHost

    payload = json.loads(path.read_text(encoding="utf-8"))
    name = path.name.split(".")[0]
    event = parse_event(name, payload)
    assert event.name == name
    assert guess_event_name(payload) == name
    with GitHubEmulator() as gh:
        gh.load_payload(payload)
        repo = (payload.get("repository") or {}).get("full_name")
        if not repo:
            return
        host = PyGithubHost(emulator_config(gh, repo=repo))
        if "pull_request" in payload and payload["pull_request"].get("head"):
            pr = host.pull_request(payload["pull_request"]["number"])
            assert pr.head_sha == payload["pull_request"]["head"]["sha"]
            assert pr.author == payload["pull_request"]["user"]["login"]
            if "review" in payload:
                (review,) = host.reviews(pr.number)
                assert review.commit_id == payload["review"]["commit_id"]
                assert review.state == payload["review"]["state"].upper()
        if "comment" in payload:
            number = payload["issue"]["number"]
            (comment,) = host.list_comments(number)
            assert comment.id == payload["comment"]["id"] and comment.body == payload["comment"]["body"]
            assert comment.author == payload["comment"]["user"]["login"]


def _keys(obj: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in obj.items():
        out.add(prefix + k)
        if isinstance(v, dict) and k in ("head", "base", "user"):
            out |= _keys(v, f"{prefix}{k}.")
    return out


@needs_real
def test_emulator_objects_have_the_fields_of_the_real_ones() -> None:
    """The emulator's own pull request, comment and review carry every field (and the nesting
    of head/base/user) that GitHub's objects have, so code tested here meets no surprise there."""
    import urllib.request

    real = {name: json.loads((REAL / f"{name}.payload.json").read_text()) for name in
            ("pull_request.opened", "issue_comment.created", "pull_request_review.submitted")}
    with GitHubEmulator() as gh:
        from tests.infra.github_emulator import emulated_repo

        n = emulated_repo(gh)
        gh.add_comment("acme/lab", n, user="erin", body="hi")
        gh.add_review("acme/lab", n, user="erin")

        def get(path: str) -> object:
            req = urllib.request.Request(gh.base_url + path, headers={"Authorization": f"token {gh.token}"})
            with urllib.request.urlopen(req) as resp:
                return json.load(resp)

        ours = {"pull_request": get(f"/repos/acme/lab/pulls/{n}"),
                "comment": get(f"/repos/acme/lab/issues/{n}/comments")[0],
                "review": get(f"/repos/acme/lab/pulls/{n}/reviews")[0]}
    missing = {
        "pull_request": _keys(real["pull_request.opened"]["pull_request"]) - _keys(ours["pull_request"]),
        "comment": _keys(real["issue_comment.created"]["comment"]) - _keys(ours["comment"]),
        "review": _keys(real["pull_request_review.submitted"]["review"]) - _keys(ours["review"]),
    }
    assert missing == {"pull_request": set(), "comment": set(), "review": set()}
