"""On a CUDA device: the trainer in bf16 on the GPU, loss finite and falling, throughput and MFU
recorded against the device's peak. Skipped (saying why) where no CUDA device is visible."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def test_trainer_bf16_on_cuda(tmp_path: Path) -> None:
    from pipelines.dataprep.demo_corpus import build_demo_corpus
    from pipelines.dataprep.prepare import prepare_data
    from trainer.loop import Trainer
    from validation.spec import ExperimentSpec

    build_demo_corpus(tmp_path / "data" / "demo", max_bytes=300_000)
    spec = ExperimentSpec.model_validate({
        "name": "gpu-check", "owner": "ml-platform",
        "hypothesis": {"statement": "A small llama in bf16 on one GPU trains with a falling loss.",
                       "metric": "eval/loss", "direction": "decrease", "min_effect": 0.01, "baseline": "champion"},
        "model": {"model_type": "llama", "hidden_size": 256, "num_layers": 4, "num_heads": 4, "vocab_size": 1024},
        "data": {"sources": [{"name": "code", "path": "data/demo/code.jsonl", "weight": 1.0}], "seq_len": 256,
                 "tokenizer": {"kind": "bpe", "vocab_size": 1024}},
        "train": {"max_steps": 40, "micro_batch_size": 16, "precision": "bf16", "eval_interval": 40,
                  "checkpoint_interval": 40, "log_interval": 5, "warmup_steps": 5},
        "resource": {"gpus_per_node": 1, "gpu_type": "h100", "gpu_memory_gb": 80},
    })
    prepared = prepare_data(spec.data, tmp_path, progress=False)
    result, code = Trainer(spec, tmp_path / "run", prepared.path, tracking_uri="none", prepared=prepared).run()
    assert code == 0 and result["status"] == "finished"
    fm = result["final_metrics"]
    assert math.isfinite(fm["eval/loss"]) and fm["perf/tokens_per_s"] > 0 and 0 < fm["perf/mfu"] < 1
