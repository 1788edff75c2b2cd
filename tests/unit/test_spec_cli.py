"""`pipeline validate | plan | schema` on the command line, and the corpus of bad experiment files.

Every file in `tests/bad_specs/` is a hostile or broken experiment with its expected
issue in `tests/bad_specs/cases.yaml` (field, line, message substring). Each runs
through the real command (in process, via typer's CliRunner, so the corpus stays
cheap) and must exit 2 with exactly that one-line message, no traceback, and leave
the directory untouched.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from pipelines import cmd_validate

REPO = Path(__file__).resolve().parents[2]
BAD = REPO / "tests" / "bad_specs"
CASES: dict[str, dict] = yaml.safe_load((BAD / "cases.yaml").read_text(encoding="utf-8"))
EXAMPLES = sorted((REPO / "experiments").glob("*.yaml"))
ISSUE_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): (?P<field>\S+): (?P<message>.+)$")


def _app() -> typer.Typer:
    # Only this area's commands: the corpus must not depend on other areas' modules.
    app = typer.Typer()
    cmd_validate.register(app)
    return app


def _run(*args: str):
    return CliRunner().invoke(_app(), list(args))


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
    }


# --------------------------------------------------------------------------- the bad corpus


def test_corpus_is_large_and_every_file_has_an_expectation():
    files = {p.name for p in BAD.glob("*.yaml")} - {"cases.yaml"}
    assert files == set(CASES), (
        f"files without expectations: {files - set(CASES)}; stale: {set(CASES) - files}"
    )
    assert len(CASES) >= 60


@pytest.mark.parametrize("case", sorted(CASES), ids=lambda c: c.removesuffix(".yaml"))
def test_bad_spec_is_rejected_with_field_and_line(case: str, monkeypatch: pytest.MonkeyPatch):
    expected = CASES[case]
    monkeypatch.chdir(REPO)
    before = _tree(BAD)
    result = _run("validate", f"tests/bad_specs/{case}")
    assert _tree(BAD) == before, "validate wrote into the directory"
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stdout.splitlines()
    assert len(lines) == expected.get("count", 1), result.stdout
    where = f"tests/bad_specs/{expected.get('where', case)}"
    matches = [m for m in map(ISSUE_LINE.match, lines) if m]
    assert len(matches) == len(lines), f"not all lines are path:line:col: field: message\n{result.stdout}"
    assert any(
        m["file"] == where
        and m["field"] == expected["field"]
        and int(m["line"]) == expected["line"]
        and expected["message"] in m["message"]
        for m in matches
    ), (
        f"expected {where}:{expected['line']}: {expected['field']}: ...{expected['message']}...\ngot:\n{result.stdout}"
    )


def test_all_bad_files_at_once_report_every_file(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)
    files = [f"tests/bad_specs/{c}" for c in sorted(CASES)]
    result = _run("validate", "--format", "json", *files)
    assert result.exit_code == 2
    payload = json.loads(result.stdout)
    assert payload["ok"] is False
    assert [f["file"] for f in payload["files"]] == files
    assert all(not f["ok"] and f["issues"] for f in payload["files"])
    # Every message in the project's words: pydantic's phrasing and raw patterns never leak.
    messages = [i["message"] for f in payload["files"] for i in f["issues"]]
    leaked = [m for m in messages if re.search(r"Input should|String should|List should|pattern '|\^\(", m)]
    assert leaked == []


# --------------------------------------------------------------------------- output formats


def test_examples_validate_with_exit_0(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)
    result = _run("validate", *[str(p.relative_to(REPO)) for p in EXAMPLES])
    assert result.exit_code == 0, result.output
    assert [line.split()[0] for line in result.stdout.splitlines()] == ["ok"] * len(EXAMPLES)


def test_github_format_prints_workflow_annotations(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)
    result = _run("validate", "--format", "github", "tests/bad_specs/unknown-model-key.yaml")
    assert result.exit_code == 2
    assert result.stdout.splitlines() == [
        "::error file=tests/bad_specs/unknown-model-key.yaml,line=11,col=3,title=model.hidn_size::"
        "model.hidn_size: unknown key 'hidn_size'; did you mean 'hidden_size'?"
    ]


def test_json_format_lists_issues_and_hashes(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)
    result = _run("validate", "-f", "json", "experiments/base.yaml", "tests/bad_specs/lr-nan.yaml")
    assert result.exit_code == 2
    payload = json.loads(result.stdout)
    good, bad = payload["files"]
    assert good["ok"] and good["name"] == "base" and re.fullmatch(r"[0-9a-f]{16}", good["spec_hash"])
    assert bad["issues"] == [
        {
            "file": "tests/bad_specs/lr-nan.yaml",
            "line": 11,
            "col": 7,
            "field": "train.lr",
            "message": "non-finite number '.nan' is not allowed",
        }
    ]


def test_missing_file_is_one_line_exit_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.chdir(tmp_path)
    result = _run("validate", "nope.yaml")
    assert result.exit_code == 2
    assert result.stdout == "nope.yaml:1:1: <file>: no such file\n"


def test_unknown_format_is_a_usage_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)
    result = _run("validate", "--format", "xml", "experiments/base.yaml")
    assert result.exit_code == 2
    assert "Traceback" not in result.output


# --------------------------------------------------------------------------- plan and schema


def test_plan_json_shows_only_changed_fields_against_the_baseline(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)
    result = _run("plan", "experiments/higher-lr.yaml", "--format", "json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["experiment"] == "higher-lr"
    assert plan["changes"] == [{"field": "train.lr", "from": 0.003, "to": 0.006}]
    assert plan["compared_with"].startswith("base ")
    assert plan["resolved"]["train"]["lr"] == 0.006


def test_plan_text_has_diff_and_the_resolved_spec_only_when_asked(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)
    result = _run("plan", "experiments/more-code.yaml")
    assert result.exit_code == 0, result.output
    assert "  data.sources[0].weight: 0.4 -> 0.6" in result.stdout
    assert "resolved spec:" not in result.stdout and "--resolved" in result.stdout
    assert "model.hidden_size" not in result.stdout  # unchanged fields are not listed
    full = _run("plan", "experiments/more-code.yaml", "--resolved")
    assert full.exit_code == 0, full.output
    assert full.stdout.startswith(result.stdout.split("\n(`--resolved`")[0])
    assert "resolved spec:" in full.stdout and "  model:" in full.stdout


def test_plan_of_bad_file_prints_issues_exit_2(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)
    result = _run("plan", "tests/bad_specs/weights-not-summing.yaml")
    assert result.exit_code == 2
    line = CASES["weights-not-summing.yaml"]["line"]
    assert result.stdout.startswith(
        f"tests/bad_specs/weights-not-summing.yaml:{line}:3: data.sources: mixture weights"
    )


def test_diff_specs_compares_leaves_and_list_items():
    before = {"name": "a", "train": {"lr": 1, "seed": 2}, "data": {"sources": [{"w": 1}, {"w": 2}]}}
    after = {"name": "b", "train": {"lr": 1, "seed": 3}, "data": {"sources": [{"w": 1}]}}
    assert cmd_validate.diff_specs(before, after) == [
        ("train.seed", 2, 3),
        ("data.sources[1].w", 2, "<unset>"),
    ]


def test_schema_check_passes_on_committed_file_and_fails_on_stale(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.chdir(REPO)
    assert _run("schema", "--check").exit_code == 0
    stale = tmp_path / "schema.json"
    stale.write_text("{}\n")
    assert _run("schema", "--check", "--output", str(stale)).exit_code == 1
    assert _run("schema", "--output", str(stale)).exit_code == 0
    assert _run("schema", "--check", "--output", str(stale)).exit_code == 0


def test_a_directory_means_its_yaml_files(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)
    result = _run("validate", "experiments")
    assert result.exit_code == 0, result.output
    assert [line.split()[1] for line in result.stdout.splitlines()] == [
        str(p.relative_to(REPO)) for p in EXAMPLES
    ]
