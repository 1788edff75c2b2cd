"""The plug-in contract, checked file by file where the mistake is made (`pipeline contract`).

A pull request that adds or changes `models/<name>.py` or `models/optimizers/<name>.py`
gets that file's checks, each failure one line naming the file, the method and what to
change (a workflow annotation with `--format github`). This module is the torch-free half:
which plug-ins a list of changed files touches, the failure record, and the import-cost
check (importing the file in a fresh interpreter loads no torch, transformers or
accelerate: `pipeline validate` and `plan` import every plug-in). The checks that build
the model (meta count, FLOPs, TP names and shapes, determinism in eval, causality, packed rows,
state round trip, export, optimizer state) are `trainer.contract_checks`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from basics.errors import Issue
from models import PluginKind, plugin_path, plugin_paths

HEAVY_MODULES = ("torch", "transformers", "accelerate")
"""What a plug-in's top level must not import (each costs seconds on a GitHub runner)."""

@dataclass(frozen=True)
class ContractFailure:
    """One broken promise of a plug-in file: where, which method, what to change."""

    file: str
    line: int
    method: str
    message: str

    def text(self) -> str:
        return f"{self.file}:{self.line}: {self.method}: {self.message}"

    def github(self) -> str:
        return Issue(self.file, self.line, 1, self.method, self.message).github()


@dataclass(frozen=True)
class Plugin:
    """One architecture or optimizer file of the checkout."""

    kind: PluginKind
    name: str
    file: str
    """Relative to the repository: `models/x.py`, `models/optimizers/y.py` (or the package's `__init__.py`)."""

    @property
    def module(self) -> str:
        return f"models.{self.name}" if self.kind == "architecture" else f"models.optimizers.{self.name}"


def all_plugins(repo: Path) -> list[Plugin]:
    """Every architecture and optimizer file under `repo`/models (`models.plugin_paths`: helpers
    `_*` are not plug-ins)."""
    return [Plugin(p.kind, p.name, p.path) for p in plugin_paths(repo / "models")
            if p.kind is not None and p.name is not None]


def plugins_touched(paths: list[str], repo: Path) -> list[Plugin]:
    """The plug-ins whose checks `paths` (changed files, relative to `repo`) call for: a plug-in's
    own file (or a file of its package); a helper `models/_x.py` every architecture,
    `models/optimizers/_x.py` every optimizer, `models/__init__.py` every plug-in. Other paths
    (experiments, docs, deleted plug-ins) call for none."""
    plugins = all_plugins(repo)
    wanted: set[Plugin] = set()
    for raw in paths:
        found = plugin_path(raw)  # by name, so a deleted helper still calls for its folder's plug-ins
        if found is None:
            continue
        wanted.update(p for p in plugins if found.kind in (None, p.kind) and found.name in (None, p.name))
    return [p for p in plugins if p in wanted]


_IMPORT_PROBE = r"""
import importlib, importlib.abc, json, sys, time, traceback
HEAVY = set(sys.argv[2].split(","))
first = []
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if not first and name.split(".")[0] in HEAVY:
            first.append([name, [[f.filename, f.lineno] for f in traceback.extract_stack()[:-1]]])
        return None
sys.meta_path.insert(0, Watch())
t0 = time.perf_counter()
try:
    importlib.import_module(sys.argv[1])
    error = None
except Exception as exc:
    error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
print(json.dumps({"first": first[0] if first else None, "error": error, "seconds": time.perf_counter() - t0}))
"""


def check_import_cost(plugin: Plugin, repo: Path, python: str = sys.executable) -> list[ContractFailure]:
    """Import `plugin` in a fresh interpreter; a failure when that loads torch, transformers or
    accelerate, at the line of the plug-in (or helper) file whose import statement did."""
    proc = subprocess.run([python, "-c", _IMPORT_PROBE, plugin.module, ",".join(HEAVY_MODULES)], cwd=repo,
                          capture_output=True, text=True, timeout=300, env=_probe_env(repo))
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return [ContractFailure(plugin.file, 1, "import", f"the import probe failed: {proc.stderr.strip()[-300:]}")]
    out = json.loads(lines[-1])
    if out["error"]:
        return [ContractFailure(plugin.file, 1, "import", f"cannot import: {out['error']}")]
    if out["first"] is None:
        return []
    module, stack = out["first"]
    models_dir = str((repo / "models").resolve())
    own = [(f, n) for f, n in stack if str(Path(f).resolve()).startswith(models_dir)]
    file, line = (str(Path(own[-1][0]).resolve().relative_to(repo.resolve())), own[-1][1]) if own else (plugin.file, 1)
    return [ContractFailure(file, line, "import", f"importing {plugin.module} loads {module.split('.')[0]} "
                            f"({out['seconds']:.1f}s): `pipeline validate` and `plan` import every plug-in and "
                            "stay torch-free; import it inside the methods that build the model")]


def _probe_env(repo: Path) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=str(repo) + (os.pathsep + path if path else ""))


__all__ = ["ContractFailure", "HEAVY_MODULES", "Plugin", "all_plugins", "check_import_cost", "plugins_touched"]
