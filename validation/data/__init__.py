"""The data layer: versioned preparation, the mixture schedule, profiles, divergences, checks.

Below both the trainer and the PR checks (`validation/` never imports `trainer`). Imports
numpy and tokenizers only (never torch); great-expectations only inside `checks`.

    prepared = prepare_data(spec.data, repo_root)            # idempotent, cached by content
    schedule = MixtureSchedule(prepared, spec.data.weights(), global_rows, seed)
    run_data_checks(spec, prepared, baseline=...)             # validation.data.checks

The trainer's row builder (`trainer.data.MixtureBatcher`) builds on `MixtureSchedule`.
"""

from validation.data.demo import DEMO_SOURCES, build_demo_corpus
from validation.data.mixture import MixtureSchedule
from validation.data.prepare import compute_version, prepare_data
from validation.data.prepared import PreparedData

__all__ = [
    "DEMO_SOURCES",
    "MixtureSchedule",
    "PreparedData",
    "build_demo_corpus",
    "compute_version",
    "prepare_data",
]
