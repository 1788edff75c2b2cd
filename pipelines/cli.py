"""`pipeline`: the command line of the GitOps training pipeline.

Thin entry point: each area registers its commands from its own module, and every
module keeps heavy imports (torch, transformers, mlflow, great_expectations) inside
the command functions, so `pipeline validate` stays fast on any runner.
"""

from __future__ import annotations

import typer

from trainer.mlflow_endpoint import bound_mlflow_http
from validation.environment import apply_offline_env

# MLflow phones home on import unless told not to; every process we start inherits this.
apply_offline_env()
# Every MLflow call of every command (reports, runs, promote) and of the trainers it starts is
# bounded by one policy (timeout, retries): a dead server costs seconds, not minutes.
bound_mlflow_http()

app = typer.Typer(
    name="pipeline",
    help=(
        "GitOps training pipeline: validate and plan experiment YAMLs, prepare and check data, "
        "train with accelerate, compare against the baseline and report on the pull request."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    # Imported here so each module can stay independent; order = order in --help.
    from pipelines import (
        cmd_contract,
        cmd_data,
        cmd_demo,
        cmd_github,
        cmd_report,
        cmd_run,
        cmd_train,
        cmd_validate,
    )

    for module in (cmd_validate, cmd_contract, cmd_data, cmd_train, cmd_run, cmd_demo, cmd_report, cmd_github):
        module.register(app)


try:
    _register()
    _PLUGIN_ERROR: Exception | None = None
except Exception as exc:  # noqa: BLE001 - only a broken file under models/ is expected here
    from models import PluginError

    if not isinstance(exc, PluginError):
        raise
    _PLUGIN_ERROR = exc


def main() -> None:
    import sys

    from models import PluginError

    if _PLUGIN_ERROR is not None:  # one line naming the file and line, exit 2 (the input's fault)
        print(f"error: {_PLUGIN_ERROR}", file=sys.stderr)
        raise SystemExit(2)
    try:
        app()
    except PluginError as exc:  # an architecture or optimizer file that does not import or keep the contract
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
