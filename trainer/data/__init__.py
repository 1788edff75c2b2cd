"""Data for training: versioned preparation, mixture sampling, document-masked packing.

Imports numpy and tokenizers only (never torch), so preparing and checking data is cheap
to import on any CI runner.

    prepared = prepare_data(spec.data, repo_root)            # idempotent, cached by content
    batcher = MixtureBatcher(prepared, spec.data.weights(), seq_len, micro, accum, seed, rank, world)
    batch = batcher.batch(step, micro_step)                  # np.int64 input_ids/labels/position_ids
    for batch in eval_batches(prepared, "docs", seq_len, batch_size, max_batches): ...
"""

from trainer.data.batcher import IGNORE_INDEX, MixtureBatcher, eval_batches, packing_efficiency
from trainer.data.demo import DEMO_SOURCES, build_demo_corpus
from trainer.data.prepare import compute_version, prepare_data
from trainer.data.prepared import PreparedData

__all__ = [
    "DEMO_SOURCES",
    "IGNORE_INDEX",
    "MixtureBatcher",
    "PreparedData",
    "build_demo_corpus",
    "compute_version",
    "eval_batches",
    "packing_efficiency",
    "prepare_data",
]
