"""`pipeline --help` sorts itself by who runs each command (issue 37, item 6): researcher, CI,
operator, each panel with one example, and no `<bool>` placeholder after a flag."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from pipelines.cli import OTHER_PANEL, PANELS, app, command_names


def _help(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_is_in_the_panel_of_who_runs_it_in_that_order():
    registered = [name for name, _ in command_names(app)]
    placed = [name for _, names in PANELS.values() for name in names]
    assert sorted(registered) == sorted(placed), "place a new command in pipelines.cli.PANELS"
    assert all(r.rich_help_panel != OTHER_PANEL for _, r in command_names(app))
    text = _help()
    titles = [re.search(r"╭─ (.+?) ─", line)[1] for line in text.splitlines() if line.startswith("╭─ ")]
    assert titles == ["Options", *(title for title, _ in PANELS.values())]
    for title, _ in PANELS.values():
        assert re.search(r"\(e\.g\. pipeline [a-z-]+ ", title), title  # one example each
    listed = re.findall(r"^│ ([a-z][a-z-]+) ", text, flags=re.M)
    assert listed == [name for name in placed if name in listed] and set(listed) == set(placed)


def test_a_flag_is_shown_without_a_value_placeholder():
    text = _help("plan")
    assert "<bool>" not in text and re.search(r"│ --dry-run +Also build", text)
    assert "<text|json>" in text  # an option that takes a value keeps its values
    assert "<bool>" not in _help() and "<bool>" not in _help("validate")
