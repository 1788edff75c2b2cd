"""Promotion gates as pure functions: which approvals count (the latest, on the final SHA, by
another writer, not by whoever pushed the head), the override label, and every reason a gate
lists."""

from __future__ import annotations

from pipelines.github.client import LabelEvent, Review
from pipelines.trusted.promote import (
    TrainingRecord,
    check_gates,
    counted_approvals,
    outstanding_change_requests,
    override_actor,
)
from tests.infra.github_emulator import SHA_A, SHA_B

EXP = "rope-theta"
WRITERS = {"erin": "write", "mia": "maintain", "dana": "write", "frank": "read"}


def review(user: str, state: str, sha: str = SHA_A, at: str = "2026-11-29T10:00:00", rid: int = 0) -> Review:
    return Review(user=user, state=state, commit_id=sha, submitted_at=at, id=rid)


def record(**kw: object) -> TrainingRecord:
    values: dict = dict(experiment=EXP, mlflow_run_id="r1", code_version=SHA_A, status="FINISHED", dirty=False,
                        verdict="supported", gates_passed=None, model_source="file:///m", verdict_by="trusted")
    values.update(kw)
    return TrainingRecord(**values)


# --------------------------------------------------------------------------- pure gates


def test_only_latest_approvals_on_the_final_sha_by_other_writers_count() -> None:
    reviews = [
        review("erin", "APPROVED", SHA_B, at="2026-11-29T09:00:00"),  # old commit
        review("dana", "APPROVED"),  # the author
        review("frank", "APPROVED"),  # read access
        review("mia", "APPROVED", at="2026-11-29T09:00:00"),
        review("mia", "COMMENTED", at="2026-11-29T11:00:00"),  # a comment does not undo it
    ]
    assert counted_approvals(reviews, head_sha=SHA_A, author="dana", permissions=WRITERS) == ("mia",)
    withdrawn = [*reviews, review("mia", "CHANGES_REQUESTED", at="2026-11-29T12:00:00")]
    assert counted_approvals(withdrawn, head_sha=SHA_A, author="dana", permissions=WRITERS) == ()
    # GitHub turns a dismissed review's own state into DISMISSED: it no longer counts.
    dismissed = [r if r.user != "mia" or r.state != "APPROVED" else review("mia", "DISMISSED", at=r.submitted_at)
                 for r in reviews]
    assert counted_approvals(dismissed, head_sha=SHA_A, author="dana", permissions=WRITERS) == ()


def test_override_label_counts_only_from_another_writer_while_present() -> None:
    ev = [LabelEvent("promote-override", "erin", "2026-11-29T10:00:00")]
    assert override_actor(ev, label="promote-override", author="dana", permissions=WRITERS,
                          current_labels=("promote-override",)) == "erin"
    assert override_actor(ev, label="promote-override", author="dana", permissions=WRITERS, current_labels=()) is None
    by_author = [LabelEvent("promote-override", "dana", "2026-11-29T10:00:00")]
    assert override_actor(by_author, label="promote-override", author="dana", permissions=WRITERS,
                          current_labels=("promote-override",)) is None
    by_reader = [LabelEvent("promote-override", "frank", "2026-11-29T10:00:00")]
    assert override_actor(by_reader, label="promote-override", author="dana", permissions=WRITERS,
                          current_labels=("promote-override",)) is None


def test_gates_list_every_reason() -> None:
    ok = check_gates(experiment=EXP, head_sha=SHA_A, record=record(), approvals=("mia",), required_approvals=1,
                     override_by=None)
    assert ok.ok and ok.reasons == ()
    bad = check_gates(experiment=EXP, head_sha=SHA_A, record=record(verdict="inconclusive", dirty=True),
                      approvals=(), required_approvals=2, override_by=None)
    assert not bad.ok and len(bad.reasons) == 3
    assert any("inconclusive" in r and "promote-override" in r for r in bad.reasons)
    missing = check_gates(experiment=EXP, head_sha=SHA_A, record=None, approvals=("mia",), required_approvals=1,
                          override_by=None)
    assert missing.reasons == (f"no training run of `{EXP}` on the final head commit `{SHA_A[:12]}` made by the "
                               "train workflow for this pull request",)
    overridden = check_gates(experiment=EXP, head_sha=SHA_A, record=record(verdict="refuted"), approvals=("mia",),
                             required_approvals=1, override_by="erin")
    assert overridden.ok
    explicit = check_gates(experiment=EXP, head_sha=SHA_A, record=record(gates_passed=False), approvals=("mia",),
                           required_approvals=1, override_by=None)
    assert not explicit.ok


# --------------------------------------------------------------------------- reviews as GitHub counts them (issue 19 item 4)


def test_a_dismissed_change_request_does_not_revive_an_older_approval() -> None:
    reviews = [
        review("erin", "APPROVED", at="2026-11-29T09:00:00", rid=1),
        # erin then requested changes and a maintainer dismissed that review: GitHub shows
        # erin's latest state as DISMISSED and counts nothing from erin.
        review("erin", "DISMISSED", at="2026-11-29T10:00:00", rid=2),
    ]
    assert counted_approvals(reviews, head_sha=SHA_A, author="dana", permissions=WRITERS) == ()
    assert outstanding_change_requests(reviews, author="dana", permissions=WRITERS) == ()
    again = [*reviews, review("erin", "APPROVED", at="2026-11-29T11:00:00", rid=3)]
    assert counted_approvals(again, head_sha=SHA_A, author="dana", permissions=WRITERS) == ("erin",)


def test_whoever_pushed_the_head_cannot_approve_it() -> None:
    reviews = [review("erin", "APPROVED"), review("mia", "APPROVED")]
    assert counted_approvals(reviews, head_sha=SHA_A, author="dana", permissions=WRITERS,
                             pushers=("erin",)) == ("mia",)


# --------------------------------------------------------------------------- whose verdict (issue 36)


def test_only_the_verdict_the_attest_job_computed_promotes() -> None:
    """A sweep's attestation used to carry the pull request's own verdict (no plan entry), and
    promotion read it like any other: a `supported` from PR code promoted."""
    for by in (None, "report", "anything"):
        gate = check_gates(experiment=EXP, head_sha=SHA_A, record=record(verdict_by=by), approvals=("mia",),
                           required_approvals=1, override_by=None)
        assert not gate.ok and len(gate.reasons) == 1
        assert "computed by the pull request's own code" in gate.reasons[0] and "promote-override" in gate.reasons[0]
        assert not check_gates(experiment=EXP, head_sha=SHA_A, record=record(verdict_by=by, gates_passed=True),
                               approvals=("mia",), required_approvals=1, override_by=None).ok
        # Overrides only: a writer other than the author may still promote it, by the label.
        assert check_gates(experiment=EXP, head_sha=SHA_A, record=record(verdict_by=by), approvals=("mia",),
                           required_approvals=1, override_by="erin").ok
    assert check_gates(experiment=EXP, head_sha=SHA_A, record=record(verdict_by="trusted"), approvals=("mia",),
                       required_approvals=1, override_by=None).ok
