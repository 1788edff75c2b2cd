"""Promotion on merge: gates (pure) and the MLflow registry move (thin adapter).

For each experiment a merged PR adds or changes, the model is promoted only when:

1. a training run *finished* on the PR's final head SHA (MLflow tag
   `pipeline.git_sha` equals that SHA, and the tree was not dirty);
2. its verdict passes the gates (`supported`, computed by the trusted attest job itself:
   `pipeline.verdict_by=trusted`; a verdict the pull request's code computed never passes,
   whatever it says), or someone with write access other than
   the author applied the override label (`promote-override`), as the PR's label events
   show (who applied it is asked of the API, not assumed), *after* the attested training of
   the final head started (its workflow run's `created_at`) and after the head's last
   force-push: a label given for an earlier commit or verdict does not carry over;
3. at least `required_approvals` approving reviews were submitted *on that SHA* by users
   with write access who are neither the author nor a pusher of the head commit (its
   author or committer, or whoever force-pushed it last), and no such user's review still
   requests changes. Each reviewer's latest review that carries a decision counts, as
   GitHub counts it (APPROVED, CHANGES_REQUESTED or DISMISSED: plain comments change
   nothing; after a dismissal nothing from that reviewer counts);
4. the run was *attested* for this PR: the trusted `attest` job of the train workflow
   (default-branch code, an MLflow credential the training job never sees) wrote an
   attestation into the provenance experiment, which the trainer credential cannot write
   (`pipelines/trusted/provenance.py`). Nothing the training job wrote (its run tags, start
   times, verdict tag) is read. The attestation's `pipeline.pr` must be this PR and its
   `pipeline.github_run_id` a run that the API confirms is
   `.github/workflows/experiment-train.yml` on the default branch (a comment or a manual
   dispatch, never the PR's own copy of the workflow). The latest attestation on the SHA
   decides: a later run cannot be cherry-picked past a refutation.

Trigger: a `push` to the default branch (the merge commit). The merged PR is the one
`GET /commits/{sha}/pulls` reports as merged with that merge commit. Running from `push`
lets the `promotion` environment allow the default branch only: a `pull_request` run would
need `refs/pull/<n>/merge`, a ref every open PR has.

Then the run's model is registered (`create_model_version(name, source, run_id)`,
reused when that run is already a version; on a tracking server the registered model itself
is never created here: `pipeline provenance setup` makes it, owned by the attestor), the alias `champion` moves to it and the
previous champion keeps the alias `previous-champion`. Running it twice changes nothing
the second time. A refused promotion says why in the experiment's sticky comment.

Where the verdict comes from: the attestation's `pipeline.verdict`, which the attest job
computed from the attested metrics against the claim's registration under the trusted launch
plan (`pipeline.verdict_by=trusted`, single experiments and sweeps alike). An attestation made
without a plan carries the report's own verdict (`pipeline.verdict_by=report`, computed by the
pull request's code): promotion refuses it and says so; the override label still applies.
The model version's source is the attestation run's copy of `model/`, its run id the
training run's (the champion's metrics stay where they were logged).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from basics.errors import PromotionRefused
from pipelines.github.chatops import experiments_in
from pipelines.github.client import WRITE_ROLES, CodeHost, LabelEvent, RepoContentHost, Review, ReviewHost
from pipelines.github.comment import StickyComment
from pipelines.github.events import PullRequestEvent, PushEvent
from validation.spec import CHAMPION  # the alias name: one definition, beside the spec that names it

OVERRIDE_LABEL = "promote-override"
TRAIN_WORKFLOW = ".github/workflows/experiment-train.yml"
# Events whose runs use the default branch's copy of the train workflow (a `pull_request`
# run, from the `train` label, runs the PR's copy and is not accepted as provenance).
TRUSTED_TRAIN_EVENTS = frozenset({"issue_comment", "workflow_dispatch"})
PREVIOUS = "previous-champion"
TRUSTED_VERDICT = "trusted"
"""`pipeline.verdict_by` of a verdict the attest job computed (pipelines/trusted/provenance.py)."""
_SHA = re.compile(r"^[0-9a-f]{40}$")


# --------------------------------------------------------------------------- pure gates


@dataclass(frozen=True)
class TrainingRecord:
    """The finished training run of one experiment at one commit (from MLflow)."""

    experiment: str
    mlflow_run_id: str
    code_version: str
    status: str  # MLflow run status: FINISHED, FAILED, KILLED, RUNNING
    dirty: bool
    verdict: str | None  # supported | refuted | inconclusive | None (no report)
    gates_passed: bool | None  # explicit gate result when the reporter recorded one
    model_source: str
    hypothesis: str = ""
    pr: int | None = None
    workflow_run_id: int | None = None
    attestation_run_id: str | None = None  # the provenance run that vouches for it (trusted writer)
    verdict_by: str | None = None
    """Who computed `verdict`: `trusted` (the attest job, from attested metrics) is the only one
    that counts; `report` (the pull request's code) or None does not."""


@dataclass(frozen=True)
class GateResult:
    experiment: str
    ok: bool
    reasons: tuple[str, ...]
    approvals: tuple[str, ...]
    override_by: str | None = None


def latest_reviews(reviews: Iterable[Review]) -> dict[str, Review]:
    """Each reviewer's latest review that carries a decision, as GitHub counts them: APPROVED,
    CHANGES_REQUESTED or DISMISSED. Comments (and pending reviews) change nothing. A dismissed
    review is that reviewer's latest state: nothing counts from them (it neither approves nor
    blocks), and an older approval of theirs does not come back."""
    latest: dict[str, Review] = {}
    for r in sorted(reviews, key=lambda r: (r.submitted_at, r.id)):
        if r.state in ("APPROVED", "CHANGES_REQUESTED", "DISMISSED"):
            latest[r.user] = r
    return latest


def outstanding_change_requests(
    reviews: Iterable[Review], *, author: str, permissions: Mapping[str, str]
) -> tuple[str, ...]:
    """Writers (not the author) whose latest decision requests changes, on any commit.

    Like branch protection, only reviews by people with write access block."""
    return tuple(sorted(
        user for user, r in latest_reviews(reviews).items()
        if r.state == "CHANGES_REQUESTED" and user != author and permissions.get(user, "none") in WRITE_ROLES
    ))


def counted_approvals(
    reviews: Iterable[Review], *, head_sha: str, author: str, permissions: Mapping[str, str],
    pushers: Iterable[str] = (),
) -> tuple[str, ...]:
    """Logins whose latest decision is an approval of `head_sha`, with write access, neither the
    author nor someone who pushed the head (whoever pushed the last commit cannot approve it)."""
    excluded = {author, *pushers}
    return tuple(sorted(
        user for user, r in latest_reviews(reviews).items()
        if r.state == "APPROVED" and r.commit_id == head_sha and user not in excluded
        and permissions.get(user, "none") in WRITE_ROLES
    ))


def _when(stamp: str) -> datetime | None:
    """An API timestamp (`...Z` or `+00:00`; naive means UTC) as an aware datetime; None if unreadable."""
    try:
        t = datetime.fromisoformat(stamp.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def override_actor(
    events: Iterable[LabelEvent], *, label: str, author: str, permissions: Mapping[str, str],
    current_labels: Sequence[str], not_before: str | None = None,
) -> str | None:
    """Who applied the override label (latest application), if it counts: the label is
    still on the PR and was applied by someone with write access who is not the author,
    and, with `not_before` (a server timestamp), not before it: the time the head
    commit's attested training started or the head was last force-pushed, whichever is later,
    so a label given for an earlier commit or verdict does not carry over."""
    if label not in current_labels:
        return None
    appliers = [e for e in sorted(events, key=lambda e: (e.created_at, e.id)) if e.label == label
                and e.event == "labeled"]
    if not appliers:
        return None
    latest = appliers[-1]
    actor = latest.actor
    if actor == author or permissions.get(actor, "none") not in WRITE_ROLES:
        return None
    if not_before is not None:
        applied, bound = _when(latest.created_at), _when(not_before)
        if applied is None or bound is None or applied < bound:  # API times have whole seconds
            return None
    return actor


def override_bound(record: TrainingRecord | None, events: Iterable[LabelEvent], host: RepoContentHost) -> str:
    """The server time an override must follow for `record` (see `override_actor`); "" (nothing
    counts) when the attested training's workflow run or its start time is unknown."""
    if record is None or not record.workflow_run_id:
        return ""
    run = host.workflow_run(record.workflow_run_id)
    started = _when(run.created_at) if run is not None and run.created_at else None
    if started is None:
        return ""
    pushes = [t for e in events if e.event == "head_ref_force_pushed" and (t := _when(e.created_at)) is not None]
    return max([started, *pushes]).isoformat()


def check_gates(
    *,
    experiment: str,
    head_sha: str,
    record: TrainingRecord | None,
    approvals: Sequence[str],
    required_approvals: int,
    override_by: str | None,
    changes_requested: Sequence[str] = (),
    early_override: bool = False,
) -> GateResult:
    """Every reason a promotion is refused (empty = promote); `early_override`: the label is on
    the PR but was applied before the head's attested training started (it does not count)."""
    reasons: list[str] = []
    short = head_sha[:12]
    if record is None:
        reasons.append(f"no training run of `{experiment}` on the final head commit `{short}` made by the "
                       "train workflow for this pull request")
    else:
        if record.status != "FINISHED":
            reasons.append(f"the training run on `{short}` did not finish (status {record.status})")
        if record.dirty:
            reasons.append("the training run was made from a working tree with uncommitted changes")
        trusted = record.verdict_by == TRUSTED_VERDICT
        passed = trusted and (record.gates_passed if record.gates_passed is not None else record.verdict == "supported")
        if not passed and override_by is None:
            verdict = record.verdict or "missing (no report)"
            if not trusted and record.verdict:
                reasons.append(f"the verdict `{verdict}` was computed by the pull request's own code, not by the "
                               "trusted attest job (no launch plan for it), so it does not count; a reviewer with "
                               f"write access can apply the `{OVERRIDE_LABEL}` label to promote anyway")
            else:
                reasons.append(f"the verdict is {verdict}; a reviewer with write access can apply "
                               f"the `{OVERRIDE_LABEL}` label to promote anyway")
            if early_override:
                reasons.append(f"the `{OVERRIDE_LABEL}` label was applied before the training of `{short}` "
                               "started (or before its last force-push), so it was not given for this commit and "
                               "verdict: remove it and apply it again")
    if len(approvals) < required_approvals:
        reasons.append(f"{len(approvals)} approving review(s) on `{short}` by people with write access other "
                       f"than the author; {required_approvals} required")
    if changes_requested:
        reasons.append("changes are still requested by " + ", ".join(f"@{u}" for u in changes_requested))
    return GateResult(experiment, not reasons, tuple(reasons), tuple(approvals), override_by)


# --------------------------------------------------------------------------- adapters


RunFilter = Callable[[Mapping[str, str]], bool]
"""Accepts or rejects an MLflow run by its tags (the provenance check)."""


class TrainingLookup(Protocol):
    def training_record(self, experiment: str, sha: str, accept: RunFilter | None = None) -> TrainingRecord | None:
        ...


@dataclass(frozen=True)
class Promotion:
    version: str
    previous: str | None
    changed: bool


class ModelRegistry(Protocol):
    def promote(self, record: TrainingRecord, tags: Mapping[str, str]) -> Promotion: ...


class MlflowPromotion:
    """`ModelRegistry` over `MlflowClient` (mlflow imported lazily). Which run to promote comes
    from the attestations (`pipelines.trusted.provenance.ProvenanceLookup`), never from tags the
    training job wrote."""

    def __init__(self, tracking_uri: str | None, model_name: str, registry_uri: str | None = None):
        import os

        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # CI logs, not a terminal
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri or tracking_uri)
        self.model_name = model_name
        self.tracking_uri = registry_uri or tracking_uri or ""
        # A local store (sqlite, a folder: a laptop) has one identity, so the model may be made on
        # first promotion there; a server's model must come from `pipeline provenance setup`.
        self.local_store = self.tracking_uri.split(":", 1)[0].lower() not in ("http", "https", "databricks")

    def promote(self, record: TrainingRecord, tags: Mapping[str, str]) -> Promotion:
        from mlflow.exceptions import MlflowException

        name = self.model_name
        try:
            self.client.get_registered_model(name)
        except MlflowException:
            if not self.local_store:
                # Made only by `pipeline provenance setup` (the attestor owns it, checked there):
                # created here, on a server, it would belong to whoever runs promotion.
                raise PromotionRefused(f"registered model `{name}` does not exist on {self.tracking_uri}: "
                                       "run `pipeline provenance setup` first (it is never created here)") from None
            self.client.create_registered_model(name, description="Promoted by the GitOps training pipeline on merge.")
        # The version belongs to the attestation run (MLflow wants the source inside run_id), whose
        # `model/` is the attestor's copy; the training run stays in the tag `pipeline.training_run_id`.
        owner = record.attestation_run_id or record.mlflow_run_id
        existing = self.client.search_model_versions(f"name = '{name}' and run_id = '{owner}'")
        if existing:
            version = str(max(int(v.version) for v in existing))
        else:
            version = str(self.client.create_model_version(
                name, record.model_source, run_id=owner,
                tags={**tags, "pipeline.training_run_id": record.mlflow_run_id},
                description=record.hypothesis[:5000] or None,
            ).version)
        try:
            current = str(self.client.get_model_version_by_alias(name, CHAMPION).version)
        except MlflowException:
            current = None
        if current == version:
            return Promotion(version, self._alias(PREVIOUS), changed=False)
        if current is not None:
            self.client.set_registered_model_alias(name, PREVIOUS, current)
        self.client.set_registered_model_alias(name, CHAMPION, version)
        return Promotion(version, current, changed=True)

    def _alias(self, alias: str) -> str | None:
        from mlflow.exceptions import MlflowException

        try:
            return str(self.client.get_model_version_by_alias(self.model_name, alias).version)
        except MlflowException:
            return None


# --------------------------------------------------------------------------- flow


@dataclass(frozen=True)
class PromotionOutcome:
    gate: GateResult
    promotion: Promotion | None
    message: str


class PromoteHost(CodeHost, ReviewHost, RepoContentHost, Protocol):
    """The PyGithub adapter implements all three."""


def merged_pull_for_push(event: PushEvent, host: PromoteHost, *, default_branch: str) -> int | None:
    """The PR merged by this push to the default branch (its merge commit is the pushed head)."""
    if event.deleted or event.ref != f"refs/heads/{default_branch}" or not _SHA.match(event.after):
        return None
    merged = [p for p in host.pulls_for_commit(event.after)
              if p.merged and p.merge_commit_sha == event.after and p.base_ref == default_branch]
    return merged[0].number if len(merged) == 1 else None


def provenance_filter(host: PromoteHost, number: int, *, default_branch: str) -> RunFilter:
    """Accept only MLflow runs the train workflow made for PR `number` (asked of the API)."""
    checked: dict[int, bool] = {}

    def accept(tags: Mapping[str, str]) -> bool:
        run_id = str(tags.get("pipeline.github_run_id", ""))
        if tags.get("pipeline.pr") != str(number) or not run_id.isdigit():
            return False
        rid = int(run_id)
        if rid not in checked:
            run = host.workflow_run(rid)
            checked[rid] = (run is not None and run.path == TRAIN_WORKFLOW and run.event in TRUSTED_TRAIN_EVENTS
                            and run.head_branch == default_branch)
        return checked[rid]

    return accept


def promote_merged(
    event: PullRequestEvent,
    host: PromoteHost,
    lookup: TrainingLookup,
    registry: ModelRegistry,
    **kw: Any,
) -> list[PromotionOutcome]:
    """`promote_pull` for a merged `pull_request` payload; [] when the PR was not merged."""
    if not event.merged:
        return []
    return promote_pull(event.pull_request.number, host, lookup, registry, **kw)


def promote_push(
    event: PushEvent,
    host: PromoteHost,
    lookup: TrainingLookup,
    registry: ModelRegistry,
    *,
    default_branch: str = "main",
    **kw: Any,
) -> list[PromotionOutcome]:
    """Promotion for a push to the default branch: the merged PR, found through the API."""
    number = merged_pull_for_push(event, host, default_branch=default_branch)
    if number is None:
        return []
    return promote_pull(number, host, lookup, registry, default_branch=default_branch, **kw)


def promote_pull(
    number: int,
    host: PromoteHost,
    lookup: TrainingLookup,
    registry: ModelRegistry,
    *,
    model_name: str,
    required_approvals: int = 1,
    bot_login: str | None,
    override_label: str = OVERRIDE_LABEL,
    default_branch: str = "main",
    sleep: Callable[[float], None] | None = None,
) -> list[PromotionOutcome]:
    """Check the gates for every experiment of merged PR `number`, promote those that pass
    and say what happened in each experiment's sticky comment. Idempotent: a second run
    reuses the model version and leaves the alias where it is."""
    pr = host.pull_request(number)  # the API's view: final head SHA, current labels, files
    if not pr.merged:
        return []
    experiments = experiments_in(pr.files)
    if not experiments:
        return []
    reviews = host.reviews(number)
    events = host.label_events(number)
    people = {r.user for r in reviews} | {e.actor for e in events if e.label == override_label}
    permissions = {login: host.permission(login) for login in sorted(people) if login}
    approvals = counted_approvals(reviews, head_sha=pr.head_sha, author=pr.author, permissions=permissions,
                                  pushers=host.head_pushers(number))
    blocking = outstanding_change_requests(reviews, author=pr.author, permissions=permissions)
    unbound = override_actor(events, label=override_label, author=pr.author, permissions=permissions,
                             current_labels=pr.labels)
    accept = provenance_filter(host, number, default_branch=default_branch)
    outcomes = []
    for exp in experiments:
        record = lookup.training_record(exp, pr.head_sha, accept) if _SHA.match(pr.head_sha) else None
        # The label counts for this commit and verdict only when applied after they existed.
        override_by = override_actor(events, label=override_label, author=pr.author, permissions=permissions,
                                     current_labels=pr.labels, not_before=override_bound(record, events, host)) \
            if unbound else None
        gate = check_gates(experiment=exp, head_sha=pr.head_sha, record=record, approvals=approvals,
                           required_approvals=required_approvals, override_by=override_by,
                           changes_requested=blocking, early_override=bool(unbound) and override_by is None)
        promotion = None
        if gate.ok:
            assert record is not None
            tags = {
                "pipeline.pr": str(number), "pipeline.sha": pr.head_sha, "pipeline.experiment": exp,
                "pipeline.verdict": record.verdict or "", "pipeline.verdict_by": record.verdict_by or "",
                "pipeline.hypothesis": record.hypothesis[:5000],
                "pipeline.approved_by": ",".join(approvals), "pipeline.override_by": override_by or "",
                "pipeline.github_run_id": str(record.workflow_run_id or ""),
                "pipeline.attestation_run_id": record.attestation_run_id or "",
            }
            promotion = registry.promote(record, tags)
        message = render_outcome(gate, promotion, model_name)
        kw: dict[str, Any] = {"author": bot_login}
        if sleep is not None:
            kw["sleep"] = sleep
        StickyComment.for_experiment(host, number, exp, **kw).upsert_section("promotion", message)
        outcomes.append(PromotionOutcome(gate, promotion, message))
    return outcomes


def render_outcome(gate: GateResult, promotion: Promotion | None, model_name: str) -> str:
    """The promotion section of the sticky comment (only validated names and numbers)."""
    if promotion is not None:
        lines = [f"### 🏆 Promoted: `{model_name}` version {promotion.version} is now `{CHAMPION}`", ""]
        if promotion.previous and promotion.changed:
            lines.append(f"The previous champion (version {promotion.previous}) keeps the alias `{PREVIOUS}`.")
        elif not promotion.changed:
            lines.append("It already was the champion; nothing changed.")
        approvers = ", ".join(f"@{a}" for a in gate.approvals) or "none"
        lines.append(f"Approved by {approvers}." + (f" Verdict overridden by @{gate.override_by}." if gate.override_by else ""))
        return "\n".join(lines)
    lines = ["### 🚫 Not promoted", "", "The model was not registered because:", ""]
    lines += [f"- {r}" for r in gate.reasons]
    return "\n".join(lines)
