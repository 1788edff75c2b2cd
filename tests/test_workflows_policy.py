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

REPO = Path(__file__).resolve().parents[1]
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
            if level == "write" and scope not in {"pull-requests", "issues"}:
                problems.append(f"{where}: {scope}: write is broader than any job here needs")

        job_text = yaml.safe_dump(job)
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


@pytest.mark.unit
def test_the_expected_workflows_exist() -> None:
    names = {p.stem for p in workflow_files()}
    assert {"ci", "experiment-pr", "experiment-comment", "experiment-train", "experiment-promote"} <= names


@pytest.mark.unit
@pytest.mark.parametrize("path", workflow_files(), ids=lambda p: p.name)
def test_workflow_follows_the_security_policy(path: Path) -> None:
    assert policy_violations(path.stem, path.read_text(encoding="utf-8")) == []


@pytest.mark.unit
def test_pr_workflow_is_read_only_and_cancels_superseded_runs() -> None:
    workflow = yaml.safe_load((WORKFLOWS / "experiment-pr.yml").read_text(encoding="utf-8"))
    assert set(triggers(workflow)) == {"pull_request"}
    assert triggers(workflow)["pull_request"]["paths"] == ["experiments/**"]
    assert workflow["concurrency"]["cancel-in-progress"] is True
    assert "pull_request.number" in workflow["concurrency"]["group"]
    for job in workflow["jobs"].values():
        assert job["permissions"] == {"contents": "read"}
        assert "self-hosted" not in runs_on_labels(job)
        assert "secrets." not in yaml.safe_dump(job)
        assert any("upload-artifact@" in str(step.get("uses", "")) for step in job["steps"])


@pytest.mark.unit
def test_comment_workflow_never_checks_out_or_runs_pr_code() -> None:
    workflow = yaml.safe_load((WORKFLOWS / "experiment-comment.yml").read_text(encoding="utf-8"))
    assert triggers(workflow)["workflow_run"]["workflows"] == ["experiment-pr"]
    (job,) = workflow["jobs"].values()
    checkouts = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/checkout@")]
    assert [s["with"]["ref"] for s in checkouts] == ["${{ github.event.repository.default_branch }}"]
    download = next(s for s in job["steps"] if "download-artifact@" in str(s.get("uses", "")))
    assert download["with"]["run-id"] == "${{ github.event.workflow_run.id }}"
    assert "github-token" in download["with"]
    runs = "\n".join(str(s.get("run", "")) for s in job["steps"])
    # The bundle is verified (integer PR, head SHA via the API) before anything is posted.
    assert runs.index("result_bundle.py verify") < runs.index("pipeline comment")


@pytest.mark.unit
def test_train_job_runs_only_the_approved_sha_on_gated_self_hosted_runners() -> None:
    workflow = yaml.safe_load((WORKFLOWS / "experiment-train.yml").read_text(encoding="utf-8"))
    assert {"issue_comment", "pull_request", "workflow_dispatch"} == set(triggers(workflow))
    train = workflow["jobs"]["train"]
    assert runs_on_labels(train) == ["self-hosted", "gpu"]
    assert train["environment"] == "gpu-training"
    assert train["needs"] == "authorize"
    assert "needs.authorize.outputs.launch == 'true'" in train["if"]
    checkout = train["steps"][0]
    assert checkout["with"] == {"ref": "${{ needs.authorize.outputs.sha }}", "persist-credentials": False}
    authorize = workflow["jobs"]["authorize"]
    assert "self-hosted" not in runs_on_labels(authorize)
    assert "secrets." not in yaml.safe_dump(authorize)
    assert "pipeline chatops" in yaml.safe_dump(authorize)


@pytest.mark.unit
def test_promotion_runs_on_merge_in_its_environment() -> None:
    workflow = yaml.safe_load((WORKFLOWS / "experiment-promote.yml").read_text(encoding="utf-8"))
    assert triggers(workflow)["pull_request"]["types"] == ["closed"]
    job = workflow["jobs"]["promote"]
    assert job["if"] == "github.event.pull_request.merged == true"
    assert job["environment"] == "promotion"
    assert "pipeline promote" in yaml.safe_dump(job)


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


@pytest.mark.unit
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


@pytest.mark.unit
@pytest.mark.parametrize(
    "mutation",
    [
        ("runs-on: [self-hosted, gpu] # zizmor", "runs-on: [self-hosted, gpu]\n    # zizmor"),
        ("    environment: gpu-training\n", ""),
        ("needs.authorize.outputs.launch == 'true' &&", "true &&"),
        (
            "github.event_name != 'pull_request' || github.event.pull_request.head.repo.full_name == github.repository",
            "true",
        ),
    ],
    ids=["unchanged-control", "no-environment", "no-authorize-gate", "no-fork-guard"],
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


@pytest.mark.unit
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


@pytest.mark.unit
def test_cancel_joins_the_train_jobs_concurrency_group_without_any_permission() -> None:
    """`/cancel` works by entering the running train job's concurrency group with
    cancel-in-progress; the cancel job itself needs no token and no self-hosted runner."""
    import yaml as _yaml

    wf = _yaml.safe_load((Path(__file__).resolve().parents[1] / ".github/workflows/experiment-train.yml").read_text())
    cancel, train = wf["jobs"]["cancel"], wf["jobs"]["train"]
    assert cancel["concurrency"]["group"] == train["concurrency"]["group"]
    assert cancel["concurrency"]["cancel-in-progress"] is True and train["concurrency"]["cancel-in-progress"] is False
    assert cancel["permissions"] == {} and cancel["runs-on"] == "ubuntu-latest"
    assert "needs.authorize.outputs.action == 'cancel'" in cancel["if"]
