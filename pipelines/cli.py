"""`pipeline`: the command line of the GitOps training pipeline.

Thin entry point: each area registers its commands from its own module, and every
module keeps heavy imports (torch, transformers, mlflow, great_expectations) inside
the command functions, so `pipeline validate` stays fast on any runner.
"""

from __future__ import annotations

import typer

from trainer.tracking import bound_mlflow_http
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
    from pipelines import cmd_data, cmd_github, cmd_report, cmd_run, cmd_train, cmd_validate

    for module in (cmd_validate, cmd_data, cmd_train, cmd_run, cmd_report, cmd_github):
        module.register(app)


_register()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
