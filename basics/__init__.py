"""The basics every layer stands on: errors and exit codes, atomic files, where things live in a
repository, the process environment. Standard library only at import (torch only inside the
environment's accelerator probe), importing none of this project's other packages (the lowest layer: `tests/unit/test_spec_layers.py`), so that `pipeline validate`,
the trainer on every rank and the trusted jobs all read one definition of each.

  errors          the `PipelineError` hierarchy and the one registry of exit codes
  files           the one atomic write and the one file sha256
  paths           where things live: the experiments folder, an experiment's file, the data roots
  environment     offline defaults (`OFFLINE_ENV`, `scoped_environ`), the run's env fingerprint
"""
