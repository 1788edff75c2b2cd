"""`pipeline comment | chatops | promote | runners`: the GitHub side on the command line.

Configuration comes from what GitHub Actions provides: `GITHUB_TOKEN`, `GITHUB_API_URL`
(default the public API), `GITHUB_REPOSITORY`, `GITHUB_EVENT_PATH`, `GITHUB_OUTPUT`.
Without a token (or with `--dry-run`) comments go to files instead of GitHub.
Everything under `pipelines.github` is imported inside the commands so this module
imports fast.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from basics.errors import PipelineError, PromotionRefused, UsageError

if TYPE_CHECKING:
    from pipelines.github.client import GitHubConfig

runners_app = typer.Typer(help="Self-hosted runners: list, just-in-time registration, prune, capacity.",
                          no_args_is_help=True)

provenance_app = typer.Typer(help="Trusted provenance in MLflow: users, store, registered model.",
                              no_args_is_help=True)

job_credential_app = typer.Typer(help="One MLflow identity per launch, bound to its GitHub OIDC token "
                                       "(pipelines/trusted/job_identity.py).",
                                  no_args_is_help=True)

RepoOpt = Annotated[str | None, typer.Option("--repo", help="owner/name (default: $GITHUB_REPOSITORY).")]


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command("comment")(comment)
    app.command("chatops")(chatops)
    app.command("promote")(promote)
    app.command("attest")(attest)
    app.command("cancel-training")(cancel_training)
    app.command("plan-launch")(plan_launch)
    app.add_typer(provenance_app, name="provenance")
    app.add_typer(job_credential_app, name="job-identity")
    app.add_typer(runners_app, name="runners")


def _guarded(fn: Callable[[], Any]) -> Any:
    """One line per error, exit code from the error's class; no traceback for user mistakes."""
    try:
        return fn()
    except PipelineError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(exc.exit_code) from None


def _config(repo: str | None, fallback_repo: str = "") -> GitHubConfig:
    from pipelines.github.client import GitHubConfig

    return GitHubConfig.from_env(repo or os.environ.get("GITHUB_REPOSITORY") or fallback_repo)


def _runners_config(repo: str | None) -> GitHubConfig:
    """Runner administration needs a token with Administration access, which the workflow's
    own `github.token` cannot have: `GITHUB_RUNNERS_TOKEN` when set, else `GITHUB_TOKEN`.
    Comments are still posted with `GITHUB_TOKEN`, so the sticky comment keeps one author."""
    import dataclasses

    config = _config(repo)
    return dataclasses.replace(config, token=os.environ.get("GITHUB_RUNNERS_TOKEN") or config.token)


def _host(config: GitHubConfig) -> Any:
    from pipelines.github.client import PyGithubHost

    return PyGithubHost(config)


# --------------------------------------------------------------------------- comment


def comment(
    pr: Annotated[int, typer.Option("--pr", help="Pull request number.", min=1)],
    experiment: Annotated[str, typer.Option("--experiment", help="Experiment name (the comment's key).")],
    body_file: Annotated[Path | None, typer.Option("--body-file", help="Markdown body (e.g. report.md).")] = None,
    stage: Annotated[str | None, typer.Option(
        "--stage", help="Render a status body for this stage instead of --body-file: validated, plan, "
                   "data_checked, smoke_passed, awaiting_train, training, report (reports.render.STAGES).")] = None,
    detail: Annotated[str | None, typer.Option("--detail", help="One line of detail for --stage.")] = None,
    failed: Annotated[bool, typer.Option("--failed", help="Mark --stage as failed.")] = False,
    step: Annotated[int | None, typer.Option("--step", help="Training progress for --stage training.")] = None,
    total_steps: Annotated[int | None, typer.Option("--total-steps")] = None,
    eta_s: Annotated[float | None, typer.Option("--eta-s", help="Seconds left, for --stage training.")] = None,
    loss: Annotated[float | None, typer.Option("--loss", help="Latest loss, for --stage training.")] = None,
    url: Annotated[str | None, typer.Option("--url", help="Link to logs (e.g. the workflow run).")] = None,
    validated_sha: Annotated[str | None, typer.Option(
        "--validated-sha", help="Record that this head commit passed validation (what /train binds to).")] = None,
    repo: RepoOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Write the comment to --out-dir, not to GitHub.")] = False,
    out_dir: Annotated[Path, typer.Option("--out-dir", help="Where --dry-run writes comments.")] = Path("runs/comments"),
) -> None:
    """Create or update the one sticky comment of an experiment on a pull request."""

    def run() -> None:
        import re

        from pipelines.github.client import DryRunCodeHost
        from pipelines.github.comment import StickyComment

        if (body_file is None) == (stage is None):
            raise UsageError("give exactly one of --body-file or --stage")
        if body_file is not None:
            if not body_file.is_file():
                raise UsageError(f"{body_file}: no such file")
            from pipelines.github.comment import neutralize_untrusted

            # Bodies from files are untrusted text (a PR's bundle, a training report).
            body = neutralize_untrusted(body_file.read_text(encoding="utf-8"))
        else:
            from reports.render import render_status

            assert stage is not None
            try:
                body = render_status(stage, experiment=experiment, detail=detail, failed=failed, step=step,
                                     total_steps=total_steps, eta_s=eta_s, loss=loss, url=url)
            except AssertionError as exc:
                raise UsageError(f"unknown stage {stage!r}") from exc
        state: dict[str, str] = {}
        if validated_sha is not None:
            if not re.fullmatch(r"[0-9a-f]{40}", validated_sha):
                raise UsageError("--validated-sha must be a full 40-character lower-case hex SHA")
            state["validated_sha"] = validated_sha
        if stage is not None:
            state["stage"] = stage
        use_dry_run = dry_run or not os.environ.get("GITHUB_TOKEN")
        head: str | None = None
        if use_dry_run:
            host: Any = DryRunCodeHost(out_dir)
            bot = host.bot_login
        else:
            config = _config(repo)
            host, bot = _host(config), config.bot_login
            if validated_sha is not None:
                # validated_sha only ever moves to the PR's current head (asked now, not
                # taken from the caller): a late run for an older commit cannot move it back.
                head = host.pull_request(pr).head_sha
                if head != validated_sha:
                    typer.echo(f"not recording {validated_sha[:12]} as validated: the head of #{pr} is now "
                               f"{head[:12]}", err=True)
        posted = StickyComment.for_experiment(host, pr, experiment, author=bot).upsert(body, state, head_sha=head)
        where = host.path_of(posted) if use_dry_run else f"comment {posted.id}"
        typer.echo(f"{'dry run: ' if use_dry_run else ''}sticky comment for {experiment} on #{pr}: {where}")

    _guarded(run)


# --------------------------------------------------------------------------- chatops


def chatops(
    event_path: Annotated[Path | None, typer.Option(
        "--event-path", help="Webhook payload (default: $GITHUB_EVENT_PATH).")] = None,
    event_name: Annotated[str | None, typer.Option(
        "--event-name", help="Event name (default: $GITHUB_EVENT_NAME, else guessed from the payload).")] = None,
    repo: RepoOpt = None,
) -> None:
    """Decide what a /train, /cancel or /retry comment (or a manual dispatch) does; writes step outputs."""

    def run() -> None:
        from pipelines.github.chatops import handle_event, write_outputs
        from pipelines.github.events import load_event

        path = event_path or os.environ.get("GITHUB_EVENT_PATH")
        if not path:
            raise UsageError("no event: pass --event-path or set GITHUB_EVENT_PATH")
        event = load_event(path, event_name)
        config = _config(repo, getattr(event, "repo", ""))
        decision = handle_event(event, _host(config), bot_login=config.bot_login)
        write_outputs(decision, os.environ.get("GITHUB_OUTPUT"))
        if decision.action == "launch":
            _summary(f"Launching {', '.join(f'`{e}`' for e in decision.experiments)} of #{decision.pr} at commit "
                     f"`{decision.sha}`: the environment approval is for this commit only.")
        typer.echo(f"{decision.action}: {decision.reason}")

    _guarded(run)


# --------------------------------------------------------------------------- cancel


def cancel_training(
    pr: Annotated[int, typer.Option("--pr", min=1, help="Pull request number (from `authorize`).")],
    experiments: Annotated[str, typer.Option(
        "--experiments", help="JSON list of experiment names (from `authorize`).")],
    default_branch: Annotated[str, typer.Option("--default-branch")] = "main",
    repo: RepoOpt = None,
) -> None:
    """`/cancel`: cancel the PR's trainings through the Actions API (trusted job, `actions: write`)."""

    def run() -> None:
        import json
        import re

        from pipelines.github.cancel import cancel_trainings

        try:
            names = json.loads(experiments)
        except ValueError:
            names = None
        if not isinstance(names, list) or not all(isinstance(n, str) and re.fullmatch(r"[a-z0-9][a-z0-9_-]{2,63}", n)
                                                  for n in names):
            raise UsageError("--experiments must be a JSON list of experiment names")
        own = os.environ.get("GITHUB_RUN_ID", "")
        done = cancel_trainings(_host(_config(repo)), pr=pr, experiments=names, default_branch=default_branch,
                                skip_run=int(own) if own.isdigit() else None)
        if not done:
            _summary(f"/cancel on #{pr}: no unfinished training of {', '.join(names)} to cancel")
        for t in done:
            _summary(f"/cancel on #{pr}: cancelled workflow run {t.run_id} (training {', '.join(t.experiments)}; "
                     "the trainer checkpoints before it stops)")

    _guarded(run)


# --------------------------------------------------------------------------- promote


def promote(
    event_path: Annotated[Path | None, typer.Option(
        "--event-path", help="push to the default branch (or a merged pull_request) payload "
                             "(default: $GITHUB_EVENT_PATH).")] = None,
    tracking_uri: Annotated[str | None, typer.Option(
        "--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or ./mlflow.db).")] = None,
    model_name: Annotated[str, typer.Option(
        "--model-name", envvar="PIPELINE_REGISTRY_MODEL", help="Registered model that carries the champion alias.")]
        = "gitops-train",
    required_approvals: Annotated[int, typer.Option("--required-approvals", min=0)] = 1,
    strict: Annotated[bool, typer.Option(
        "--strict", help="Exit 10 when an experiment is refused (default: a refusal is a normal outcome, "
                         "explained in the PR comment).")] = False,
    repo: RepoOpt = None,
) -> None:
    """On merge: check the promotion gates and move the MLflow alias `champion`; a refusal says why on the PR."""

    def run() -> None:
        from pipelines.github.events import PullRequestEvent, PushEvent, load_event
        from pipelines.trusted.promote import MlflowPromotion, promote_merged, promote_push
        from pipelines.trusted.provenance import ProvenanceLookup

        path = event_path or os.environ.get("GITHUB_EVENT_PATH")
        if not path:
            raise UsageError("no event: pass --event-path or set GITHUB_EVENT_PATH")
        event = load_event(path)
        if isinstance(event, PullRequestEvent) and not event.merged:
            typer.echo("nothing to promote: not a merged pull request")
            return
        if not isinstance(event, PullRequestEvent | PushEvent):
            typer.echo(f"nothing to promote: a {event.name} event")
            return
        config = _config(repo, event.repo)
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
        mlflow = MlflowPromotion(uri, model_name)
        # Which run to promote comes from the attestations only (pipelines/trusted/provenance.py).
        lookup = ProvenanceLookup(uri, os.environ.get("MLFLOW_PROVENANCE_EXPERIMENT_ID") or None)
        kw: dict[str, Any] = dict(model_name=model_name, required_approvals=required_approvals,
                                  bot_login=config.bot_login)
        if isinstance(event, PushEvent):
            # The workflow runs on a push to the default branch: the merged PR comes from the API.
            outcomes = promote_push(event, _host(config), lookup, mlflow, default_branch=event.default_branch, **kw)
        else:
            outcomes = promote_merged(event, _host(config), lookup, mlflow, **kw)
        refused = [o for o in outcomes if o.promotion is None]
        for o in outcomes:
            if o.promotion is not None:
                typer.echo(f"promoted {o.gate.experiment}: {model_name} version {o.promotion.version} is champion")
            else:
                typer.echo(f"refused {o.gate.experiment}: {'; '.join(o.gate.reasons)}")
        if not outcomes:
            typer.echo("nothing to promote: no merged pull request that changes an experiment")
        if refused and strict:
            raise PromotionRefused(f"{len(refused)} experiment(s) not promoted; the PR comment says why")

    _guarded(run)


# --------------------------------------------------------------------------- provenance


def attest(
    result_file: Annotated[Path, typer.Option("--result-file", help="result.json from this run's report artifact.")],
    pr: Annotated[int, typer.Option("--pr", min=1)],
    sha: Annotated[str, typer.Option("--sha", help="The approved head SHA (from `authorize`).")],
    experiment: Annotated[str, typer.Option("--experiment")],
    workflow_run_id: Annotated[int, typer.Option("--workflow-run-id", envvar="GITHUB_RUN_ID", min=1)],
    tracking_uri: Annotated[str | None, typer.Option(
        "--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or ./mlflow.db).")] = None,
    attempt: Annotated[int, typer.Option("--attempt", envvar="GITHUB_RUN_ATTEMPT", min=1,
                                         help="The workflow run's attempt: only this launch's runs count.")] = 1,
) -> None:
    """After training (trusted job, attestor credential): check the runs the report names and
    write the attestation promotion reads. Exit 10 when the claims do not match."""

    def run() -> None:
        from pipelines.trusted.provenance import AttestationRefused, attest, read_result, shown

        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
        try:
            done = attest(tracking_uri=uri, pr=pr, sha=sha, experiment=experiment, workflow_run_id=workflow_run_id,
                          result=read_result(result_file), attempt=attempt,
                          provenance_id=os.environ.get("MLFLOW_PROVENANCE_EXPERIMENT_ID") or None)
        except AttestationRefused as exc:
            # The reasons quote names read from MLflow (PR-chosen): `shown` escaped them already;
            # `shown` again keeps anything else in the message to one inert line.
            _summary(f"Not attested: {shown(experiment)} at {sha[:12]}: {shown(str(exc), 2000)}")
            raise PromotionRefused(f"not attested: {shown(str(exc), 2000)}") from None
        _summary(f"Attested {shown(experiment)} at {sha[:12]} for PR #{pr}: training run(s) "
                 f"{', '.join(done.training_run_ids)}, verdict {done.verdict or 'none'}, status {shown(done.status)}")
        typer.echo(f"attested {shown(experiment)}: {done.run_id}")

    _guarded(run)


def _summary(line: str) -> None:
    typer.echo(line)
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


@provenance_app.command("setup")
def provenance_setup(
    tracking_uri: Annotated[str, typer.Option("--tracking-uri", envvar="MLFLOW_TRACKING_URI")],
    model_name: Annotated[str, typer.Option("--model-name", envvar="PIPELINE_REGISTRY_MODEL")] = "gitops-train",
    reader_user: Annotated[str, typer.Option("--reader-user")] = "reader",
    attestor_user: Annotated[str, typer.Option("--attestor-user")] = "attestor",
) -> None:
    """Operator, once: create the read-only and attestor users (passwords from $MLFLOW_READER_PASSWORD,
    $MLFLOW_ATTESTOR_PASSWORD; admin from $MLFLOW_ADMIN_USERNAME/$MLFLOW_ADMIN_PASSWORD), then the
    provenance experiment and the registered model as the attestor. Prints the experiment id
    to set as the repository variable MLFLOW_PROVENANCE_EXPERIMENT_ID."""

    def run() -> None:
        from pipelines.trusted.provenance import setup

        def env(name: str) -> str:
            value = os.environ.get(name)
            if not value:
                raise UsageError(f"set {name}")
            return value

        done = setup(tracking_uri=tracking_uri, model_name=model_name,
                     reader=(reader_user, env("MLFLOW_READER_PASSWORD")),
                     attestor=(attestor_user, env("MLFLOW_ATTESTOR_PASSWORD")),
                     admin=(os.environ.get("MLFLOW_ADMIN_USERNAME", "admin"), env("MLFLOW_ADMIN_PASSWORD")))
        typer.echo(f"MLFLOW_PROVENANCE_EXPERIMENT_ID={done.provenance_experiment_id}")

    _guarded(run)


def plan_launch(
    checkout: Annotated[Path, typer.Option("--checkout", help="The approved commit, checked out as data.")],
    experiment: Annotated[list[str], typer.Option("--experiment", help="Experiment name (repeat for several).")],
    sha: Annotated[str, typer.Option("--sha")],
    pr: Annotated[int, typer.Option("--pr")],
    out: Annotated[Path, typer.Option("--out")],
) -> None:
    """The trusted launch plan (= `python -m pipelines.trusted.registry plan`): which attested runs are
    reused and which seeds each claim gets, before any PR code runs."""
    from pipelines.trusted.registry import main

    argv = ["plan", "--checkout", str(checkout), "--sha", sha, "--pr", str(pr), "--out", str(out)]
    for name in experiment:
        argv += ["--experiment", name]
    code = main(argv)
    if code:
        raise typer.Exit(code)


ExperimentsOpt = Annotated[str, typer.Option("--experiments", help="JSON list (authorize's `experiments` output).")]
RunIdOpt = Annotated[int, typer.Option("--workflow-run-id", envvar="GITHUB_RUN_ID")]
AttemptOpt = Annotated[int, typer.Option("--attempt", envvar="GITHUB_RUN_ATTEMPT")]
TrackingOpt = Annotated[str, typer.Option("--tracking-uri", envvar="MLFLOW_TRACKING_URI")]


@job_credential_app.command("create")
def job_identity_create(experiments: ExperimentsOpt, tracking_uri: TrackingOpt, workflow_run_id: RunIdOpt,
                        attempt: AttemptOpt = 1) -> None:
    """Trusted `job-identity` job: the launch's MLflow user and its job experiments, EDIT on
    those only. Nothing secret leaves this job: the training job proves it is this launch with
    its GitHub OIDC token. The user name goes to the step output `users`. Admin from
    $MLFLOW_ADMIN_USERNAME/$MLFLOW_ADMIN_PASSWORD."""

    def run() -> None:
        import json

        from pipelines.trusted import job_identity as jc

        names = jc.parse_experiments(experiments)
        if not jc.has_users(tracking_uri):  # a local store (the act tests, a laptop): no users to make
            jc.github_output("users", "[]")
            typer.echo(f"{tracking_uri or 'no tracking URI'}: not an MLflow server, no job identity made")
            return
        made = jc.create(tracking_uri=tracking_uri, admin=jc.admin_from_env(), workflow_run_id=workflow_run_id,
                         attempt=attempt, experiments=names)
        jc.github_output("users", json.dumps([made.username]))
        for name in names:
            typer.echo(f"{name}: user {made.username} (GitHub OIDC token of this launch), "
                       f"experiment {jc.job_experiment(workflow_run_id, attempt, name)!r}")

    _guarded(run)


@job_credential_app.command("revoke")
def job_identity_revoke(tracking_uri: TrackingOpt, workflow_run_id: RunIdOpt, attempt: AttemptOpt = 1,
                        users: Annotated[str, typer.Option("--users", help="JSON list (job-identity's `users`).")] = "[]",
                        ) -> None:
    """Cleanup job (always): delete the launch's MLflow user and anything it made or shared
    (its runs stay, read-only)."""

    def run() -> None:
        import json

        from pipelines.trusted import job_identity as jc

        try:
            named = [u for u in json.loads(users or "[]") if isinstance(u, str)]
        except ValueError:
            named = []
        if not jc.has_users(tracking_uri):
            typer.echo("not an MLflow server: no job users to delete")
            return
        admin = jc.admin_from_env()
        for username in dict.fromkeys([*named, jc.job_user(workflow_run_id, attempt)]):
            for line in jc.revoke(tracking_uri=tracking_uri, admin=admin, username=username):
                typer.echo(line)

    _guarded(run)


# --------------------------------------------------------------------------- runners


@runners_app.command("list")
def runners_list(repo: RepoOpt = None) -> None:
    """The repository's self-hosted runners: labels, online/offline, busy."""

    def run() -> None:
        from pipelines.github.runners import format_table

        typer.echo(format_table(_host(_runners_config(repo)).runners()))

    _guarded(run)


@runners_app.command("token", hidden=True)
def runners_token(repo: RepoOpt = None) -> None:
    """Refused: repository-level registration tokens are not issued (use `pipeline runners jit`)."""

    def run() -> None:
        # A repository-level runner cannot be limited to a workflow: any writer's branch workflow
        # with `runs-on: [self-hosted, gpu]` would reach it (docs/operations.md, section 3).
        raise UsageError("repository-level runner registration tokens are not issued: register one-job runners "
                         "in the organisation's gate-only group with `pipeline runners jit --org ORG --group GROUP "
                         "--labels gpu,TYPE --out FILE`")

    _guarded(run)


@runners_app.command("jit")
def runners_jit(
    org: Annotated[str, typer.Option("--org", help="Organisation whose runner group serves the GPU pool.")],
    group: Annotated[str, typer.Option("--group", help="Runner group name (restricted to experiment-train.yml "
                                                       "on the default branch).")],
    labels: Annotated[str, typer.Option("--labels", help="Comma list, e.g. gpu,h100.")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the encoded JIT config (mode 0600; it is "
                                                    "a credential: never on a command line or in a log).")],
    name: Annotated[str | None, typer.Option("--name", help="Runner name (default: host-pid-random).")] = None,
    default_branch: Annotated[str, typer.Option("--default-branch")] = "main",
    repo: RepoOpt = None,
) -> None:
    """Register one just-in-time runner (one job, then gone) in the gate-only runner group:
    refuses a group that is not restricted to the train workflow on the default branch."""

    def run() -> None:
        import secrets
        import socket

        from pipelines.github.runners import group_problems, jit_request

        config = _runners_config(repo)
        host = _host(config)
        groups = [g for g in host.runner_groups(org) if g.name == group]
        if len(groups) != 1:
            raise UsageError(f"no runner group named {group!r} in {org}")
        problems = group_problems(groups[0], repo=config.repo, default_branch=default_branch)
        if problems:
            raise UsageError("refusing to register a runner: " + "; ".join(problems))
        runner_name = name or f"{socket.gethostname().split('.')[0]}-{os.getpid()}-{secrets.token_hex(3)}"
        body = jit_request(name=runner_name, labels=tuple(x for x in labels.split(",") if x), group_id=groups[0].id)
        jit = host.generate_jitconfig(org, body)
        out.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(jit.encoded_jit_config)
        typer.echo(f"runner {jit.name} (id {jit.id}) registered in {group} for one job; config in {out}")

    _guarded(run)


@runners_app.command("prune")
def runners_prune(
    offline_for: Annotated[str, typer.Option("--offline-for", help="Remove runners offline this long (e.g. 24h).")]
        = "24h",
    state_file: Annotated[Path, typer.Option(
        "--state-file", help="Remembers since when each runner has been offline.")] = Path("runs/runners-offline.json"),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say what would be removed.")] = False,
    repo: RepoOpt = None,
) -> None:
    """Remove self-hosted runners that have been offline longer than --offline-for."""

    def run() -> None:
        from pipelines.github.runners import parse_duration, prune

        removed = prune(_host(_runners_config(repo)), state_file, parse_duration(offline_for), dry_run=dry_run)
        verb = "would remove" if dry_run else "removed"
        typer.echo(f"{verb} {len(removed)} runner(s)" + "".join(f"\n  {r.id} {r.name}" for r in removed))

    _guarded(run)


@runners_app.command("capacity")
def runners_capacity(
    labels: Annotated[str, typer.Option("--labels", help="Comma-separated labels, e.g. gpu,h100.")],
    nodes: Annotated[int, typer.Option("--nodes", min=1)] = 1,
    pr: Annotated[int | None, typer.Option("--pr", help="Also say it in this PR's sticky comment.")] = None,
    experiment: Annotated[str | None, typer.Option("--experiment")] = None,
    repo: RepoOpt = None,
) -> None:
    """Check that enough idle online runners carry the labels; exit 0 either way, prints the verdict.

    Reads runners with GITHUB_RUNNERS_TOKEN (or GITHUB_TOKEN); comments with GITHUB_TOKEN."""

    def run() -> None:
        from pipelines.github.comment import StickyComment
        from pipelines.github.runners import capacity

        wanted = [x.strip() for x in labels.split(",") if x.strip()]
        result = capacity(_host(_runners_config(repo)).runners(), wanted, nodes)
        if pr is not None and experiment is not None and not result.ok:
            config = _config(repo)
            StickyComment.for_experiment(_host(config), pr, experiment, author=config.bot_login).upsert_section(
                "capacity", f"⏳ {result.message}.")
        if os.environ.get("GITHUB_OUTPUT"):
            with open(os.environ["GITHUB_OUTPUT"], "a", encoding="utf-8") as fh:
                fh.write(f"capacity_ok={'true' if result.ok else 'false'}\n")
        typer.echo(result.message)

    _guarded(run)
