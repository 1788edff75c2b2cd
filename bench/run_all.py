"""`make bench`: every benchmark, one after another, each appending to bench/RESULTS.md.

Side-by-side ratios are measured inside each script in one run (interleaved, medians);
this only sequences them. The GPU acceptance run (gpu_check.py: prepare, then run; bench/README.md)
runs only where CUDA is available.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = ["bench_validate.py", "bench_pr_check.py", "bench_data.py", "bench_trainer.py", "bench_mlflow.py",
           "bench_architectures.py", "bench_optimizers.py", "bench_compile.py",
           "ab_trainer_step.py", "page_faults.py", "profile_trainer.py", "bench_parallel_memory.py", "bench_verdict.py"]
GPU_SCRIPTS = ["gpu_check.py prepare", "gpu_check.py run --append"]


def run(scripts: list[str]) -> list[str]:
    """Run each script (with its arguments) from the repository root, in order; the ones that failed."""
    failed = []
    for script in scripts:
        print(f"== {script}", flush=True)
        name, *args = script.split()
        if subprocess.run([sys.executable, str(HERE / name), *args], cwd=HERE.parent).returncode:
            failed.append(script)
    return failed


def main() -> int:
    failed = run(SCRIPTS)
    try:
        import torch

        if torch.cuda.is_available():
            failed += run(GPU_SCRIPTS)
    except ImportError:
        pass
    print("results: bench/RESULTS.md" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
