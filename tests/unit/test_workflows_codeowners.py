"""CODEOWNERS covers every path a privileged job executes (issue 19 item 4).

Privileged jobs run the default branch's code with a secret, an environment, a write
permission or a self-hosted runner. What they execute is derived here from the workflows
themselves, not listed by hand: `make <target>` (the Makefile, and what the recipe installs
from), `.venv/bin/pipeline` (the installed packages and every repository package they import,
followed through the source with `ast`), `python3 <script>` and any repository file a `run:`
names, local actions. A new path a privileged job starts to run, with no code owner, fails
this test.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def privileged(job: dict) -> bool:
    perms = job.get("permissions") or {}
    writes = isinstance(perms, dict) and any(v == "write" for v in perms.values())
    labels = job.get("runs-on")
    self_hosted = "self-hosted" in (labels if isinstance(labels, list) else [str(labels)])
    return bool(job.get("environment")) or writes or self_hosted or "secrets." in yaml.safe_dump(job)


def top_packages() -> set[str]:
    return {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}


def imported_packages(files: list[Path], known: set[str]) -> set[str]:
    out: set[str] = set()
    for f in files:
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            out |= {n.split(".")[0] for n in names if n.split(".")[0] in known}
    return out


@functools.cache
def package_closure(seeds: frozenset[str]) -> set[str]:
    known, done, todo = top_packages(), set(), set(seeds)
    while todo:
        pkg = todo.pop()
        done.add(pkg)
        todo |= imported_packages(sorted((ROOT / pkg).rglob("*.py")), known) - done
    return done


def makefile_paths(target: str) -> set[str]:
    """The Makefile and the repository files its target's recipe names (`-e .` is pyproject.toml)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n|.*\\\n)*)", text, re.M)
    recipe = m.group(1) if m else ""
    paths = {"Makefile"} | {t for t in re.findall(r"[\w./-]+", recipe) if (ROOT / t).is_file()}
    if re.search(r"-e \.|-e \"\.", recipe):
        paths.add("pyproject.toml")
    return paths


def executed_paths() -> dict[str, set[str]]:
    """path -> the workflow jobs that execute it."""
    found: dict[str, set[str]] = {}
    for wf in sorted(WORKFLOWS.glob("*.yml")):
        workflow = yaml.safe_load(wf.read_text(encoding="utf-8"))
        for name, job in (workflow.get("jobs") or {}).items():
            if not privileged(job):
                continue
            where = f"{wf.name}:{name}"
            for step in job.get("steps") or []:
                uses = str(step.get("uses", ""))
                if uses.startswith("./"):
                    found.setdefault(uses[2:].rstrip("/") + "/", set()).add(where)
                run = str(step.get("run", ""))
                paths: set[str] = set()
                seeds: set[str] = set()
                for target in re.findall(r"\bmake\s+([\w-]+)", run):
                    paths |= makefile_paths(target)
                if ".venv/bin/pipeline" in run:
                    seeds.add("pipelines")
                    paths.add("pyproject.toml")
                for mod in re.findall(r"\bfrom\s+([a-z_]+)[.\w]*\s+import", run):
                    if mod in top_packages():
                        seeds.add(mod)
                paths |= {t for t in re.findall(r"[\w.][\w./-]*", run)
                          if "/" in t and not t.startswith(".venv/") and (ROOT / t).is_file()}
                for p in paths:
                    found.setdefault(p, set()).add(where)
                for pkg in package_closure(frozenset(seeds & top_packages())):
                    found.setdefault(pkg + "/", set()).add(where)
    return found


def codeowners_patterns() -> list[str]:
    text = (ROOT / ".github" / "CODEOWNERS").read_text(encoding="utf-8")
    return [line.split()[0] for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#") and len(line.split()) >= 2]


def covered(path: str, patterns: list[str]) -> bool:
    """gitignore-style, as CODEOWNERS: `/x/` a folder at the root, `/x` a root file, `x` anywhere."""
    for pattern in patterns:
        anchored = pattern.startswith("/")
        pat = pattern.strip("/")
        candidates = [path.rstrip("/")] if anchored else [path.rstrip("/").split("/", i)[-1]
                                                           for i in range(path.count("/") + 1)]
        for c in candidates:
            if fnmatch.fnmatch(c, pat) or c.startswith(pat + "/"):
                return True
    return False


def test_every_path_a_privileged_job_executes_has_a_code_owner() -> None:
    found = executed_paths()
    # The derivation itself finds what the review named (else it proves nothing).
    for expected in ("Makefile", "constraints/github-jobs.lock", "pyproject.toml", "pipelines/", "validation/",
                     ".github/scripts/command_filter.py", ".github/scripts/train_gate.py"):
        assert expected in found, f"derivation lost {expected}"
    patterns = codeowners_patterns()
    missing = {p: sorted(jobs) for p, jobs in found.items() if not covered(p, patterns)}
    assert not missing, f"no code owner for paths privileged jobs execute: {missing}"


def test_the_matcher_reads_codeowners_like_github() -> None:
    assert covered("pipelines/", ["/pipelines/"]) and covered("pipelines/github/x.py", ["/pipelines/"])
    assert covered("Makefile", ["/Makefile"]) and not covered("docs/Makefile", ["/Makefile"])
    assert covered("docs/Makefile", ["Makefile"])
    assert not covered("validation/", ["/experiments/", "/.github/"])
