"""Run identity: what a training run is bound to, so equal work is reused, not re-run.

identity = hash(code version, spec hash, data version, seed)

The *code version* is the git tree hash of the code that can change a trained model
(`trainer/`, `basics/`, `validation/`, `pyproject.toml`, and of `models/` only what the run uses: the
contract and helpers, its architecture's file and its optimizer's file), plus a dirty flag
and, when dirty, a hash of the uncommitted content of those paths. A pull request that adds
an architecture therefore leaves the identity of every run that does not use it unchanged:
the baseline's finished runs are reused. We deliberately do not use the commit
SHA for the identity: a PR that only adds `experiments/x.yaml` moves the commit but
cannot change what the baseline trains, and the baseline must be reused across PRs.
The full commit SHA is still recorded (tag `pipeline.git_sha`) for traceability.

The *trainer version* (reports flag a baseline trained on other trainer code as stale) is the
git tree hash of `trainer/`, computed from the working tree when `trainer/` itself has
uncommitted changes: an uncommitted plug-in does not move it, and uncommitted trainer code
gets the version its commit will have.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from models import plugin_paths

# Paths whose content can change what a run trains or how it is evaluated (besides the
# files of models/ the run uses: `model_paths`).
CODE_PATHS = ("trainer", "basics", "validation", "pyproject.toml")  # trainer first: `trainer` below is trees[0]


def model_paths(repo: Path, model_type: str | None, optimizer: str | None) -> tuple[str, ...]:
    """The files of models/ a run of `model_type` with `optimizer` executes, relative to `repo`:
    the package's contract and helpers (`__init__.py`, `_*.py`) and the two plug-ins' own
    files (or folders). Not the other plug-ins."""
    out: list[str] = []
    found = plugin_paths(repo / "models")
    for folder, stem in (("models", model_type), ("models/optimizers", optimizer)):
        here = [p for p in found if p.folder == folder]
        out += sorted(p.path for p in here if p.name is None)
        out += [p.root for p in here if stem is not None and p.name == stem]
    return tuple(out)


@dataclass(frozen=True)
class CodeVersion:
    git_sha: str
    """Commit checked out (or 'nogit')."""
    tree: str
    """Content hash of CODE_PATHS at that commit, plus uncommitted changes when dirty."""
    dirty: bool
    """Uncommitted changes under CODE_PATHS."""
    trainer: str
    """git tree hash of trainer/ alone, of its working-tree content when that is uncommitted (a
    baseline on other trainer code is flagged stale; the same code has the same version)."""

    @property
    def label(self) -> str:
        return f"{self.git_sha[:12]}{'-dirty' if self.dirty else ''}"


def _git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _hash_files(repo: Path, paths: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for rel in paths:
        base = repo / rel
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for f in files:
            if "__pycache__" in f.parts or f.suffix == ".pyc":
                continue
            h.update(str(f.relative_to(repo)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def code_version(repo: Path, model_type: str | None = None, optimizer: str | None = None) -> CodeVersion:
    """The code version of the working tree at `repo` for a run of `model_type` trained with
    `optimizer` (works without git, then always 'dirty')."""
    paths = CODE_PATHS + model_paths(repo, model_type, optimizer)
    sha = _git(repo, "rev-parse", "HEAD")
    if sha is None:
        content = _hash_files(repo, paths)
        return CodeVersion("nogit", content[:16], True, _hash_files(repo, ("trainer",))[:16])
    status = _git(repo, "status", "--porcelain", "--", *paths) or ""
    dirty = bool(status.strip())
    trees = [_git(repo, "rev-parse", f"HEAD:{p}") or "absent" for p in paths]
    tree = hashlib.sha256("|".join(trees).encode()).hexdigest()
    trainer = (trees[0] or "absent")[:16]
    if dirty:
        # Same uncommitted content -> same identity, so a dirty laptop run is still reusable.
        tree = hashlib.sha256((tree + _hash_files(repo, paths)).encode()).hexdigest()
        if (_git(repo, "status", "--porcelain", "--", "trainer") or "").strip():
            # The tree hash trainer/ will have once committed: an uncommitted plug-in elsewhere
            # leaves it alone, and an uncommitted trainer edit matches its own commit.
            trainer = _worktree_tree(repo, "trainer")[:16]
    return CodeVersion(sha, tree[:16], dirty, trainer)


def _worktree_tree(repo: Path, folder: str) -> str:
    """The git tree hash of `folder`'s working-tree files (tracked and new, not ignored), as
    `git write-tree` would compute it; equal to `git rev-parse HEAD:folder` when clean."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", folder],
                             cwd=repo, capture_output=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "absent"
    root: dict[str, object] = {}
    for rel in sorted(set(filter(None, out.decode("utf-8", "surrogateescape").split("\0")))):
        path = repo / rel
        if not (path.is_file() or path.is_symlink()):
            continue  # deleted, not yet staged
        node = root
        parts = Path(rel).relative_to(folder).parts
        for part in parts[:-1]:
            node = node.setdefault(part, {})  # type: ignore[assignment]
        node[parts[-1]] = path
    return _tree_hash(root) if root else "absent"


def _git_object(kind: str, body: bytes) -> str:
    return hashlib.sha1(f"{kind} {len(body)}\0".encode() + body).hexdigest()  # noqa: S324 - git's own id


def _tree_hash(node: dict[str, object]) -> str:
    import os
    import stat

    entries: list[tuple[str, bytes]] = []
    for name, child in node.items():
        if isinstance(child, dict):
            mode, oid, key = "40000", _tree_hash(child), name + "/"
        else:
            path = Path(str(child))
            if path.is_symlink():
                mode, oid = "120000", _git_object("blob", os.readlink(path).encode())
            else:
                executable = path.stat().st_mode & stat.S_IXUSR
                mode, oid = ("100755" if executable else "100644"), _git_object("blob", path.read_bytes())
            key = name
        entries.append((key, f"{mode} {name}".encode() + b"\0" + bytes.fromhex(oid)))
    return _git_object("tree", b"".join(entry for _, entry in sorted(entries, key=lambda e: e[0].encode())))


@dataclass(frozen=True)
class RunIdentity:
    """Everything a trained model depends on. Equal identity -> reuse the finished run."""

    experiment: str
    seed: int
    code: CodeVersion
    spec_hash: str
    data_version: str

    @property
    def key(self) -> str:
        # The experiment name is not part of the key: the same config under another
        # name is the same work (spec_hash already excludes cosmetic fields).
        payload = json.dumps(
            {"code": self.code.tree, "spec": self.spec_hash, "data": self.data_version, "seed": self.seed},
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def to_dict(self, **extra: object) -> dict[str, object]:
        out: dict[str, object] = {
            "identity": self.key,
            "experiment": self.experiment,
            "seed": self.seed,
            "code_version": self.code.tree,
            "git_sha": self.code.git_sha,
            "dirty": self.code.dirty,
            "trainer_version": self.code.trainer,
            "spec_hash": self.spec_hash,
            "data_version": self.data_version,
        }
        out.update(extra)
        return out

    @staticmethod
    def code_from_dict(d: dict[str, object]) -> CodeVersion:
        return CodeVersion(str(d["git_sha"]), str(d["code_version"]), bool(d["dirty"]), str(d["trainer_version"]))


def experiment_key(code: CodeVersion, spec_hash: str, data_version: str, seeds: list[int]) -> str:
    """Key of one experiment invocation (all its seeds): names its run directory."""
    payload = json.dumps({"code": code.tree, "spec": spec_hash, "data": data_version, "seeds": seeds}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


__all__ = ["CODE_PATHS", "model_paths", "CodeVersion", "RunIdentity", "code_version", "experiment_key", "asdict"]
