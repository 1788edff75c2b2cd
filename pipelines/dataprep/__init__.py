"""Data preparation: source files -> a verified data version in `data/cache/<version>/`.

Orchestration, not configuration: it runs datatrove's local and Slurm executors. What it
writes is read through `validation.data` (the format, the mixture schedule, the checks).
Imports numpy and tokenizers (never torch); datatrove only when tasks run.

  prepare         `prepare_data`: idempotent, resumable, cached by content; merge and assembly
  inputs          `compute_version` (the data version) and `estimate_preparation` (sizes only)
  tasks           the scan, dedup and tokenize tasks; tokenizer cache, heap trim
  executors       datatrove's executors, locally or as Slurm array jobs (`SlurmOptions`)
  sources         reading documents: JSON Lines (.gz, .zst), text, Parquet, Arrow
  clean           text cleaning, document hash, the held-out split rule
  demo_corpus     the demo corpus, built from this interpreter's standard library
  demo_eval_task  the demo's downstream task data, from the held-out demo code

    prepared = prepare_data(spec.data, repo_root)            # pipelines.dataprep.prepare
"""
