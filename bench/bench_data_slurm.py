"""The full demo corpus prepared locally (1 worker, N workers) and as Slurm array jobs on the
project's single-host two-node test cluster (`tests/infra/slurm.sh`, started and stopped here
when it is not running): the data version and every byte must be the same.

    .venv/bin/python bench/bench_data_slurm.py [--task-bytes N] [--no-append]

Everything happens in a temporary directory; experiments/base.yaml's data section is used
with the demo corpus built from this interpreter's standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from scaffold import append_results_md, copy_specs, slurm_test_cluster, utc_stamp


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task-bytes", type=int, default=1 << 20, help="input bytes per task (1 MiB: ~7 tasks)")
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    from pipelines.dataprep.demo_corpus import build_demo_corpus
    from pipelines.dataprep.executors import SlurmOptions
    from pipelines.dataprep.prepare import prepare_data
    from validation.loader import load_spec

    figures: dict = {}
    with slurm_test_cluster(), tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        corpus = build_demo_corpus(repo / "data/demo")
        figures["demo_mb"] = round(sum(corpus.bytes.values()) / 1e6, 2)
        data = load_spec(copy_specs(repo) / "base.yaml").data.model_copy(update={"task_bytes": args.task_bytes})
        manifests = {}
        for name, kwargs in (("local_1", {"workers": 1}), ("local_n", {"workers": os.cpu_count() or 2}),
                             ("slurm", {"launcher": "slurm", "slurm": SlurmOptions(time="0:20:00",
                                                                                    mem_per_task="400M")})):
            t = time.perf_counter()
            prepared = prepare_data(data, repo, cache_root=repo / f"cache-{name}", progress=False, **kwargs)
            figures[f"{name}_s"] = round(time.perf_counter() - t, 2)
            manifests[name] = json.loads((prepared.path / "manifest.json").read_text())["files"]
            figures["version"] = prepared.version
            figures["tasks"] = prepared.params["tasks"]
        figures["files"] = len(manifests["slurm"])
        figures["token_shards"] = sum(f.endswith(".tokens.bin") for f in manifests["slurm"])
        figures["slurm_equals_local_1"] = manifests["slurm"] == manifests["local_1"]
        figures["local_n_equals_local_1"] = manifests["local_n"] == manifests["local_1"]
    print(json.dumps(figures, indent=1))
    assert figures["slurm_equals_local_1"] and figures["local_n_equals_local_1"], figures
    if not args.no_append:
        lines = ["", f"## Data on Slurm vs local (bench/bench_data_slurm.py) — {utc_stamp()}", "",
                 f"Full demo corpus, experiments/base.yaml data section with task_bytes {args.task_bytes}; "
                 f"the two-node single-host test cluster (tests/infra/slurm.sh), {os.cpu_count()} shared CPUs "
                 f"(1-min load average {os.getloadavg()[0]:.1f}).", "", "| figure | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in figures.items()]
        append_results_md("\n".join(lines) + "\n")
    return figures


if __name__ == "__main__":
    main()
