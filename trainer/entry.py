"""Thin entry point of the execution layer: parse, build, run, close.

Exit codes: 0 finished; 5 failed or stopped (see result.json); 143 preempted by SIGTERM
after saving a checkpoint (orchestration resumes the run); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__)
    parser.add_argument("--spec", required=True, type=Path, help="RUN/spec.resolved.json")
    parser.add_argument("--run-dir", required=True, type=Path, help="run directory (checkpoints, metrics, result.json)")
    parser.add_argument("--data-dir", required=True, type=Path, help="prepared data cache directory (data/cache/<version>)")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow URI; 'none' disables. Default: $MLFLOW_TRACKING_URI or sqlite:///<repo>/mlflow.db")
    parser.add_argument("--smoke", action="store_true", help="shrunk model, a few dozen steps overfitting one batch")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from validation.environment import apply_offline_env

    apply_offline_env()
    args = parse_args(argv)
    from validation.errors import PipelineError
    from validation.resolved import load_resolved

    try:
        # The resolve step's output: the spec to run (seed set, layout explicit and checked
        # against the execution capability) and the facts derived from it.
        resolved = load_resolved(args.spec, REPO_ROOT)
    except PipelineError as exc:
        print(f"error: cannot read spec {args.spec}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    spec = resolved.spec
    from trainer.tracking import default_tracking_uri

    uri = args.tracking_uri or default_tracking_uri(REPO_ROOT)
    try:
        from trainer.runlock import join_job

        # Before anything is written: one job per run directory, and die with the launcher.
        join_job(args.run_dir)
        from trainer.loop import Trainer

        overfit = False
        if args.smoke:
            from trainer.data import PreparedData
            from trainer.smoke import resolve_smoke

            resolved = resolve_smoke(resolved, PreparedData.open(args.data_dir, verify=False).vocab_size)
            spec = resolved.spec
            overfit = True
        trainer = Trainer(spec, args.run_dir, args.data_dir, tracking_uri=uri, overfit_one_batch=overfit,
                          peak=resolved.compute.peak.device())
        _, code = trainer.run()
        return code
    except Exception as exc:  # noqa: BLE001 - a full disk anywhere (checkpoint, export) is classified
        from trainer.diskfull import disk_full_error, is_disk_full, record_disk_full
        from validation.errors import DiskSpaceError

        if not isinstance(exc, DiskSpaceError) and is_disk_full(exc):
            exc = disk_full_error(args.run_dir, "export" if ".model.tmp" in str(exc) else "run's files", exc)
        if isinstance(exc, DiskSpaceError):
            record_disk_full(args.run_dir, exc)  # result.json "failed"/"disk_full": not relaunched
        if not isinstance(exc, PipelineError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
