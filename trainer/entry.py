"""Thin entry point of the execution layer: parse, build, run, close.

Exit codes: 0 finished; 5 failed or stopped (see result.json); 14 failed before the first
step (startup: the same error would repeat, so launchers do not relaunch; result.json names
the first error line); 143 preempted by SIGTERM after saving a checkpoint (orchestration
resumes the run); 2 bad arguments.
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


# A failure before the first step whose message says the machinery, not the job, broke
# (a peer lost during rendezvous, a store timeout) is still relaunched.
TRANSIENT_WORDS = ("connection reset", "connection refused", "connection closed", "timed out", "timeout",
                   "broken pipe", "rendezvous", "nccl", "address already in use", "peer")


def first_error_line(exc: BaseException) -> str:
    """`Type: first line of the message`: what the console and the PR comment show."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def record_startup_failure(run_dir: Path, exc: BaseException, hint: str = "") -> bool:
    """Write result.json "failed" / "startup_failure" for a deterministic failure before the
    first step (each rank may; the same content, atomic), with `hint` after the first error
    line. Returns False for a transient one."""
    import os
    import time

    from trainer.record import write_result

    line = first_error_line(exc)
    if any(word in line.lower() for word in TRANSIENT_WORDS):
        return False
    line += f" ({hint})" if hint else ""
    rank = os.environ.get("RANK", "0")
    result = {"status": "failed", "stop_reason": "startup_failure", "error": line,
              "reason": f"failed before the first step on rank {rank}: {line}", "rank": int(rank),
              "finished_unix": time.time()}
    try:
        write_result(run_dir, result)  # every rank may: the same content, each its own temporary file
    except OSError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """Run the job; a deterministic failure before the first step exits 14 (not relaunched)."""
    import traceback

    args = parse_args(argv)
    state: dict[str, object] = {"trainer": None}
    try:
        return _main(args, state)
    except Exception as exc:  # noqa: BLE001 - classified: startup (deterministic) or a crash (retried)
        startup = state.get("joined") and not _started(state)
        hint = _tp_hint(state.get("spec")) if startup else ""
        if startup and record_startup_failure(args.run_dir, exc, hint):
            traceback.print_exc()
            print(f"error: failed before the first step: {first_error_line(exc)}{f' ({hint})' if hint else ''} "
                  "(not relaunched: it would fail the same way)", file=sys.stderr)
            return 14
        raise


def _tp_hint(spec: object) -> str:
    """Under tensor parallelism, which module the architecture's tp_plan forgets (or "")."""
    if spec is None or spec.parallel_layout().tp <= 1:  # type: ignore[attr-defined]
        return ""
    from trainer.contract_checks import tp_plan_hint

    return tp_plan_hint(spec.model)  # type: ignore[attr-defined]


def _main(args: argparse.Namespace, state: dict[str, object]) -> int:
    from basics.environment import apply_offline_env

    apply_offline_env()
    from basics.errors import PipelineError

    try:
        from validation.resolved import load_resolved  # imports every file under models/
    except Exception as exc:  # a broken architecture file: deterministic, never relaunched
        from models import PluginError

        if not isinstance(exc, PluginError):
            raise
        state["joined"] = True
        raise

    try:
        # The resolve step's output: the spec to run (seed set, layout explicit and checked
        # against the execution capability) and the facts derived from it.
        resolved = load_resolved(args.spec, REPO_ROOT)
    except PipelineError as exc:
        print(f"error: cannot read spec {args.spec}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    spec = resolved.spec
    from trainer.mlflow_endpoint import default_tracking_uri

    uri = args.tracking_uri or default_tracking_uri(REPO_ROOT)
    try:
        from trainer.runlock import join_job

        # Before anything is written: one job per run directory, and die with the launcher.
        join_job(args.run_dir)
        state["joined"] = True
        from trainer.loop import Trainer

        overfit = False
        if args.smoke:
            from trainer.smoke import resolve_smoke
            from validation.data.prepared import PreparedData

            resolved = resolve_smoke(resolved, PreparedData.open(args.data_dir, verify=False).vocab_size)
            spec = resolved.spec
            overfit = True
        state["spec"] = spec
        trainer = Trainer(spec, args.run_dir, args.data_dir, tracking_uri=uri, overfit_one_batch=overfit,
                          peak=resolved.compute.peak.device(), repo_root=Path(resolved.repo_root))
        state["trainer"] = trainer
        _, code = trainer.run()
        return code
    except Exception as exc:  # noqa: BLE001 - a full disk anywhere (checkpoint, export) is classified
        from basics.errors import DiskSpaceError
        from trainer.diskfull import disk_full_error, is_disk_full, record_disk_full

        if not isinstance(exc, DiskSpaceError) and is_disk_full(exc):
            exc = disk_full_error(args.run_dir, "export" if ".model.tmp" in str(exc) else "run's files", exc)
        if isinstance(exc, DiskSpaceError):
            record_disk_full(args.run_dir, exc)  # result.json "failed"/"disk_full": not relaunched
        elif state.get("joined") and not _started(state):
            raise  # before the first step: `main` classifies it (startup failure or transient)
        if not isinstance(exc, PipelineError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


def _started(state: dict[str, object]) -> bool:
    """Whether this attempt completed a training step (after that, a crash is relaunched)."""
    trainer = state.get("trainer")
    return trainer is not None and bool(getattr(trainer, "step_losses", None))
