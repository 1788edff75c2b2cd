"""`pipeline`: the command line of the GitOps training pipeline.

Thin entry point: each area registers its commands from its own module, and every
module keeps heavy imports (torch, transformers, mlflow, great_expectations) inside
the command functions, so `pipeline validate` stays fast on any runner.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperOption

from basics.environment import apply_offline_env
from trainer.mlflow_endpoint import bound_mlflow_http

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
    # Imported here so each module can stay independent; `--help` orders them by PANELS.
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


# `pipeline --help` by who runs each command, one example per panel; a command missing here
# lands in "Other" and `tests/unit/test_cli_help.py` fails until it is placed. Within a panel,
# commands in this order, then command groups (`data`, `runners`: typer lists them last).
PANELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "researcher": (
        "Researcher: write, check and run an experiment (e.g. pipeline plan experiments/higher-lr.yaml)",
        ("validate", "plan", "smoke", "run", "demo", "status", "cancel", "runs", "report", "contract", "schema",
         "data"),
    ),
    "ci": (
        "CI: what the GitHub workflows run (e.g. pipeline validate experiments/*.yaml --format github)",
        ("train", "comment", "chatops", "promote", "attest", "plan-launch", "cancel-training", "job-identity"),
    ),
    "operator": (
        "Operator: machines, runners, the tracking server (e.g. pipeline doctor experiments/base.yaml)",
        ("doctor", "replay-metrics", "runners", "provenance"),
    ),
}
OTHER_PANEL = "Other"


def command_names(typer_app: typer.Typer) -> list[tuple[str, Any]]:
    """(name on the command line, its registration) of every command and command group."""
    found: list[tuple[str, Any]] = []
    for command in typer_app.registered_commands:
        callback_name = command.callback.__name__ if command.callback else ""
        found.append((command.name or callback_name.replace("_", "-"), command))
    for group in typer_app.registered_groups:
        instance = group.typer_instance
        name = group.name if isinstance(group.name, str) else instance.info.name if instance else None
        found.append((str(name), group))
    return found


def _sort_into_panels(typer_app: typer.Typer) -> None:
    """Each command into its panel, the panels in PANELS' order and each command at its place
    in its panel's list (the order a researcher meets them: validate, plan, smoke, run, ...)."""
    order = {name: (rank, place) for rank, (_, names) in enumerate(PANELS.values())
             for place, name in enumerate(names)}
    panel_of = {name: title for title, names in PANELS.values() for name in names}
    named = command_names(typer_app)
    for name, registration in named:
        registration.rich_help_panel = panel_of.get(name, OTHER_PANEL)
    rank = {id(registration): order.get(name, (len(PANELS), 0)) for name, registration in named}
    typer_app.registered_commands.sort(key=lambda c: rank[id(c)])
    typer_app.registered_groups.sort(key=lambda g: rank[id(g)])


def _flag_type(self: TyperOption, ctx: Any) -> str | None:
    """No `<bool>` after a flag: it takes no value (`--dry-run`, not `--dry-run <bool>`)."""
    if self.is_flag and self.metavar is None:
        return None
    return _option_type(self, ctx)


# typer 0.2x prints every option's type, a flag's included; a flag is shown as written.
_option_type = TyperOption.display_type_rich
TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]


try:
    _register()
    _sort_into_panels(app)
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
