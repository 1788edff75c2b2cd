"""Loss and grad norm stay on the device between log intervals (issue 12, part 5): the tiny
golden run with the deferred reads forced on the CPU gives every step the loss of per-step reads."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")


def _run_tiny(tmp: Any, log_interval: int) -> tuple[dict[int, float], dict[int, float]]:
    """tests/infra/golden_run.py's tiny run with another log interval: (per-step losses from
    the rank-0 log, train/loss from metrics.jsonl)."""
    import json
    import os
    import re

    from pipelines.dataprep.prepare import prepare_data
    from tests.infra.golden_run import REPO, tiny_spec, train_losses, write_corpus
    from trainer.entry import main
    from validation.spec import DataSpec

    corpus = write_corpus(tmp / "corpus")
    spec = tiny_spec(corpus)
    spec["train"]["log_interval"] = log_interval
    os.environ["PIPELINE_DATA_ROOTS"] = str(tmp / "corpus")
    prepared = prepare_data(DataSpec.model_validate(spec["data"]), REPO, tmp / "cache", progress=False)
    run_dir = tmp / "run"
    run_dir.mkdir()
    (run_dir / "spec.resolved.json").write_text(json.dumps(spec))
    code = main(["--spec", str(run_dir / "spec.resolved.json"), "--run-dir", str(run_dir),
                 "--data-dir", str(prepared.path), "--tracking-uri", "none"])
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert code == 0, log[-3000:]
    per_step = {int(m[1]): float(m[2]) for m in re.finditer(r"step=(\d+) loss=([-+.\deEna]+) ", log)}
    return per_step, train_losses(run_dir)


def test_deferred_reads_give_every_step_the_same_loss_as_per_step_reads(tmp_path: Any, monkeypatch: Any) -> None:
    # The GPU path (loss and grad norm read once per log interval, a non-finite step skipped by the
    # fused AdamW on the device) forced on the CPU, log interval 4: every step's loss still reaches
    # the log and the detector, bitwise equal to the run that reads every step.
    monkeypatch.setenv("PIPELINE_DATA_ROOTS", "")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        eager, eager_metrics = _run_tiny(tmp_path / "eager", 4)
        monkeypatch.setenv("TRAINER_DEFER_STEP_METRICS", "1")
        deferred, deferred_metrics = _run_tiny(tmp_path / "deferred", 4)
    finally:
        torch.set_num_threads(threads)
    assert len(eager) >= 8 and sorted(eager) == list(range(1, len(eager) + 1))
    assert deferred == eager
    assert deferred_metrics == eager_metrics and sorted(eager_metrics) == [s for s in eager if s % 4 == 0
                                                                           or s == max(eager)]
