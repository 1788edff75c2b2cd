"""Identity: the code version (from git, or hashed content without it) and the run identity,
the pieces `pipeline run` is built from."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipelines.identity import RunIdentity, code_version, experiment_key


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture()
def git_repo(tmp_path: Path) -> Path:
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "loop.py").write_text("STEP = 1\n")
    (tmp_path / "validation").mkdir()
    (tmp_path / "validation" / "spec.py").write_text("X = 1\n")
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "a.yaml").write_text("name: a\n")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "-c", "user.email=a@b", "-c", "user.name=a", "add", "-A")
    _git(tmp_path, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "init")
    return tmp_path


def test_code_version_ignores_experiment_files_but_not_trainer_code(git_repo: Path) -> None:
    clean = code_version(git_repo)
    assert not clean.dirty and len(clean.git_sha) == 40

    # A PR that only adds an experiment moves the commit but not the code version:
    # the baseline trained before stays reusable.
    (git_repo / "experiments" / "b.yaml").write_text("name: b\n")
    _git(git_repo, "-c", "user.email=a@b", "-c", "user.name=a", "add", "-A")
    _git(git_repo, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "exp")
    moved = code_version(git_repo)
    assert moved.git_sha != clean.git_sha
    assert moved.tree == clean.tree and moved.trainer == clean.trainer

    # Uncommitted trainer change: dirty, a different identity, stable for the same content.
    (git_repo / "trainer" / "loop.py").write_text("STEP = 2\n")
    dirty = code_version(git_repo)
    assert dirty.dirty and dirty.tree != clean.tree and dirty.trainer != clean.trainer
    assert code_version(git_repo).tree == dirty.tree


def test_code_version_without_git_hashes_content(tmp_path: Path) -> None:
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "x.py").write_text("a = 1\n")
    first = code_version(tmp_path)
    assert first.git_sha == "nogit" and first.dirty
    (tmp_path / "trainer" / "x.py").write_text("a = 2\n")
    assert code_version(tmp_path).tree != first.tree


def test_run_identity_depends_on_what_is_trained_only(git_repo: Path) -> None:
    code = code_version(git_repo)
    a = RunIdentity("exp-a", 1, code, "spec1", "data1")
    assert RunIdentity("exp-b", 1, code, "spec1", "data1").key == a.key  # same work, other name
    assert RunIdentity("exp-a", 2, code, "spec1", "data1").key != a.key
    assert RunIdentity("exp-a", 1, code, "spec2", "data1").key != a.key
    assert RunIdentity("exp-a", 1, code, "spec1", "data2").key != a.key
    d = a.to_dict(pr=7)
    assert d["identity"] == a.key and d["pr"] == 7 and d["git_sha"] == code.git_sha
    assert experiment_key(code, "s", "d", [1, 2]) != experiment_key(code, "s", "d", [1])


def test_adding_an_architecture_keeps_the_code_version_of_runs_that_do_not_use_it(git_repo: Path) -> None:
    """Issue 23, part 5: a run's code version covers the framework plus the architecture and
    optimizer files it uses, so a PR adding models/<new>.py reuses the baseline's runs."""
    def commit(message: str) -> None:
        _git(git_repo, "-c", "user.email=a@b", "-c", "user.name=a", "add", "-A")
        _git(git_repo, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", message)

    (git_repo / "models" / "optimizers").mkdir(parents=True)
    for rel in ("models/__init__.py", "models/_hf.py", "models/llama.py", "models/optimizers/__init__.py",
                "models/optimizers/adamw.py", "models/optimizers/muon.py"):
        (git_repo / rel).write_text(f"# {rel}\n")
    commit("models")
    base = code_version(git_repo, "llama", "adamw")
    # The PR: a new architecture file and its experiment; nothing else.
    (git_repo / "models" / "llama_new.py").write_text("# a new attention variant\n")
    (git_repo / "experiments" / "new.yaml").write_text("name: new\n")
    assert code_version(git_repo, "llama", "adamw").tree == base.tree  # uncommitted: still the same
    commit("new architecture")
    assert code_version(git_repo, "llama", "adamw").tree == base.tree
    assert code_version(git_repo, "llama_new", "adamw").tree != base.tree
    # What a llama run executes does move it: its own file, the contract, its optimizer.
    for rel in ("models/llama.py", "models/_hf.py", "models/__init__.py", "models/optimizers/adamw.py"):
        before = code_version(git_repo, "llama", "adamw").tree
        (git_repo / rel).write_text((git_repo / rel).read_text() + "# edit\n")
        assert code_version(git_repo, "llama", "adamw").tree != before, rel
        commit(rel)
    # Another optimizer's file does not.
    before = code_version(git_repo, "llama", "adamw").tree
    (git_repo / "models" / "optimizers" / "muon.py").write_text("# tuned\n")
    commit("muon")
    assert code_version(git_repo, "llama", "adamw").tree == before
