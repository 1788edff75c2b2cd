"""The startup checklist, run on the machine that will train before anything launches.

`pipeline doctor FILE` shows it; every launcher runs it first (the local and static
launchers in process, the Slurm launcher as `srun python -m pipelines.doctor` on every
node). Five sections, each check `ok`, `warning` or `error`; any error refuses the launch:

- configuration: the spec validates (models and cross-field rules);
- environment: Python and the key packages against `constraints/constraints.txt`
  (a mismatch names both versions), CUDA when GPUs are wanted;
- resources: visible accelerators vs `gpus_per_node` (on CPU, processes vs cores is a
  warning), free memory and disk for the model, optimizer and checkpoints;
- data: source paths exist and are non-empty, the prepared version is present;
- parallel: the world size of the launch matches the spec's layout.

Importing this module is cheap; torch is imported only when GPUs are checked.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from basics.environment import package_version
from basics.errors import DoctorFailed, SpecError

REPO_ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS_ENV = "PIPELINE_CONSTRAINTS"
DEFAULT_CONSTRAINTS = REPO_ROOT / "constraints" / "constraints.txt"
GIB = 1024**3


class Level(StrEnum):
    OK = "ok"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class Check:
    section: str
    """configuration, environment, resources, data or parallel."""
    name: str
    level: Level
    message: str


@dataclass
class DoctorReport:
    """Every check of one machine; `ok` when none is an error."""

    checks: list[Check] = field(default_factory=list)
    host: str = field(default_factory=socket.gethostname)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def errors(self) -> list[Check]:
        return [c for c in self.checks if c.level is Level.ERROR]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.level is Level.WARNING]

    def add(self, section: str, name: str, level: Level, message: str) -> None:
        self.checks.append(Check(section, name, level, message))

    def render_text(self) -> str:
        label = {Level.OK: "ok", Level.WARNING: "warning", Level.ERROR: "ERROR"}
        lines = [f"doctor on {self.host} (python {platform.python_version()})"]
        for c in self.checks:
            lines.append(f"  {label[c.level]:<8} {c.section:<13} {c.name}: {c.message}")
        verdict = "ready" if self.ok else "NOT ready"
        lines.append(f"{verdict}: {len(self.errors)} error(s), {len(self.warnings)} warning(s)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "ok": self.ok,
                "checks": [{"section": c.section, "name": c.name, "level": str(c.level), "message": c.message}
                           for c in self.checks]}


# --------------------------------------------------------------------------- environment (pure)


def parse_constraints(text: str) -> tuple[dict[str, str], str | None]:
    """`name -> specifier` from a pip constraints file, plus the `# requires-python:` line."""
    pins: dict[str, str] = {}
    python_spec = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#"):
            if line[1:].strip().startswith("requires-python:"):
                python_spec = line.split(":", 1)[1].strip()
            continue
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        from packaging.requirements import Requirement

        req = Requirement(line)
        pins[req.name] = str(req.specifier)
    return pins, python_spec


def check_versions(constraints_text: str, source: str, installed: Callable[[str], str | None] = package_version,
                   python_version: str | None = None) -> list[Check]:
    """Installed versions against the constraints; a mismatch names both versions."""
    from packaging.specifiers import SpecifierSet

    pins, python_spec = parse_constraints(constraints_text)
    checks: list[Check] = []
    py = python_version or platform.python_version()
    if python_spec and not SpecifierSet(python_spec).contains(py):
        checks.append(Check("environment", "python", Level.ERROR,
                            f"Python {py} installed, {source} requires {python_spec}"))
    else:
        checks.append(Check("environment", "python", Level.OK, py))
    for name, spec in pins.items():
        version = installed(name)
        if version is None:
            checks.append(Check("environment", name, Level.ERROR, f"not installed, {source} wants {name}{spec}"))
        elif not SpecifierSet(spec).contains(version, prereleases=True):
            checks.append(Check("environment", name, Level.ERROR,
                                f"{name} {version} installed, but {source} wants {name}{spec}"))
        else:
            checks.append(Check("environment", name, Level.OK, version))
    return checks


# --------------------------------------------------------------------------- estimates (pure)


def memory_needed_bytes(param_count: int, processes: int) -> int:
    """fp32 weights + grads + two Adam moments (16 bytes/param) + ~0.5 GiB runtime, per process."""
    return processes * (16 * param_count + GIB // 2)


def disk_needed_bytes(param_count: int, keep_last: int) -> int:
    """Checkpoints (weights + optimizer, 12 bytes/param) kept plus the best one and one being written."""
    return 12 * param_count * (keep_last + 2) + GIB // 4


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# --------------------------------------------------------------------------- the checklist


def run_doctor(spec: Any, data_dir: Path | None = None, expect_world_size: int | None = None, *,
               use_gpu: bool | None = None, procs_per_node: int | None = None, repo_root: Path | None = None,
               constraints_path: Path | None = None, work_dir: Path | None = None) -> DoctorReport:
    """Check `spec` (an `ExperimentSpec`) against this machine; never raises for a failed check."""
    report = DoctorReport()
    _check_configuration(report, spec)
    _check_environment(report, constraints_path)
    res = spec.resource
    gpu = res.gpus_per_node > 0 if use_gpu is None else use_gpu
    procs = procs_per_node or (res.gpus_per_node if gpu else res.cpu_processes)
    _check_resources(report, spec, gpu, procs, work_dir or data_dir or Path.cwd())
    _check_data(report, spec, data_dir, repo_root or REPO_ROOT)
    _check_parallel(report, spec, expect_world_size)
    return report


def run_doctor_on_file(spec_path: Path, data_dir: Path | None = None, expect_world_size: int | None = None,
                       **kwargs: Any) -> DoctorReport:
    """Load a resolved spec (JSON) or an experiment YAML, then `run_doctor`; a bad spec is an error check."""
    try:
        spec = load_any_spec(Path(spec_path))
    except SpecError as exc:
        report = DoctorReport()
        for line in str(exc).splitlines():
            report.add("configuration", "spec", Level.ERROR, line)
        _check_environment(report, kwargs.get("constraints_path"))
        return report
    return run_doctor(spec, data_dir, expect_world_size, **kwargs)


def load_any_spec(path: Path) -> Any:
    """The spec of a `spec.resolved.json` (the resolved experiment a launch runs) or of an experiment YAML."""
    from basics.errors import Issue, PipelineError
    from validation.resolved import load_resolved

    if path.suffix == ".json":
        try:
            return load_resolved(path).spec
        except PipelineError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise SpecError([Issue(str(path), 1, 1, "spec", first)]) from exc
    from validation.loader import load_spec

    return load_spec(path)


def _check_configuration(report: DoctorReport, spec: Any) -> None:
    from validation.rules import check

    violations = check(spec)
    for v in violations:
        report.add("configuration", ".".join(map(str, v.path)), Level.ERROR, v.message)
    if not violations:
        report.add("configuration", "spec", Level.OK, f"{spec.name} (spec hash {spec.spec_hash()})")


def _check_environment(report: DoctorReport, constraints_path: Path | None) -> None:
    path = Path(constraints_path or os.environ.get(CONSTRAINTS_ENV) or DEFAULT_CONSTRAINTS)
    try:
        text = path.read_text()
    except OSError:
        report.add("environment", "constraints", Level.WARNING, f"{path} not found; versions not checked")
        return
    shown = path.name if path == DEFAULT_CONSTRAINTS else str(path)
    report.checks.extend(check_versions(text, f"constraints/{shown}" if path == DEFAULT_CONSTRAINTS else shown))


def _check_resources(report: DoctorReport, spec: Any, gpu: bool, procs: int, work_dir: Path) -> None:
    params = spec.model.parameter_count()
    if gpu:
        from basics.environment import accelerators

        acc = accelerators()
        if acc["gpu_count"] < procs:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
            report.add("resources", "accelerators", Level.ERROR,
                       f"spec wants {procs} GPU(s) per node, {acc['gpu_count']} visible "
                       f"(CUDA {acc['cuda']}, CUDA_VISIBLE_DEVICES={visible})")
        else:
            report.add("resources", "accelerators", Level.OK, f"{acc['gpu_count']} x {acc['gpu_model']}")
    else:
        cores = os.cpu_count() or 1
        level = Level.WARNING if procs > cores else Level.OK
        report.add("resources", "cpu", level, f"{procs} process(es) on {cores} core(s)"
                   + (" (oversubscribed: slower, still correct)" if level is Level.WARNING else ""))
    host_params = 0 if gpu else params  # on GPUs the model and optimizer live in device memory
    need = memory_needed_bytes(host_params, procs)
    avail = _mem_available()
    if avail is not None:
        level = Level.ERROR if avail < need else Level.OK
        report.add("resources", "memory", level, f"{avail / GIB:.1f} GiB available, about {need / GIB:.1f} GiB needed")
    probe = work_dir if work_dir.exists() else Path.cwd()
    free = shutil.disk_usage(probe).free
    need_disk = disk_needed_bytes(params, spec.train.keep_last)
    level = Level.ERROR if free < need_disk else Level.OK
    report.add("resources", "disk", level, f"{free / GIB:.1f} GiB free at {probe}, about {need_disk / GIB:.2f} GiB needed")


def _check_data(report: DoctorReport, spec: Any, data_dir: Path | None, repo_root: Path) -> None:
    prepared_ok = False
    if data_dir is not None:
        manifest = Path(data_dir) / "manifest.json"
        if manifest.is_file() and manifest.stat().st_size > 0:
            prepared_ok = True
            report.add("data", "prepared", Level.OK, f"{data_dir}")
        else:
            report.add("data", "prepared", Level.ERROR,
                       f"prepared data missing at {data_dir} (no manifest.json); run `pipeline data prepare` first")
    for source in spec.data.sources:
        pattern = source.path if os.path.isabs(source.path) else str(repo_root / source.path)
        files = [Path(p) for p in sorted(glob.glob(pattern, recursive=True)) if Path(p).is_file()]
        size = sum(f.stat().st_size for f in files)
        if files and size > 0:
            report.add("data", source.name, Level.OK, f"{len(files)} file(s), {size / 1e6:.1f} MB")
            continue
        problem = f"{source.path}: {'no files match' if not files else 'all matching files are empty'}"
        # Compute nodes may only see the prepared cache; the sources matter when it is missing.
        report.add("data", source.name, Level.WARNING if prepared_ok else Level.ERROR, problem)


def _check_parallel(report: DoctorReport, spec: Any, expect_world_size: int | None) -> None:
    layout = spec.parallel_layout()
    world = spec.resource.world_size
    product = layout.dp * layout.tp * layout.pp
    if product != world:
        report.add("parallel", "layout", Level.ERROR,
                   f"dp x tp x pp = {layout.dp} x {layout.tp} x {layout.pp} = {product}, resources give {world} processes")
    elif expect_world_size is not None and expect_world_size != world:
        report.add("parallel", "world size", Level.ERROR,
                   f"the launch starts {expect_world_size} processes, the spec's resources give {world}")
    else:
        report.add("parallel", "layout", Level.OK, f"dp={layout.dp} tp={layout.tp} pp={layout.pp} on {world} process(es)")


# --------------------------------------------------------------------------- module main (every node)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.doctor",
                                     description="Check this machine against an experiment before training.")
    parser.add_argument("--spec", type=Path, required=True, help="resolved spec (JSON) or experiment YAML")
    parser.add_argument("--world-size", type=int, default=None, help="processes the launch will start in total")
    parser.add_argument("--data-dir", type=Path, default=None, help="prepared data cache the run will read")
    parser.add_argument("--procs-per-node", type=int, default=None)
    parser.add_argument("--gpu", action="store_true", default=None, help="the launch uses GPUs")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = run_doctor_on_file(args.spec, data_dir=args.data_dir, expect_world_size=args.world_size,
                                use_gpu=args.gpu, procs_per_node=args.procs_per_node)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render_text(), flush=True)
    return 0 if report.ok else DoctorFailed.exit_code


if __name__ == "__main__":
    sys.exit(main())
