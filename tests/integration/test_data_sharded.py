"""Streaming, sharded, resumable preparation (issue 18), with worker processes.

The preparation is a fixed set of tasks (input files or byte ranges of them, decided by
the input and `data.task_bytes`, never by the number of workers) run by datatrove's
executors. These tests pin what that must guarantee: the bytes do not depend on how
many workers made them, a SIGKILLed preparation resumes without redoing finished tasks
and ends bit-identical, a failed task leaves nothing a reader would use, and near
duplicates are removed across shards when asked.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from basics.errors import DataError
from pipelines.dataprep.prepare import prepare_data
from tests.infra.data_helpers import build_small_demo, demo_sources, make_spec, prose, write_jsonl
from validation.data import PreparedData

REPO = Path(__file__).resolve().parents[2]
SMALL_TASKS = 4096  # input bytes per task: the 60 kB demo sources become ~15 tasks each


def manifest_files(prepared: PreparedData) -> dict:
    return json.loads((prepared.path / "manifest.json").read_text())["files"]


@pytest.fixture(scope="module")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    build_small_demo(repo)
    return repo


@pytest.fixture(scope="module")
def one_worker(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> PreparedData:
    spec = make_spec(demo_sources(), task_bytes=SMALL_TASKS)
    return prepare_data(spec.data, demo_repo, cache_root=tmp_path_factory.mktemp("c1"), progress=False, workers=1)


def test_one_and_two_local_workers_write_identical_bytes(demo_repo: Path, one_worker: PreparedData,
                                                         tmp_path: Path) -> None:
    spec = make_spec(demo_sources(), task_bytes=SMALL_TASKS)
    two = prepare_data(spec.data, demo_repo, cache_root=tmp_path, progress=False, workers=2)
    assert two.version == one_worker.version
    assert manifest_files(two) == manifest_files(one_worker)


def test_a_failing_task_leaves_no_prepared_data(tmp_path: Path) -> None:
    texts = [json.dumps({"text": prose(i)}) for i in range(200)]
    texts[150] = "{broken json"
    (tmp_path / "data").mkdir()
    (tmp_path / "data/bad.jsonl").write_text("\n".join(texts) + "\n")
    spec = make_spec([{"name": "bad", "path": "data/bad.jsonl", "weight": 1.0}], task_bytes=2048)
    with pytest.raises(DataError, match=r"bad.jsonl:151 is not valid JSON"):
        prepare_data(spec.data, tmp_path, progress=False, workers=2)
    cache = tmp_path / "data/cache"
    assert not [p for p in cache.iterdir() if not p.name.startswith(".")]  # no version directory


def _prepare_cmd(repo: Path, cache: Path, workers: int) -> list[str]:
    code = (
        "from pathlib import Path\n"
        "from tests.infra.data_helpers import demo_sources, make_spec\n"
        "from pipelines.dataprep.prepare import prepare_data\n"
        f"spec = make_spec(demo_sources(), task_bytes={SMALL_TASKS})\n"
        f"p = prepare_data(spec.data, Path({str(repo)!r}), cache_root=Path({str(cache)!r}), progress=False,"
        f" workers={workers})\n"
        "print(p.version)\n"
    )
    return [sys.executable, "-c", code]


def test_sigkill_then_rerun_skips_finished_tasks_and_is_bit_identical(demo_repo: Path, one_worker: PreparedData,
                                                                       tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    build = cache / f".build-{one_worker.version}"
    proc = subprocess.Popen(_prepare_cmd(demo_repo, cache, 2), cwd=REPO, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # A random point of the whole run: after k of the 3 x T task completions (scan, dedup, the
    # driver's merge, tokenize); DATA_KILL_AT_TASK=k replays one.
    total = 3 * one_worker.params["tasks"]
    target = int(os.environ.get("DATA_KILL_AT_TASK", 0)) or random.Random().randint(3, total - 3)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list(build.glob("*/logs/completions/*"))) >= target:
            break
        time.sleep(0.02)
    assert proc.poll() is None, f"the preparation finished before {target} tasks could be counted"
    os.killpg(proc.pid, signal.SIGKILL)  # the whole job: driver and every worker, mid-write
    proc.wait()
    done_before = {str(p.relative_to(build)) for p in build.glob("*/logs/completions/*")}
    assert done_before and not (cache / one_worker.version).exists()
    with pytest.raises(DataError):
        PreparedData.open(cache / one_worker.version)

    # The rerun in this process (the same call as the killed one's; no interpreter to start).
    spec = make_spec(demo_sources(), task_bytes=SMALL_TASKS)
    rerun = prepare_data(spec.data, demo_repo, cache_root=cache, progress=False, workers=2)
    assert rerun.version == one_worker.version
    started = [json.loads(line) for line in (cache / ".logs" / one_worker.version / "task-starts.jsonl")
               .read_text().splitlines()]
    redone = {f"{s['stage']}/logs/completions/{s['rank']:05d}" for s in started if s["run"] == 2}
    assert not redone & done_before, (target, sorted(redone & done_before))
    resumed = PreparedData.open(cache / one_worker.version)
    assert manifest_files(resumed) == manifest_files(one_worker)


def test_near_duplicates_are_removed_across_shards_when_asked(tmp_path: Path) -> None:
    words = [f"w{k}" for k in range(5000)]
    base = [" ".join(random.Random(i).choices(words, k=80)) + f" the end {i}" for i in range(120)]  # unrelated
    near = [t.replace(" the ", " a ", 1) + " extra" for t in base[:25]]  # one word changed, one added
    texts = base + near + base[:5]  # 25 near copies, 5 exact copies, in later byte ranges
    write_jsonl(tmp_path / "data/n.jsonl", texts)
    sources = [{"name": "n", "path": "data/n.jsonl", "weight": 1.0}]
    off = prepare_data(make_spec(sources, task_bytes=4096).data, tmp_path, progress=False)
    assert off.stats["n"]["duplicates_dropped"] == 5 and off.stats["n"]["near_duplicates_dropped"] == 0
    on = prepare_data(make_spec(sources, task_bytes=4096, near_dedup=True).data, tmp_path, progress=False)
    st = on.stats["n"]
    assert on.version != off.version
    assert st["duplicates_dropped"] == 5 and st["near_duplicates_dropped"] == 25 and st["documents"] == 120
    again = prepare_data(make_spec(sources, task_bytes=4096, near_dedup=True).data, tmp_path,
                         cache_root=tmp_path / "c2", progress=False, workers=2)
    assert manifest_files(again) == manifest_files(on)
