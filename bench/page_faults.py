"""Minor page faults and CPU ms per step, bare loop vs trainer, with glibc's allocator defaults
and with the trainer's policy (`trainer/host_memory.py`), each run in a fresh interpreter.

    .venv/bin/python bench/page_faults.py [--precision bf16] [--repeats 2] [--no-append]

`policy off` runs with `GLIBC_TUNABLES=glibc.malloc.check=0` (glibc's own default), which the
trainer reads as an operator's choice and leaves alone (`trainer.host_memory.OPERATOR_SETTINGS`);
`policy on` calls `keep_freed_memory_in_heap()` first in both systems. Steady figures: medians over steps 4-16.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scaffold import append_results_md, machine

STEPS = 16


def one(system: str, precision: str, policy: bool) -> dict[str, float]:
    import bench_trainer as bt
    import torch

    from trainer.host_memory import keep_freed_memory_in_heap

    torch.set_num_threads(1)
    if policy:
        keep_freed_memory_in_heap()
    prepared = bt.prepared_data()
    faults: list[int] = []
    cpu: list[float] = []

    def mark() -> None:
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
        cpu.append(time.process_time())

    if system == "bare":
        bt.run_bare(prepared, precision, STEPS, on_step=mark)
    else:
        from trainer.loop import Trainer

        original = Trainer._faults_after_step

        def hooked(self: Trainer) -> None:
            original(self)
            mark()

        Trainer._faults_after_step = hooked  # type: ignore[method-assign]
        bt.run_trainer(prepared, precision, STEPS, Path(tempfile.mkdtemp(prefix="faults-")))
    df = [b - a for a, b in zip(faults[3:], faults[4:], strict=False)]
    dc = [b - a for a, b in zip(cpu[3:], cpu[4:], strict=False)]
    return {"faults_per_step": statistics.median(df), "cpu_ms_per_step": statistics.median(dc) * 1000}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], args.one[2] == "on")))
        return
    rows: dict[str, list[dict[str, float]]] = {}
    for rep in range(args.repeats):
        for system in ("bare", "trainer"):
            for policy in ("off", "on"):
                env = dict(os.environ)
                if policy == "off":  # the trainer leaves an operator's choice alone; this one is glibc's default
                    env["GLIBC_TUNABLES"] = "glibc.malloc.check=0"
                out = subprocess.run([sys.executable, __file__, "--one", system, args.precision, policy],
                                     capture_output=True, text=True, env=env, check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                rows.setdefault(f"{system} {policy}", []).append(r)
                print(f"[{rep + 1}/{args.repeats}] {system:8s} policy {policy}: {r}", flush=True)
    med = {k: {f: statistics.median(x[f] for x in v) for f in v[0]} for k, v in rows.items()}
    if args.no_append:
        return
    m = machine()
    lines = ["", f"## host page faults: glibc defaults vs the trainer's allocator policy ({m['date']})", "",
             f"Machine: {m['nproc']} cores, {m['cpu']}, torch {m['torch']}, 1 thread, {args.precision}, the bench "
             f"Llama of bench_trainer.py. `python bench/page_faults.py --precision {args.precision} --repeats "
             f"{args.repeats}`: each run a fresh interpreter; medians over steps 4-{STEPS}, then over repeats.", "",
             "| system | allocator | minor page faults / step | CPU ms / step |", "|---|---|---|---|"]
    for key, v in med.items():
        system, policy = key.split()
        lines.append(f"| {system} | {'glibc defaults' if policy == 'off' else 'trainer.host_memory policy'} | "
                     f"{v['faults_per_step']:.0f} | {v['cpu_ms_per_step']:.1f} |")
    lines.append("")
    append_results_md("\n".join(lines))


if __name__ == "__main__":
    main()
