"""A stand-in for `python -m trainer` that exercises what the launchers must get right.

Same command line as the trainer (`--spec --run-dir --data-dir [--tracking-uri]`), same
run-directory contract (`checkpoints/step_XXXXXX/MANIFEST.json`, `result.json` last),
same signals (SIGTERM: checkpoint, then exit 143). Each rank all-reduces its rank+1 (the
sum proves the processes really joined one process group) and writes `probe/rank<N>.json`
with what it saw: world size, SLURM_NODEID, node rank, resume step.

Knobs (env): PROBE_STEPS (default 3), PROBE_STEP_SECONDS (0.2), PROBE_CRASH_AT_STEP (crash
rank 0 with exit 1 at that step in its first PROBE_CRASH_TIMES attempts, default 1),
PROBE_RESULT_STATUS (write this status instead of "finished", exit 5 unless "finished").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path


def latest_checkpoint(run_dir: Path) -> int | None:
    steps = [int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*") if (p / "MANIFEST.json").is_file()]
    return max(steps) if steps else None


def save_checkpoint(run_dir: Path, step: int) -> None:
    path = run_dir / "checkpoints" / f"step_{step:06d}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "train_state.json").write_text(json.dumps({"step": step}))
    (path / "MANIFEST.json").write_text(json.dumps({"files": ["train_state.json"]}))  # written last


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--tracking-uri", default=None)
    args, _ = parser.parse_known_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from trainer.runlock import join_job

    join_job(args.run_dir)  # the trainer's contract: own the rank's lock, die with the launcher
    stop = {"requested": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(requested=True))

    import torch
    import torch.distributed as dist
    from accelerate import PartialState

    # PartialState() alone ignores ACCELERATE_USE_CPU (only AcceleratorState reads it): pass it.
    state = PartialState(cpu=os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true")
    rank, world = state.process_index, state.num_processes
    run_dir = args.run_dir
    resumed_from = latest_checkpoint(run_dir)
    start = (resumed_from or 0) + 1
    total = int(os.environ.get("PROBE_STEPS", "3"))
    crash_at = int(os.environ.get("PROBE_CRASH_AT_STEP", "0"))

    value = torch.tensor([float(rank + 1)])
    if world > 1:
        dist.all_reduce(value)
    info = {
        "rank": rank, "world_size": world, "allreduce": value.item(), "hostname": socket.gethostname(),
        "slurm_nodeid": os.environ.get("SLURM_NODEID"), "node_rank": os.environ.get("GROUP_RANK"),
        "resumed_from": resumed_from, "spec_exists": args.spec.is_file(), "pid": os.getpid(),
    }
    (run_dir / "probe").mkdir(parents=True, exist_ok=True)
    (run_dir / "probe" / f"rank{rank}.json").write_text(json.dumps(info))
    with (run_dir / "probe" / "events.jsonl").open("a") as fh:
        fh.write(json.dumps({"rank": rank, "event": "start", "resumed_from": resumed_from}) + "\n")
    print(f"probe rank {rank}/{world} allreduce={value.item()} resumed_from={resumed_from}", flush=True)
    events = (run_dir / "probe" / "events.jsonl").read_text().splitlines()
    attempt = sum(1 for e in map(json.loads, events) if e["rank"] == rank and e["event"] == "start")
    crash_times = int(os.environ.get("PROBE_CRASH_TIMES", "1"))

    step = start - 1
    for step in range(start, total + 1):
        time.sleep(float(os.environ.get("PROBE_STEP_SECONDS", "0.2")))
        if crash_at and step == crash_at and rank == 0 and attempt <= crash_times:
            print(f"probe rank {rank}: injected crash at step {step}", flush=True)
            os._exit(1)
        flag = torch.tensor([1.0 if stop["requested"] else 0.0])
        if world > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if rank == 0:
            save_checkpoint(run_dir, step)
        if world > 1:
            dist.barrier()
        if flag.item() > 0:
            print(f"probe rank {rank}: SIGTERM, checkpoint step {step} saved, stopping", flush=True)
            with (run_dir / "probe" / "events.jsonl").open("a") as fh:
                fh.write(json.dumps({"rank": rank, "event": "sigterm", "step": step}) + "\n")
            return 143
        print(f"probe rank {rank}: step {step}/{total}", flush=True)

    status = os.environ.get("PROBE_RESULT_STATUS", "finished")
    if rank == 0:
        (run_dir / "result.json").write_text(json.dumps({"status": status, "steps": step, "world_size": world}))
    if world > 1:
        dist.barrier()
    state.destroy_process_group() if hasattr(state, "destroy_process_group") else None
    return 0 if status == "finished" else 5


if __name__ == "__main__":
    sys.exit(main())
