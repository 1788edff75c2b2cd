"""`pipeline contract [FILES...]`: the plug-in contract checks of architecture and optimizer files.

The PR check passes the files a pull request changed (any list: paths that are not plug-ins
are skipped; a helper such as `models/_hf.py` checks every architecture); without FILES every
plug-in is checked. Per architecture: importing it loads no torch (`pipeline validate` stays
fast), the meta-device parameter count, the FLOPs against torch's counter, the TP plan's
module names and rank 0's share of it, a deterministic eval forward, causality (one process
and the TP share), packed rows equal to their documents alone, the state round trip (what a
checkpoint keeps, what training reaches), and an export that says transformers loads it
(trainer/contract_checks.py). Per optimizer: importing it loads no torch, and its
`state_dict()` round trip resumes bitwise. Each failure is one line (`file:line: method: what
to change`, at the culprit's line where it is found, or a workflow annotation with `--format
github`); exit 2 when there is any. torch is imported only after the import-cost probes ran.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer


class ContractFormat(StrEnum):
    text = "text"
    github = "github"


def register(app: typer.Typer) -> None:
    """Add this command to the main app."""
    app.command("contract")(contract)


def contract(
    files: Annotated[list[Path] | None, typer.Argument(
        help="Changed files (plug-ins among them are checked); none: every architecture and optimizer.",
        show_default=False)] = None,
    output_format: Annotated[ContractFormat, typer.Option(
        "--format", "-f", help="text, or github (workflow annotations).")] = ContractFormat.text,
) -> None:
    """Check architecture and optimizer files against the plug-in contract; one line per failure. Exit 2 on any."""
    from basics.errors import SpecError
    from basics.paths import repo_root_from_cwd
    from validation.contract import all_plugins, plugins_touched

    repo = repo_root_from_cwd()
    missing = [f for f in files or [] if not f.exists()]
    if missing:
        typer.echo(f"error: {missing[0]}: no such file", err=True)
        raise typer.Exit(2)
    plugins = plugins_touched([_relative(f, repo) for f in files], repo) if files else all_plugins(repo)
    if not plugins:
        typer.echo(f"contract: no architecture or optimizer file among {len(files or [])} file(s); nothing to check",
                   err=True)
        return
    failures = _run_checks(plugins, repo)
    for failure in failures:
        typer.echo(failure.github() if output_format is ContractFormat.github else failure.text())
    names = ", ".join(p.file for p in plugins)
    typer.echo(f"contract: {len(plugins)} plug-in file(s) ({names}): "
               f"{'ok' if not failures else f'{len(failures)} failure(s)'}", err=True)
    if failures:
        raise typer.Exit(SpecError.exit_code)


def _relative(path: Path, repo: Path) -> str:
    absolute = path if path.is_absolute() else Path.cwd() / path
    try:
        return absolute.resolve().relative_to(repo.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def _run_checks(plugins: list, repo: Path) -> list:
    """Import cost first (fresh interpreters, before this process loads torch), then the rest;
    a file that does not import is reported once, at its line (`models.PluginError`)."""
    from validation.contract import ContractFailure, check_import_cost

    failures: list[ContractFailure] = []
    for plugin in plugins:
        failures += [f for f in check_import_cost(plugin, repo) if not f.message.startswith("cannot import")]
    import models
    from trainer.contract_checks import check_architecture, check_optimizer

    for plugin in plugins:
        kind = plugin.kind == "architecture"
        table = models.architectures() if kind else models.optimizer_configs()
        broken = models.broken_architectures() if kind else models.broken_optimizers()
        if plugin.name in broken:
            error = broken[plugin.name]
            failures.append(ContractFailure(error.file, error.line or 1, "import", error.reason))
        elif plugin.name in table:
            check = check_architecture if kind else check_optimizer
            failures += check(table[plugin.name], plugin.file)
    return failures
