"""`pipeline validate` latency: 20 experiment files, one cold process, median of several runs.

This is the first check every pull request waits for, on a fresh GitHub-hosted runner,
so what counts is a *cold* process: interpreter start, imports, 20 loads. The files are
the committed examples plus variants that `extends: base.yaml` (each a full chain load),
in a temporary copy of `experiments/`. Python's own start-up and the command's import
time are measured side by side so the figure can be read against them.

Run: `.venv/bin/python bench/bench_validate.py [--runs N] [--no-append]` (prints the figures,
returns them from `main()`, and appends them to bench/RESULTS.md under "## validate").
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from scaffold import RESULTS_MD, child_env, copy_specs, cpu_model, utc_stamp

FILES = 20
RUNS = 7
GOAL_S = 1.0


def _make_files(root: Path) -> list[Path]:
    experiments = copy_specs(root)
    files = sorted(experiments.glob("*.yaml"))
    statement = (
        "Changing the seed alone should not move the held-out loss by more than noise, by construction."
    )
    for i in range(FILES - len(files)):
        name = f"variant-{i:02d}"
        (experiments / f"{name}.yaml").write_text(
            f"name: {name}\nextends: base.yaml\nhypothesis:\n  statement: {statement}\n  metric: eval/loss\n"
            f"  direction: decrease\n  min_effect: 0.01\n  baseline: base\ntrain:\n  seed: {100 + i}\n"
        )
    files = sorted(experiments.glob("*.yaml"))[:FILES]
    assert len(files) == FILES
    return files


def _median_wall(cmd: list[str], cwd: Path, env: dict[str, str], runs: int) -> tuple[float, list[float], float]:
    """Median wall seconds, every run's wall seconds, and median CPU seconds (user+sys) of the child.

    CPU time is reported next to wall time because a shared machine inflates wall time
    with other people's work; CPU time is what the command itself costs.
    """
    times, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return statistics.median(times), times, statistics.median(cpu)


def main(append: bool = True, runs: int = RUNS) -> dict:
    env = child_env()
    with tempfile.TemporaryDirectory(prefix="bench-validate-") as tmp:
        root = Path(tmp)
        files = _make_files(root)
        args = [str(p.relative_to(root)) for p in files]
        python_s, _, _ = _median_wall([sys.executable, "-c", "pass"], root, env, runs)
        help_s, _, help_cpu = _median_wall([sys.executable, "-c", "import pipelines.cli"], root, env, runs)
        validate_s, walls, validate_cpu = _median_wall(
            [sys.executable, "-m", "pipelines", "validate", *args], root, env, runs
        )
        load = os.getloadavg()[0]
    figures = {
        "files": FILES,
        "runs": runs,
        "validate_20_cold_median_s": round(validate_s, 3),
        "validate_runs_s": [round(t, 3) for t in walls],
        "validate_cpu_median_s": round(validate_cpu, 3),
        "cli_import_cpu_median_s": round(help_cpu, 3),
        "load_average_1m": round(load, 2),
        "python_startup_median_s": round(python_s, 3),
        "cli_import_median_s": round(help_s, 3),
        "beyond_imports_cpu_s": round(validate_cpu - help_cpu, 3),
        "goal_s": GOAL_S,
        "meets_goal": validate_s < GOAL_S,
        "cpu_meets_goal": validate_cpu < GOAL_S,
    }
    print(
        f"validate {FILES} files, cold process: median {validate_s:.3f} s over {runs} runs "
        f"(CPU {validate_cpu:.3f} s; python start {python_s:.3f} s, CLI import {help_s:.3f} s, "
        f"{figures['beyond_imports_cpu_s']:.3f} s CPU beyond the CLI import; load average {load:.1f}); goal < {GOAL_S:.0f} s: "
        f"wall {'met' if figures['meets_goal'] else 'NOT met'}, CPU {'met' if figures['cpu_meets_goal'] else 'NOT met'}"
    )
    if append:
        _append(figures)
    return figures


def _append(figures: dict) -> None:
    versions = ", ".join(
        f"{pkg} {metadata.version(pkg)}" for pkg in ("pydantic", "pyyaml", "typer") if _has(pkg)
    )
    entry = (
        f"\n### {utc_stamp()}\n"
        f"- machine: {os.cpu_count()} CPUs ({cpu_model()}), {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}, {versions}\n"
        f"- `pipeline validate` on {figures['files']} files (4 examples + chained variants), one cold process: "
        f"**median {figures['validate_20_cold_median_s']:.3f} s** over {figures['runs']} runs "
        f"(runs: {', '.join(f'{t:.3f}' for t in figures['validate_runs_s'])}); "
        f"CPU time (user+sys) median {figures['validate_cpu_median_s']:.3f} s; "
        f"1-min load average {figures['load_average_1m']} on a shared machine\n"
        f"- side by side: `python -c pass` {figures['python_startup_median_s']:.3f} s, "
        f"`import pipelines.cli` (every command module) {figures['cli_import_median_s']:.3f} s, "
        f"so {figures['beyond_imports_cpu_s']:.3f} s CPU for building the spec models and the 20 loads; "
        f"goal < {figures['goal_s']:.0f} s: "
        f"wall {'met' if figures['meets_goal'] else 'not met'}, "
        f"CPU {'met' if figures['cpu_meets_goal'] else 'not met'}\n"
        "- reproduce: `.venv/bin/python bench/bench_validate.py`\n"
    )
    text = RESULTS_MD.read_text(encoding="utf-8") if RESULTS_MD.exists() else "# Benchmark results\n"
    heading = "\n## validate\n"
    if heading not in text:
        text = text.rstrip("\n") + "\n" + heading
        text += "\n`pipeline validate` latency (bench/bench_validate.py): cold process, 20 files.\n"
        text += entry
    else:
        start = text.index(heading) + len(heading)
        nxt = text.find("\n## ", start)
        end = len(text) if nxt < 0 else nxt
        text = text[:end].rstrip("\n") + "\n" + entry + text[end:]
    RESULTS_MD.write_text(text, encoding="utf-8")


def _has(pkg: str) -> bool:
    try:
        metadata.version(pkg)
        return True
    except metadata.PackageNotFoundError:
        return False


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS, help="cold runs of each command (median)")
    parser.add_argument("--no-append", action="store_true", help="print only; do not append to bench/RESULTS.md")
    cli = parser.parse_args()
    main(append=not cli.no_append, runs=cli.runs)
