"""`python -m trainer --spec RUN/spec.resolved.json --run-dir RUN --data-dir CACHE` (every rank)."""

from trainer.entry import main

raise SystemExit(main())
