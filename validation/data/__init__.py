"""Prepared data as its readers see it: the on-disk format, the mixture schedule, profiles, checks.

Below both the trainer and the PR checks (`validation/` never imports `trainer`). Imports
numpy and tokenizers only (never torch); great-expectations only inside `checks`.
Preparation itself (reading sources, cleaning, dedup, tokenizing on local or Slurm
executors) is orchestration: `pipelines.dataprep`.

  prepared  `PreparedData`: a verified data version (manifest, shards, tokenizer, stats)
  mixture   `MixtureSchedule`: which source each global row comes from
  profile   token profiles, histograms, divergences
  checks    the data checks of a PR (great-expectations), written as JSON, markdown and HTML

    schedule = MixtureSchedule(prepared, spec.data.weights(), global_rows, seed)
    run_data_checks(spec, prepared, baseline=...)             # validation.data.checks

The trainer's row builder (`trainer.batches.MixtureBatcher`) builds on `MixtureSchedule`.
"""

from validation.data.mixture import MixtureSchedule
from validation.data.prepared import PreparedData

__all__ = [
    "MixtureSchedule",
    "PreparedData",
]
