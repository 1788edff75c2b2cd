"""Training rows: packed, mixture-weighted micro-batches and deterministic evaluation rows.

The data layer itself (preparation, prepared data, the mixture schedule, profiles, checks)
lives below the trainer in `validation.data`; this package builds the rows the model sees
on top of it, and re-exports what the trainer reads, so the trainer imports one place.

    batcher = MixtureBatcher(prepared, spec.data.weights(), seq_len, micro, accum, seed, rank, world)
    batch = batcher.batch(step, micro_step)                  # np.int64 input_ids/labels/position_ids
    for batch in eval_batches(prepared, "docs", seq_len, batch_size, max_batches): ...
"""

from trainer.data.batcher import IGNORE_INDEX, MixtureBatcher, eval_batches, packing_efficiency
from validation.data import DEMO_SOURCES, PreparedData, build_demo_corpus, compute_version, prepare_data

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
