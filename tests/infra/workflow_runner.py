"""An emulated GitHub Actions runner, kept for the one thing nektos/act cannot do.

The workflows are run by a real engine, nektos/act, in tests/e2e/test_workflows_act.py. act
hands every job of a run the same GITHUB_TOKEN, while GitHub mints one per job; the
scenario "the training job's token expired, the report job's fresh one still works"
(issue 14, item 3) needs per-job tokens (`WorkflowRunner.job_tokens`), so it runs here
(tests/e2e/test_workflows_run.py). Everything else this runner used to prove (PR checks,
the bundle hand-off, /train from writers and readers, /cancel, capacity, promotion) is
now proven under act, and those tests were removed from here.

What it emulates, enough for that scenario: each job runs in its own clone of a test
repository, with the files and variables a real runner provides (GITHUB_EVENT_PATH,
GITHUB_OUTPUT, GITHUB_ENV, GITHUB_STEP_SUMMARY, GITHUB_REPOSITORY, GITHUB_SHA,
GITHUB_WORKSPACE, RUNNER_TEMP, GITHUB_API_URL pointing at the GitHub emulator), steps run
by `bash --noprofile --norc -eo pipefail` like `shell: bash`.

Supported expressions (`${{ }}` in env, with, if, outputs, run): the contexts
github (from the payload and the run), env, steps.<id>.outputs/outcome,
needs.<job>.outputs, inputs, vars, secrets, runner.temp; literals; == != && || !
and parentheses; startsWith, endsWith, contains, format, toJSON, fromJSON, success,
failure, always, cancelled; `strategy.matrix` (every combination of its lists).
An `if:` without a status function gets an implicit `success() &&`, like GitHub.

Emulated `uses:` (anything else is an error, so a new action cannot slip by untested):
  actions/checkout           `git checkout` of `with.ref` (default: the event's SHA)
                             in the job's fresh clone
  actions/setup-python       no-op (the test venv's Python is used)
  actions/upload-artifact    copy `path` into the run's artifact store
  actions/download-artifact  copy an artifact of the run named by `run-id` to `path`

Environments (`environment:`) are treated as approved: the test plays the reviewer. Secrets
are scoped as on GitHub: a job sees the repository's `secrets` and those of its own
`environment:` only (`env_secrets`). A job with `permissions: id-token: write` gets
`ACTIONS_ID_TOKEN_REQUEST_URL`/`_TOKEN` from the emulated OIDC issuer (tests/infra/oidc_issuer.py,
when one is given), minting tokens with the job's claims until the job ends. Each step's log
starts with its `env:` as the Actions runner prints it (registered secrets shown as `***`, every
other value as it is: an output copied into `env:` is printed in clear).
Job-level `concurrency` and `timeout-minutes` are not emulated (act ignores them too).

Substitution, documented: for the steps `make setup`, `make setup-github` and `make
setup-train` the job's `.venv` is first linked to the already installed project venv (no
pip install), then the step runs as written: the checked-out Makefile's target runs for real
(it finds the install stamp and installs nothing), so a pull request's own Makefile is PR
code at install time as on a real runner. PYTHONPATH puts the clone first, so
`.venv/bin/pipeline` runs the clone's code.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PROJECT = Path(__file__).resolve().parents[2]
VENV = PROJECT / ".venv"


# --------------------------------------------------------------------------- expressions

_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>-?\d+(?:\.\d+)?)|(?P<op>==|!=|&&|\|\||<=|>=|[!()<>,\[\]])"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_\-]*(?:\.[A-Za-z0-9_\-*]+|\[[^\]]+\])*))"
)


class ExpressionError(Exception):
    pass


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ExpressionError(f"cannot parse {text[pos:]!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _truthy(v: Any) -> bool:
    return v not in (None, False, 0, "", {}) and v != []


def _as_text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return str(v)


class _Parser:
    def __init__(self, text: str, lookup, status: dict[str, bool]):
        self.toks = _tokens(text)
        self.i = 0
        self.lookup = lookup
        self.status = status

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def parse(self) -> Any:
        value = self.or_()
        if self.i != len(self.toks):
            raise ExpressionError(f"trailing tokens {self.toks[self.i:]}")
        return value

    def or_(self) -> Any:
        left = self.and_()
        while self.peek() == "||":
            self.take()
            right = self.and_()
            left = left if _truthy(left) else right
        return left

    def and_(self) -> Any:
        left = self.cmp()
        while self.peek() == "&&":
            self.take()
            right = self.cmp()
            left = right if _truthy(left) else left
        return left

    def cmp(self) -> Any:
        left = self.unary()
        while self.peek() in ("==", "!=", "<", ">", "<=", ">="):
            op = self.take()[1]
            right = self.unary()
            a, b = left, right
            if isinstance(a, str) and isinstance(b, str):
                a, b = a.lower(), b.lower()
            elif type(a) is not type(b):  # GitHub coerces mismatched types to numbers
                a, b = _number(a), _number(b)
            if op in ("==", "!="):
                left = (a == b) == (op == "==")
            else:
                left = {"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op] if a is not None and b is not None else False
        return left

    def unary(self) -> Any:
        if self.peek() == "!":
            self.take()
            return not _truthy(self.unary())
        return self.atom()

    def atom(self) -> Any:
        kind, text = self.take()
        if text == "(":
            value = self.or_()
            assert self.take()[1] == ")"
            return value
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if kind == "num":
            return float(text) if "." in text else int(text)
        if text in ("true", "false"):
            return text == "true"
        if text == "null":
            return None
        if self.peek() == "(":
            self.take()
            args = []
            while self.peek() != ")":
                args.append(self.or_())
                if self.peek() == ",":
                    self.take()
            self.take()
            return self.call(text, args)
        return self.lookup(text)

    def call(self, name: str, args: list[Any]) -> Any:
        low = name.lower()
        if low in ("success", "failure", "always", "cancelled"):
            return {"success": not self.status["failed"], "failure": self.status["failed"], "always": True,
                    "cancelled": False}[low]
        if low == "startswith":
            return _as_text(args[0]).lower().startswith(_as_text(args[1]).lower())
        if low == "endswith":
            return _as_text(args[0]).lower().endswith(_as_text(args[1]).lower())
        if low == "contains":
            hay = args[0]
            if isinstance(hay, list):
                return any(_as_text(x).lower() == _as_text(args[1]).lower() for x in hay)
            return _as_text(args[1]).lower() in _as_text(hay).lower()
        if low == "format":
            return re.sub(r"\{(\d+)\}", lambda m: _as_text(args[int(m.group(1)) + 1]), _as_text(args[0]))
        if low == "tojson":
            return json.dumps(args[0])
        if low == "fromjson":
            return json.loads(_as_text(args[0]))
        raise ExpressionError(f"function {name}() is not emulated")


def _number(v: Any) -> float:
    if v is None or v == "":
        return 0.0
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


STATUS_FUNCTIONS = re.compile(r"\b(success|failure|always|cancelled)\s*\(", re.I)
EXPR = re.compile(r"\$\{\{(.*?)\}\}", re.S)


# --------------------------------------------------------------------------- runner


@dataclass
class StepResult:
    name: str
    outcome: str  # success | failure | skipped
    outputs: dict[str, str] = field(default_factory=dict)
    log: str = ""


@dataclass
class JobResult:
    job: str
    result: str  # success | failure | skipped
    outputs: dict[str, str] = field(default_factory=dict)
    steps: list[StepResult] = field(default_factory=list)
    workspace: Path | None = None
    summary: str = ""

    def log(self) -> str:
        return "\n".join(f"--- {s.name}: {s.outcome}\n{s.log}" for s in self.steps)


@dataclass
class EmulatedRepository:
    """A git repository standing in for the GitHub repository ("origin"), with a
    `default_branch` built from the project's working tree (tracked and untracked,
    not ignored: what a commit of the current work would contain)."""

    path: Path
    full_name: str
    default_branch: str = "main"

    @classmethod
    def from_working_tree(cls, dest: Path, full_name: str) -> EmulatedRepository:
        files = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=PROJECT, capture_output=True, check=True,
        ).stdout.decode().split("\0")
        for rel in filter(None, files):
            src = PROJECT / rel
            if src.is_file() and not src.is_symlink():
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target)
        repo = cls(dest, full_name)
        repo.git("init", "-q", "-b", repo.default_branch)
        repo.git("add", "-A")
        repo.commit("Base: the project as it is being tested")
        return repo

    def git(self, *args: str, cwd: Path | None = None) -> str:
        env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
        return subprocess.run(["git", *args], cwd=cwd or self.path, capture_output=True, text=True, check=True,
                              env=env).stdout.strip()

    def commit(self, message: str) -> str:
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD")

    def head(self, ref: str = "HEAD") -> str:
        return self.git("rev-parse", ref)


class WorkflowRunner:
    """Runs jobs of one repository's workflows against the GitHub emulator."""

    def __init__(self, repo: EmulatedRepository, work: Path, api_url: str, token: str,
                 extra_env: dict[str, str] | None = None, vars: dict[str, str] | None = None,
                 secrets: dict[str, str] | None = None, env_secrets: dict[str, dict[str, str]] | None = None,
                 oidc: Any = None):
        self.repo = repo
        self.work = work
        self.api_url = api_url
        self.token = token
        self.extra_env = extra_env or {}
        self.vars = vars or {}
        self.secrets = secrets or {}
        self.env_secrets = env_secrets or {}
        self.oidc = oidc
        # GitHub mints one GITHUB_TOKEN per job: a test may give a job its own (e.g. one
        # the emulator expires, as after 24 h of training).
        self.job_tokens: dict[str, str] = {}
        self.artifacts: dict[tuple[int, str], Path] = {}
        self._runs = 0
        self._steps_run = 0

    # ----------------------------------------------------------------- public

    def run_workflow(self, workflow: str, event_name: str, payload: dict[str, Any], *, sha: str,
                     ref: str | None = None, inputs: dict[str, Any] | None = None,
                     run_id: int | None = None, only: set[str] | None = None,
                     attempt: int = 1) -> dict[str, JobResult]:
        """Every job of `.github/workflows/<workflow>`, in `needs` order (or only the jobs in `only`)."""
        self._runs += 1
        run_id = run_id or 9000 + self._runs
        doc = yaml.safe_load((self.repo.path / ".github" / "workflows" / workflow).read_text(encoding="utf-8"))
        results: dict[str, JobResult] = {}
        pending = dict(doc["jobs"])
        while pending:
            ready = [j for j, spec in pending.items() if all(n in results for n in _needs(spec))]
            assert ready, f"cycle in needs: {list(pending)}"
            for job_id in ready:
                spec = pending.pop(job_id)
                if only is not None and job_id not in only:
                    results[job_id] = JobResult(job_id, "skipped")
                    continue
                results[job_id] = self._run_job(doc, job_id, spec, event_name, payload, sha, ref, inputs or {},
                                                run_id, results, workflow, attempt)
        return results

    # ----------------------------------------------------------------- internals

    def _github_context(self, event_name: str, payload: dict[str, Any], sha: str, ref: str | None,
                        run_id: int, attempt: int = 1) -> dict[str, Any]:
        return {
            "event_name": event_name, "event": payload, "sha": sha,
            "ref": ref or f"refs/heads/{self.repo.default_branch}",
            "repository": self.repo.full_name, "repository_owner": self.repo.full_name.split("/")[0],
            "run_id": str(run_id), "run_number": "1", "run_attempt": str(attempt),
            "server_url": "https://github.invalid", "api_url": self.api_url, "token": self.token,
            "actor": (payload.get("sender") or {}).get("login", "emulated"),
            "workflow": "emulated", "head_ref": "", "base_ref": "",
        }

    def _run_job(self, doc: dict, job_id: str, spec: dict, event_name: str, payload: dict, sha: str,
                 ref: str | None, inputs: dict, run_id: int, done: dict[str, JobResult], workflow: str = "",
                 attempt: int = 1) -> JobResult:
        needs = {n: {"outputs": done[n].outputs, "result": done[n].result} for n in _needs(spec)}
        github = self._github_context(event_name, payload, sha, ref, run_id, attempt)
        github["workflow_file"] = workflow
        token = self.job_tokens.get(job_id, self.token)
        github["token"] = token
        root = self.work / f"run{run_id}-{job_id}"
        temp = root / "_temp"
        temp.mkdir(parents=True)
        workspace = root / "workspace"
        self.repo.git("clone", "-q", str(self.repo.path), str(workspace), cwd=self.work)
        self.repo.git("checkout", "-q", "--detach", sha, cwd=workspace)
        event_path = temp / "event.json"
        event_path.write_text(json.dumps(payload), encoding="utf-8")
        summary = temp / "step_summary.md"
        summary.touch()
        env_file = temp / "github_env"
        env_file.touch()

        environment = spec.get("environment")
        environment = environment.get("name") if isinstance(environment, dict) else environment
        secrets = {**self.secrets, **self.env_secrets.get(str(environment or ""), {})}
        ctx: dict[str, Any] = {"github": github, "needs": needs, "inputs": inputs, "vars": self.vars,
                               "secrets": {**secrets, "GITHUB_TOKEN": token},
                               "runner": {"temp": str(temp), "os": "Linux", "arch": "X64"},
                               "steps": {}, "env": {}, "job": {"status": "success"}}
        status = {"failed": any(n["result"] != "success" for n in needs.values())}
        result = JobResult(job_id, "skipped", workspace=workspace)
        if not self._condition(spec.get("if"), ctx, status):
            return result

        matrix = (spec.get("strategy") or {}).get("matrix")
        if matrix is None:
            return self._run_instance(doc, spec, ctx, status, result, root, temp, workspace, event_path,
                                      summary, env_file, event_name, github, run_id)
        axes = {key: self._evaluate_value(value, ctx) for key, value in matrix.items()}
        combos = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
        if not combos:
            result.result = "failure"
            result.steps.append(StepResult("strategy", "failure", log="empty matrix"))
            return result
        instances = []
        for combo in combos:
            instance = JobResult(job_id, "skipped", workspace=workspace)
            instances.append(self._run_instance(doc, spec, {**ctx, "matrix": combo, "steps": {}}, dict(status),
                                                instance, root, temp, workspace, event_path, summary, env_file,
                                                event_name, github, run_id))
        result.result = "failure" if any(i.result == "failure" for i in instances) else "success"
        result.steps = [s for i in instances for s in i.steps]
        result.outputs = instances[-1].outputs
        result.summary = summary.read_text(encoding="utf-8")
        return result

    def _evaluate_value(self, value: Any, ctx: dict) -> Any:
        m = EXPR.fullmatch(value.strip()) if isinstance(value, str) else None
        return self.evaluate(m.group(1), ctx) if m else value

    def _run_instance(self, doc: dict, spec: dict, ctx: dict, status: dict[str, bool], result: JobResult,
                      root: Path, temp: Path, workspace: Path, event_path: Path, summary: Path, env_file: Path,
                      event_name: str, github: dict, run_id: int) -> JobResult:
        job_id = result.job
        ctx["env"] = {**self._interpolate_map(doc.get("env"), ctx), **self._interpolate_map(spec.get("env"), ctx)}
        base_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", str(root)),
            "LANG": "C.UTF-8", "CI": "true", "GITHUB_ACTIONS": "true",
            "GITHUB_EVENT_NAME": event_name, "GITHUB_EVENT_PATH": str(event_path),
            "GITHUB_REPOSITORY": self.repo.full_name, "GITHUB_SHA": github["sha"], "GITHUB_REF": github["ref"],
            "GITHUB_WORKSPACE": str(workspace), "GITHUB_STEP_SUMMARY": str(summary),
            "GITHUB_ENV": str(env_file), "GITHUB_API_URL": self.api_url, "GITHUB_SERVER_URL": github["server_url"],
            "GITHUB_RUN_ID": str(run_id), "GITHUB_RUN_ATTEMPT": github["run_attempt"], "GITHUB_JOB": job_id,
            "RUNNER_TEMP": str(temp),
            "RUNNER_OS": "Linux", "PYTHONPATH": str(workspace), **self.extra_env,
        }
        request_token = None
        if self.oidc is not None and (spec.get("permissions") or {}).get("id-token") == "write":
            environment = spec.get("environment")
            url, request_token = self.oidc.register_job({
                "repository": self.repo.full_name, "repository_owner": self.repo.full_name.split("/")[0],
                "run_id": str(run_id), "run_attempt": github["run_attempt"], "sha": github["sha"],
                "ref": github["ref"], "event_name": github["event_name"], "actor": github["actor"],
                "environment": str(environment or ""), "runner_environment": "self-hosted",
                "workflow_ref": f"{self.repo.full_name}/.github/workflows/{github['workflow_file']}@{github['ref']}",
                "job_workflow_ref": f"{self.repo.full_name}/.github/workflows/{github['workflow_file']}@{github['ref']}",
            })
            base_env |= {"ACTIONS_ID_TOKEN_REQUEST_URL": url, "ACTIONS_ID_TOKEN_REQUEST_TOKEN": request_token}
        masked = [v for v in ctx["secrets"].values() if v]
        failed = status["failed"]
        for index, step in enumerate(spec.get("steps", [])):
            name = step.get("name") or step.get("uses") or step.get("run", "").splitlines()[0]
            status["failed"] = failed
            if not self._condition(step.get("if"), ctx, status):
                result.steps.append(StepResult(name, "skipped"))
                if "id" in step:
                    ctx["steps"][step["id"]] = {"outputs": {}, "outcome": "skipped", "conclusion": "skipped"}
                continue
            declared = {**ctx["env"], **self._interpolate_map(step.get("env"), {**ctx, "env": ctx["env"]})}
            step_env = {**base_env, **ctx["env"], **_read_env_file(env_file), **declared}
            outcome, outputs, log = self._run_step(step, ctx, step_env, workspace, temp, run_id, index)
            log = _printed_env(declared, masked) + log
            result.steps.append(StepResult(name, outcome, outputs, log))
            if "id" in step:
                ctx["steps"][step["id"]] = {"outputs": outputs, "outcome": outcome, "conclusion": outcome}
            if outcome == "failure" and not step.get("continue-on-error"):
                failed = True
        if request_token is not None:
            self.oidc.revoke_job(request_token)
        result.result = "failure" if failed else "success"
        ctx["job"]["status"] = result.result
        result.outputs = {k: _as_text(self._interpolate(v, ctx)) for k, v in (spec.get("outputs") or {}).items()}
        result.summary = summary.read_text(encoding="utf-8")
        return result

    def _run_step(self, step: dict, ctx: dict, env: dict[str, str], workspace: Path, temp: Path, run_id: int,
                  index: int) -> tuple[str, dict[str, str], str]:
        if "uses" in step:
            with_ = self._interpolate_map(step.get("with"), ctx)
            return self._uses(step["uses"], with_, workspace, run_id)
        script = self._interpolate(step["run"], ctx)
        if script.strip() in ("make setup", "make setup-github", "make setup-train"):
            # Documented substitution: the installed venv instead of a pip install; then the
            # checked-out Makefile's target runs as written (a PR's Makefile is PR code).
            link = workspace / ".venv"
            if not link.exists():
                link.symlink_to(VENV, target_is_directory=True)
        self._steps_run += 1  # unique files per step, also across matrix instances
        output_file = temp / f"output_{self._steps_run}"
        output_file.touch()
        script_file = temp / f"step_{self._steps_run}.sh"
        script_file.write_text(script, encoding="utf-8")
        cwd = workspace / step.get("working-directory", "")
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script_file)],
                              cwd=cwd, env={**env, "GITHUB_OUTPUT": str(output_file)}, capture_output=True,
                              text=True, timeout=int(step.get("timeout-minutes", 20)) * 60)
        outputs = _read_env_file(output_file)
        return ("success" if proc.returncode == 0 else "failure"), outputs, proc.stdout + proc.stderr

    def _uses(self, uses: str, with_: dict[str, str], workspace: Path, run_id: int) -> tuple[str, dict, str]:
        action = uses.split("@", 1)[0]
        if action == "actions/checkout":
            ref = with_.get("ref")
            target = workspace
            if with_.get("path"):
                target = workspace / with_["path"]
                self.repo.git("clone", "-q", str(self.repo.path), str(target), cwd=self.work)
            if ref:
                self.repo.git("checkout", "-q", "--detach", ref if re.fullmatch(r"[0-9a-f]{40}", ref)
                              else f"origin/{ref}", cwd=target)
            head = self.repo.git("rev-parse", "HEAD", cwd=target)
            return "success", {}, f"checkout {ref or '(event sha)'} at {head} in {target.name}"
        if action == "actions/setup-python":
            return "success", {}, "setup-python: no-op (emulated)"
        if action == "actions/upload-artifact":
            src = Path(with_["path"])
            if not src.is_absolute():
                src = workspace / src
            if not src.exists():
                if with_.get("if-no-files-found") == "ignore":
                    return "success", {}, f"upload-artifact: {src} does not exist (ignored)"
                return "failure", {}, f"upload-artifact: {src} does not exist"
            store = self.work / "artifacts" / f"{run_id}-{with_['name']}"
            shutil.copytree(src, store)
            self.artifacts[(run_id, with_["name"])] = store
            return "success", {}, f"uploaded {with_['name']}"
        if action == "actions/download-artifact":
            source_run = int(with_.get("run-id") or run_id)
            if "run-id" in with_ and not with_.get("github-token"):
                return "failure", {}, "download-artifact: run-id needs github-token"
            store = self.artifacts.get((source_run, with_["name"]))
            if store is None:
                return "failure", {}, f"download-artifact: no artifact {with_['name']} in run {source_run}"
            dest = Path(with_.get("path") or workspace)
            shutil.copytree(store, dest, dirs_exist_ok=True)
            return "success", {}, f"downloaded {with_['name']} to {dest}"
        raise AssertionError(f"`uses: {uses}` is not emulated; add it to tests/infra/workflow_runner.py")

    # ----------------------------------------------------------------- expressions

    def _lookup(self, ctx: dict[str, Any]):
        def lookup(path: str) -> Any:
            parts = re.findall(r"[^.\[\]]+", path)
            value: Any = ctx
            for part in parts:
                part = part.strip("'\"")
                if isinstance(value, dict):
                    value = value.get(part)
                elif isinstance(value, list) and part.isdigit():
                    value = value[int(part)] if int(part) < len(value) else None
                else:
                    return None
            return value
        return lookup

    def evaluate(self, expression: str, ctx: dict[str, Any], status: dict[str, bool] | None = None) -> Any:
        return _Parser(expression, self._lookup(ctx), status or {"failed": False}).parse()

    def _condition(self, condition: Any, ctx: dict, status: dict[str, bool]) -> bool:
        if condition is None:
            return not status["failed"]
        if isinstance(condition, bool):
            return condition and not status["failed"]
        text = str(condition).strip()
        m = EXPR.fullmatch(text)
        if m:
            text = m.group(1)
        if not STATUS_FUNCTIONS.search(text):
            text = f"success() && ({text})"
        return _truthy(self.evaluate(text, ctx, status))

    def _interpolate(self, value: Any, ctx: dict) -> Any:
        if not isinstance(value, str):
            return value
        return EXPR.sub(lambda m: _as_text(self.evaluate(m.group(1), ctx)), value)

    def _interpolate_map(self, mapping: dict | None, ctx: dict) -> dict[str, str]:
        return {str(k): _as_text(self._interpolate(v, ctx)) for k, v in (mapping or {}).items()}


def _printed_env(declared: dict[str, str], masked: list[str]) -> str:
    """The `env:` block the Actions runner prints at the top of a step's log: every value in
    clear except the registered secrets' (`***`)."""
    if not declared:
        return ""
    lines = []
    for key, value in declared.items():
        for secret in sorted(masked, key=len, reverse=True):
            value = value.replace(secret, "***")
        lines.append(f"  {key}: {value}")
    return "env:\n" + "\n".join(lines) + "\n"


def _needs(spec: dict) -> list[str]:
    needs = spec.get("needs", [])
    return [needs] if isinstance(needs, str) else list(needs)


def _read_env_file(path: Path) -> dict[str, str]:
    """Parse GITHUB_OUTPUT / GITHUB_ENV: `k=v` lines and `k<<DELIM` ... `DELIM` blocks."""
    values: dict[str, str] = {}
    if not path.exists():
        return values
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, delim = line.split("<<", 1)
            block = []
            i += 1
            while i < len(lines) and lines[i] != delim:
                block.append(lines[i])
                i += 1
            values[key] = "\n".join(block)
        elif "=" in line:
            key, value = line.split("=", 1)
            values[key] = value
        i += 1
    return values
