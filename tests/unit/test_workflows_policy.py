"""Security policy of the GitHub workflows, checked on the parsed YAML.

A future edit that hands a stranger a GPU runner or a write token fails here, with a
message naming the workflow, the job and the rule. The negative tests feed
deliberately bad workflows to the same checker to prove that it can fail.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / ".github" / "workflows"

# Workflows allowed to hold `pull-requests: write` (they comment on PRs).
PR_WRITERS = {"experiment-comment", "experiment-train", "experiment-promote"}
PINNED = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@[0-9a-f]{40}$")
EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.S)
# Anything from the event payload or a user-chosen ref/input can carry shell syntax.
UNTRUSTED_IN_RUN = re.compile(r"github\.event\.|github\.head_ref|\binputs\.|github\.event_path", re.I)
FORK_GUARD = re.compile(
    r"github\.event\.pull_request\.head\.repo\.full_name\s*==\s*github\.repository"
)


def triggers(workflow: dict[str, Any]) -> dict[str, Any]:
    # PyYAML reads the key `on` as the boolean True.
    on = workflow.get("on", workflow.get(True))
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return dict.fromkeys(on)
    return dict(on or {})


def runs_on_labels(job: dict[str, Any]) -> list[str]:
    runs_on = job.get("runs-on", [])
    if isinstance(runs_on, str):
        return [runs_on]
    if isinstance(runs_on, dict):
        return list(runs_on.get("labels", [])) + ([runs_on["group"]] if "group" in runs_on else [])
    return [str(x) for x in runs_on]


def policy_violations(name: str, text: str) -> list[str]:
    """Every rule the workflow `name` (file stem) breaks, one line each."""
    problems: list[str] = []
    workflow = yaml.safe_load(text)
    on = triggers(workflow)

    if "pull_request_target" in on:
        problems.append(f"{name}: uses pull_request_target (runs with secrets on fork code)")

    top = workflow.get("permissions")
    if top != {}:
        problems.append(f"{name}: top-level permissions must be {{}} (got {top!r}); grant per job")

    jobs: dict[str, dict[str, Any]] = workflow.get("jobs", {})
    for job_id, job in jobs.items():
        where = f"{name}.{job_id}"
        perms = job.get("permissions")
        if not isinstance(perms, dict):
            problems.append(f"{where}: needs an explicit permissions map (got {perms!r})")
            perms = {}
        if perms.get("pull-requests") == "write" and name not in PR_WRITERS:
            problems.append(f"{where}: pull-requests: write outside {sorted(PR_WRITERS)}")
        for scope, level in perms.items():
            if level == "write" and scope not in {"pull-requests", "issues"} and \
                    (where, scope) not in {("experiment-train.cancel", "actions"),  # /cancel through the API
                                           # its MLflow identity: an OIDC token of this job (issue 36)
                                           ("experiment-train.train", "id-token")}:
                problems.append(f"{where}: {scope}: write is broader than any job here needs")

        job_text = yaml.safe_dump(job)
        environment = job.get("environment")
        environment = environment.get("name") if isinstance(environment, dict) else environment
        if environment == "promotion":
            push = on.get("push") or {}
            if set(on) != {"push"} or push.get("branches") != ["main"]:
                problems.append(f"{where}: the promotion environment must be reached from a push to main only "
                                f"(triggers {sorted(on)}): a pull_request run uses refs/pull/<n>/merge")
        if "secrets." in job_text and not job.get("environment"):
            problems.append(f"{where}: references secrets without a protected environment")

        labels = runs_on_labels(job)
        if "self-hosted" in labels:
            condition = str(job.get("if", ""))
            needs = job.get("needs", [])
            needs = [needs] if isinstance(needs, str) else list(needs)
            if not job.get("environment"):
                problems.append(f"{where}: self-hosted job without an environment (required reviewers)")
            if not needs or not any(f"needs.{n}.outputs" in condition for n in needs):
                problems.append(f"{where}: self-hosted job not gated by `if:` on an authorization job's outputs")
            if ("pull_request" in on or "pull_request_target" in on) and not FORK_GUARD.search(condition):
                problems.append(f"{where}: self-hosted job reachable from a fork's pull_request")

        for index, step in enumerate(job.get("steps", [])):
            label = f"{where} step {step.get('name') or step.get('uses') or index}"
            uses = step.get("uses")
            if uses and not uses.startswith("./"):
                if not PINNED.match(uses):
                    problems.append(f"{label}: `{uses}` is not pinned by a full commit SHA")
                if uses.startswith("actions/checkout@"):
                    if (step.get("with") or {}).get("persist-credentials") is not False:
                        problems.append(f"{label}: checkout without persist-credentials: false")
                    ref = str((step.get("with") or {}).get("ref", ""))
                    if "workflow_run" in on and "workflow_run" in ref:
                        problems.append(f"{label}: checks out the PR's code in a workflow_run job")
            for expression in EXPRESSION.findall(str(step.get("run", ""))):
                if UNTRUSTED_IN_RUN.search(expression):
                    problems.append(f"{label}: `${{{{{expression.strip()}}}}}` interpolated into run: (pass it via env:)")
    return problems


def workflow_files() -> list[Path]:
    return sorted(WORKFLOWS.glob("*.yml"))


def test_the_expected_workflows_exist() -> None:
    names = {p.stem for p in workflow_files()}
    assert {"ci", "experiment-pr", "experiment-comment", "experiment-train", "experiment-promote"} <= names


@pytest.mark.parametrize("path", workflow_files(), ids=lambda p: p.name)
def test_workflow_follows_the_security_policy(path: Path) -> None:
    assert policy_violations(path.stem, path.read_text(encoding="utf-8")) == []


def test_pr_workflow_is_read_only_and_cancels_superseded_runs() -> None:
    workflow = yaml.safe_load((WORKFLOWS / "experiment-pr.yml").read_text(encoding="utf-8"))
    assert set(triggers(workflow)) == {"pull_request"}
    # experiments, and plug-in files (their contract checks run in this job)
    assert triggers(workflow)["pull_request"]["paths"] == ["experiments/**", "models/**"]
    assert workflow["concurrency"]["cancel-in-progress"] is True
    assert "pull_request.number" in workflow["concurrency"]["group"]
    for job in workflow["jobs"].values():
        assert job["permissions"] == {"contents": "read"}
        assert "self-hosted" not in runs_on_labels(job)
        assert "secrets." not in yaml.safe_dump(job)
        assert any("upload-artifact@" in str(step.get("uses", "")) for step in job["steps"])


def test_comment_workflow_never_checks_out_or_runs_pr_code() -> None:
    workflow = yaml.safe_load((WORKFLOWS / "experiment-comment.yml").read_text(encoding="utf-8"))
    assert triggers(workflow)["workflow_run"]["workflows"] == ["experiment-pr"]
    assert set(workflow["jobs"]) == {"verify", "comment"}
    for job in workflow["jobs"].values():
        checkouts = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/checkout@")]
        assert [s["with"]["ref"] for s in checkouts] == ["${{ github.event.repository.default_branch }}"]
        download = next(s for s in job["steps"] if "download-artifact@" in str(s.get("uses", "")))
        assert download["with"]["run-id"] == "${{ github.event.workflow_run.id }}"
        assert "github-token" in download["with"]
    verify, comment = workflow["jobs"]["verify"], workflow["jobs"]["comment"]
    # verify runs the standard-library script only (nothing installed), then comment posts.
    assert "make setup" not in yaml.safe_dump(verify) and "result_bundle.py verify" in yaml.safe_dump(verify)
    assert comment["needs"] == "verify"
    runs = "\n".join(str(s.get("run", "")) for s in comment["steps"])
    assert runs.index("result_bundle.py verify") < runs.index("pipeline comment")


def test_train_job_runs_only_the_approved_sha_on_gated_self_hosted_runners() -> None:
    workflow = yaml.safe_load((WORKFLOWS / "experiment-train.yml").read_text(encoding="utf-8"))
    # No label trigger: a pull_request run would execute the PR's copy of this workflow.
    assert {"issue_comment", "workflow_dispatch"} == set(triggers(workflow))
    train = workflow["jobs"]["train"]
    assert runs_on_labels(train) == ["self-hosted", "gpu"]
    assert train["environment"] == "gpu-training"
    # Issue 28: after the trusted plan and the per-job credential broker, gated by authorize.
    assert train["needs"] == ["authorize", "plan", "job-identity"]
    assert "needs.authorize.outputs.launch == 'true'" in train["if"]
    # Issue 19 item 2: the first steps run the default branch's head check, before any PR code.
    steps = train["steps"]
    assert steps[0]["with"] == {"ref": "${{ github.event.repository.default_branch }}", "persist-credentials": False}
    assert steps[1]["id"] == "head" and 'train_gate.py" head' in steps[1]["run"]
    # Issue 28: the PR's author is refused as an approver of their own launch, before any PR code.
    assert steps[2]["run"].strip() == "python3 .github/scripts/launch_approval.py"
    pr_checkouts = [i for i, st in enumerate(steps) if st.get("with", {}).get("ref") == "${{ needs.authorize.outputs.sha }}"]
    assert pr_checkouts == [3]
    assert steps[3]["with"] == {"ref": "${{ needs.authorize.outputs.sha }}", "persist-credentials": False}
    authorize = workflow["jobs"]["authorize"]
    assert "self-hosted" not in runs_on_labels(authorize)
    assert "secrets." not in yaml.safe_dump(authorize)
    assert "pipeline chatops" in yaml.safe_dump(authorize)


def test_promotion_runs_on_a_push_to_main_in_no_concurrency_group() -> None:
    """Issue 14 items 1 and 6: no pull_request trigger (its ref refs/pull/<n>/merge exists for
    every open PR). Issue 28: no concurrency group (a public name another run could queue in,
    dropping the pending promotion); the registry's model name is passed."""
    workflow = yaml.safe_load((WORKFLOWS / "experiment-promote.yml").read_text(encoding="utf-8"))
    assert set(triggers(workflow)) == {"push"} and triggers(workflow)["push"]["branches"] == ["main"]
    assert "concurrency" not in workflow and "concurrency" not in workflow["jobs"]["promote"]
    assert "vars.PIPELINE_REGISTRY_MODEL" in yaml.safe_dump(workflow["jobs"]["promote"])
    job = workflow["jobs"]["promote"]
    assert job["environment"] == "promotion"
    assert job["permissions"]["actions"] == "read"  # the provenance check reads workflow runs
    assert "pipeline promote" in yaml.safe_dump(job)


def test_a_promotion_environment_reachable_from_a_pull_request_is_caught() -> None:
    text = (WORKFLOWS / "experiment-promote.yml").read_text(encoding="utf-8")
    old = "\n  push:\n    branches: [main]\n"
    assert old in text
    weakened = text.replace(old, "\n  pull_request:\n    types: [closed]\n    branches: [main]\n", 1)
    assert any("promotion environment" in p for p in policy_violations("experiment-promote", weakened))


def test_no_trusted_workflow_uses_a_concurrency_group() -> None:
    """Issue 28: a concurrency group's name is public, so any workflow run of the repository can
    join it, cancel a training (cancel-in-progress) or make GitHub drop a pending report or
    promotion. The trusted workflows use none (the comment's writers converge by optimistic
    concurrency; `/cancel` goes through the Actions API)."""
    for wf in ("experiment-comment", "experiment-train", "experiment-promote"):
        workflow = yaml.safe_load((WORKFLOWS / f"{wf}.yml").read_text(encoding="utf-8"))
        assert "concurrency" not in workflow, wf
        for name, job in workflow["jobs"].items():
            assert "concurrency" not in job, f"{wf}.{name}"


def test_the_report_is_posted_by_a_short_job_with_its_own_token() -> None:
    """Issue 14 item 3: the training job's token may have expired when training ends."""
    workflow = yaml.safe_load((WORKFLOWS / "experiment-train.yml").read_text(encoding="utf-8"))
    train, report = workflow["jobs"]["train"], workflow["jobs"]["report"]
    assert "pipeline comment" not in yaml.safe_dump(train)
    assert "PIPELINE_REPORT_EXPORT" in yaml.safe_dump(train)
    assert set(report["needs"]) == {"authorize", "train", "attest"} and report["if"].startswith("always()")
    assert "self-hosted" not in runs_on_labels(report) and "pipeline comment" in yaml.safe_dump(report)


def test_capacity_comments_with_the_workflow_token() -> None:
    """Issue 14 item 10: the runners token only reads runners; comments use github.token."""
    workflow = yaml.safe_load((WORKFLOWS / "experiment-train.yml").read_text(encoding="utf-8"))
    job = workflow["jobs"]["capacity"]
    assert job["permissions"]["pull-requests"] == "write"
    step = job["steps"][-1]
    assert step["env"]["GITHUB_TOKEN"] == "${{ github.token }}"
    assert step["env"]["GITHUB_RUNNERS_TOKEN"] == "${{ secrets.RUNNERS_READ_TOKEN }}"
    assert 'GITHUB_TOKEN="$RUNNERS_TOKEN"' not in step["run"]


def test_authorize_checks_the_exact_grammar_before_installing() -> None:
    """Issue 14 item 8: ordinary comments mentioning /train do not start a `make setup`."""
    import importlib.util

    workflow = yaml.safe_load((WORKFLOWS / "experiment-train.yml").read_text(encoding="utf-8"))
    steps = workflow["jobs"]["authorize"]["steps"]
    runs = [str(s.get("run", "")) for s in steps]
    grammar = next(i for i, r in enumerate(runs) if "command_filter.py" in r)
    setup = next(i for i, r in enumerate(runs) if "make setup" in r)
    assert grammar < setup and steps[setup]["if"] == "steps.grammar.outputs.command == 'true'"
    spec = importlib.util.spec_from_file_location("command_filter", REPO / ".github/scripts/command_filter.py")
    assert spec and spec.loader
    cf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cf)
    for body in ("see trainer/train.py", "https://ci.invalid/runs/1/retry", "/trainer", "a /train", "/retrying"):
        assert not cf.has_command(body), body
    for body in ("/train", "LGTM\r\n/train rope-theta", "/cancel\n", "/retry x y"):
        assert cf.has_command(body), body


# Releases verified against the actions' own repositories (tag -> commit, `runs.using`).
NODE24_PINS = {
    "actions/checkout": ("3d3c42e5aac5ba805825da76410c181273ba90b1", "v7.0.1"),
    "actions/setup-python": ("5fda3b95a4ea91299a34e894583c3862153e4b97", "v7.0.0"),
    "actions/upload-artifact": ("bbbca2ddaa5d8feaa63e36b76fdaad77386f024f", "v7.0.0"),
    "actions/download-artifact": ("3e5f45b2cfb9172054b4087a40e8e0b5a5461e7c", "v8.0.1"),
}


def test_actions_are_pinned_to_verified_node24_releases() -> None:
    pattern = re.compile(r"uses:\s*([\w.-]+/[\w.-]+)@([0-9a-f]{40})\s*#\s*(v[\d.]+)")
    for path in workflow_files():
        for action, sha, tag in pattern.findall(path.read_text(encoding="utf-8")):
            assert NODE24_PINS.get(action) == (sha, tag), f"{path.name}: {action}@{sha} # {tag} is not a verified pin"


BAD_WORKFLOW = """
name: bad
on:
  pull_request_target:
  pull_request:
permissions: write-all
jobs:
  build:
    runs-on: [self-hosted, gpu]
    permissions:
      contents: write
      pull-requests: write
    steps:
      - uses: actions/checkout@v4
        with:
          ref: ${{ github.event.pull_request.head.sha }}
      - run: echo "${{ github.event.pull_request.title }}"
      - run: ./train --token "${{ secrets.MLFLOW_TRACKING_TOKEN }}"
"""


def test_a_bad_workflow_fails_every_rule() -> None:
    problems = "\n".join(policy_violations("bad", BAD_WORKFLOW))
    for expected in (
        "pull_request_target",
        "top-level permissions",
        "pull-requests: write outside",
        "contents: write",
        "secrets without a protected environment",
        "self-hosted job without an environment",
        "not gated by `if:`",
        "reachable from a fork",
        "not pinned by a full commit SHA",
        "persist-credentials",
        "github.event.pull_request.title",
    ):
        assert expected in problems, f"policy did not catch: {expected}\n{problems}"


@pytest.mark.parametrize(
    "mutation",
    [
        ("runs-on: [self-hosted, gpu] # zizmor", "runs-on: [self-hosted, gpu]\n    # zizmor"),
        ("    environment: gpu-training\n", ""),
        ("    # Launch only what `authorize` approved.\n    if: needs.authorize.outputs.launch == 'true'",
         "    if: true"),
        # A pull_request trigger added back without a fork guard on the self-hosted job.
        ("  workflow_dispatch:\n    inputs:", "  pull_request:\n  workflow_dispatch:\n    inputs:"),
    ],
    ids=["unchanged-control", "no-environment", "no-authorize-gate", "pull-request-without-fork-guard"],
)
def test_weakening_the_train_workflow_is_caught(mutation: tuple[str, str]) -> None:
    text = (WORKFLOWS / "experiment-train.yml").read_text(encoding="utf-8")
    old, new = mutation
    assert old in text
    problems = policy_violations("experiment-train", text.replace(old, new, 1))
    if old.startswith("runs-on"):
        assert problems == []  # moving a comment changes nothing: the control case
    else:
        assert problems, f"removing {old!r} was not caught"


def test_an_untrusted_field_in_run_is_caught_but_env_is_fine() -> None:
    base = """
name: x
on: issue_comment
permissions: {}
jobs:
  a:
    runs-on: ubuntu-latest
    permissions: {}
    steps:
      - RUN
"""
    unsafe = base.replace("RUN", 'run: echo "${{ github.event.comment.body }}"')
    safe = base.replace("RUN", 'env:\n          BODY: ${{ github.event.comment.body }}\n        run: echo "$BODY"')
    assert any("interpolated into run" in p for p in policy_violations("x", unsafe))
    assert policy_violations("x", safe) == []


def test_cancel_goes_through_the_actions_api_from_trusted_code() -> None:
    """Issue 28: `/cancel` cancels the training's run through the Actions API (a trusted job with
    `actions: write`), finding it by the train job's name; no concurrency group is joined."""
    from pipelines.github.cancel import train_job_name

    wf = yaml.safe_load((WORKFLOWS / "experiment-train.yml").read_text(encoding="utf-8"))
    cancel, train = wf["jobs"]["cancel"], wf["jobs"]["train"]
    assert "concurrency" not in cancel and "concurrency" not in train
    assert cancel["permissions"] == {"actions": "write", "contents": "read"} and cancel["runs-on"] == "ubuntu-latest"
    assert "needs.authorize.outputs.action == 'cancel'" in cancel["if"]
    refs = [st.get("with", {}).get("ref") for st in cancel["steps"] if "checkout" in str(st.get("uses", ""))]
    assert refs == ["${{ github.event.repository.default_branch }}"]
    assert "pipeline cancel-training" in yaml.safe_dump(cancel)
    name = train["name"].replace("${{ needs.authorize.outputs.pr }}", "12").replace("${{ matrix.experiment }}", "exp")
    assert name == train_job_name(12, "exp")


PRIVILEGED_JOBS = {("experiment-comment", "comment"), ("experiment-train", "authorize"),
                   ("experiment-train", "capacity"), ("experiment-train", "report"), ("experiment-promote", "promote"),
                   ("experiment-train", "cancel"), ("experiment-train", "attest"), ("experiment-train", "plan"),
                   ("experiment-train", "job-identity"), ("experiment-train", "revoke-identity")}


def test_privileged_jobs_install_from_the_hash_pinned_lock() -> None:
    """Issue 14 item 10: no `~=` ranges resolved at run time where a write token is held."""
    for wf, job_id in PRIVILEGED_JOBS:
        job = yaml.safe_load((WORKFLOWS / f"{wf}.yml").read_text(encoding="utf-8"))["jobs"][job_id]
        runs = [str(s.get("run", "")).strip() for s in job["steps"]]
        assert "make setup-github" in runs and "make setup" not in runs, (wf, job_id, runs)
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    recipe = makefile[makefile.index("setup-github:"):].split("\n\n", 1)[0]
    assert "--require-hashes --no-deps -r constraints/github-jobs.lock" in recipe
    assert "--no-deps --no-build-isolation -e ." in recipe


def test_the_gpu_job_installs_from_a_hash_pinned_lock_and_holds_no_secret() -> None:
    """Issue 28: the training job installed with `make setup` (ranges resolved at run time,
    build tools fetched unhashed). Issue 36: its secret was opened after the PR's own install,
    so PR code had it; the job now holds no secret at any step."""
    train = yaml.safe_load((WORKFLOWS / "experiment-train.yml").read_text(encoding="utf-8"))["jobs"]["train"]
    runs = [str(s.get("run", "")).strip() for s in train["steps"]]
    assert "make setup-train" in runs and "make setup" not in runs
    assert [i for i, st in enumerate(train["steps"]) if "secrets." in yaml.safe_dump(st)] == []
    assert "secrets." not in yaml.safe_dump(train)
    assert "secrets." not in yaml.safe_dump(train.get("env", {}))
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    recipe = makefile[makefile.index("setup-train:"):].split("\n\n", 1)[0]
    assert "--require-hashes --no-deps -r constraints/build-tools.lock" in recipe
    assert "--require-hashes --no-deps --no-build-isolation -r constraints/gpu-train.lock" in recipe
    lock = (REPO / "constraints" / "gpu-train.lock").read_text(encoding="utf-8")
    for entry in re.split(r"\n(?=[a-z0-9])", lock.strip()):
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", entry), entry.split("\n", 1)[0]
    assert re.search(r"^torch==\S+ \\$", lock, re.M), "torch is not in the GPU lock"


def test_the_lock_pins_every_package_with_hashes() -> None:
    lock = (REPO / "constraints" / "github-jobs.lock").read_text(encoding="utf-8")
    entries = re.split(r"\n(?=[a-z0-9])", lock.strip())
    pins = {}
    for entry in entries:
        first = entry.split("\n", 1)[0]
        m = re.match(r"^([a-z0-9][a-z0-9._-]*)==([^ ]+) \\$", first)
        assert m, f"not an exact pin: {first!r}"
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", entry), f"{m.group(1)} has no hash"
        pins[m.group(1)] = m.group(2)
    wanted = [re.split(r"[<>=~!\s;\[]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")
              for line in (REPO / "constraints" / "github-jobs.in").read_text(encoding="utf-8").splitlines()
              if line.strip() and not line.startswith("#")]
    assert wanted and all(name in pins for name in wanted), sorted(set(wanted) - set(pins))
    assert not any(name in pins for name in ("torch", "transformers", "accelerate")), "the lock pulls in training"


def test_pr_code_gets_no_write_token_and_never_the_attestor_credential() -> None:
    """Issue 19 items 1 and 6: the training job's token can only read; the attestor's MLflow
    credential lives only in the trusted attest job (environment `provenance`) and promotion."""
    workflow = yaml.safe_load((WORKFLOWS / "experiment-train.yml").read_text(encoding="utf-8"))
    train = workflow["jobs"]["train"]
    assert {k: v for k, v in train["permissions"].items() if k != "id-token"} == {
        k: "read" for k in train["permissions"] if k != "id-token"}
    assert train["permissions"]["id-token"] == "write"  # an OIDC token of itself: no repository write
    text = yaml.safe_dump(train)
    assert "ATTESTOR" not in text and "MLFLOW_TRACKING_TOKEN" not in text
    pr_steps = train["steps"][3:]
    assert all("github.token" not in yaml.safe_dump(st) for st in pr_steps), "no token handed to PR code"
    attest = workflow["jobs"]["attest"]
    assert attest["environment"] == "provenance" and "self-hosted" not in runs_on_labels(attest)
    assert attest["permissions"] == {"contents": "read"}
    refs = [st.get("with", {}).get("ref") for st in attest["steps"] if "checkout" in str(st.get("uses", ""))]
    assert refs == ["${{ github.event.repository.default_branch }}"]
    assert "pipeline attest" in yaml.safe_dump(attest) and "MLFLOW_ATTESTOR_PASSWORD" in yaml.safe_dump(attest)
    promote = yaml.safe_load((WORKFLOWS / "experiment-promote.yml").read_text(encoding="utf-8"))
    assert "MLFLOW_ATTESTOR_PASSWORD" in yaml.safe_dump(promote) and "TRAINER" not in yaml.safe_dump(promote)
    # Issue 36: the plan (a read of the trusted registry) and the report's attested headline
    # read with the reader's login (`provenance-read`); only attest holds the attestor's.
    for name, job in workflow["jobs"].items():
        if name in ("plan", "report"):
            assert job["environment"] == "provenance-read" and "self-hosted" not in runs_on_labels(job), name
            assert "make setup-train" not in yaml.safe_dump(job) and "ATTESTOR" not in yaml.safe_dump(job), name
            assert "MLFLOW_READER_PASSWORD" in yaml.safe_dump(job), name
        elif name == "attest":
            assert job["environment"] == "provenance" and "self-hosted" not in runs_on_labels(job), name
        else:
            assert "ATTESTOR" not in yaml.safe_dump(job), name
        # The MLflow admin credential: only the per-job credential broker and its cleanup.
        if name not in ("job-identity", "revoke-identity"):
            assert "MLFLOW_ADMIN" not in yaml.safe_dump(job), name
        else:
            assert job["environment"] == "job-identity" and "self-hosted" not in runs_on_labels(job), name


def test_matrix_comment_writers_never_share_one_pending_slot() -> None:
    """Issue 19 item 5: GitHub keeps one pending job per concurrency group, so jobs of a matrix
    over experiments that share a per-PR group drop each other's writes. Every matrix job that
    has a group keys it by the experiment too."""
    for path in sorted(WORKFLOWS.glob("*.yml")):
        workflow = yaml.safe_load(path.read_text(encoding="utf-8"))
        for name, job in workflow["jobs"].items():
            matrix = (job.get("strategy") or {}).get("matrix") or {}
            group = (job.get("concurrency") or {}).get("group") if isinstance(job.get("concurrency"), dict) else None
            if group and "experiment" in matrix:
                assert "matrix.experiment" in group, f"{path.name}:{name} group {group}"
