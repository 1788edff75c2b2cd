"""The YAML loader: locations, `extends` chains, data roots, every problem at once.

Each test builds a tiny repository in a temporary directory (an `experiments/` folder
with a copy of the real `base.yaml`), so paths and the repository root are realistic.
The hostile-input corpus lives in `tests/bad_specs/` (see test_spec_cli.py).
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from basics.errors import SpecError
from basics.paths import find_repo_root
from validation.extends import deep_merge
from validation.loader import check_spec, load_located, load_spec
from validation.yaml_source import MAX_FILE_BYTES, dotted, parse_dotted

REPO = Path(__file__).resolve().parents[2]
HYPOTHESIS = """\
hypothesis:
  statement: A single change to the base experiment should lower the held-out loss measurably.
  metric: eval/loss
  direction: decrease
  min_effect: 0.01
  baseline: base
"""


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "experiments").mkdir()
    (tmp_path / "data" / "demo").mkdir(parents=True)
    shutil.copy(REPO / "experiments" / "base.yaml", tmp_path / "experiments" / "base.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PIPELINE_DATA_ROOTS", raising=False)
    return tmp_path


def write(
    repo: Path, name: str, body: str, *, extends: str | None = "base.yaml", hypothesis: bool = True
) -> Path:
    head = f"name: {Path(name).stem}\n" + (f"extends: {extends}\n" if extends else "")
    text = head + (HYPOTHESIS if hypothesis else "") + textwrap.dedent(body)
    path = repo / "experiments" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def issues_of(path: Path) -> list[str]:
    spec, issues = check_spec(path)
    assert (spec is None) == bool(issues)
    return [i.text() for i in issues]


# --------------------------------------------------------------------------- basics


def test_base_loads_into_a_frozen_spec(repo: Path):
    spec = load_spec(repo / "experiments" / "base.yaml")
    assert spec.name == "base" and spec.hypothesis.baseline == "champion"
    with pytest.raises(ValidationError):
        spec.name = "other"  # type: ignore[misc]


def test_every_problem_is_reported_at_once_in_line_order(repo: Path):
    path = write(
        repo,
        "many.yaml",
        """\
        model:
          hidden_size: wide
          num_layrs: 4
        train:
          lr: -1
        """,
    )
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert [i.text() for i in caught.value.issues] == [
        "experiments/many.yaml:10:16: model.hidden_size: must be a whole number from 8 to 65,536, got 'wide'",
        "experiments/many.yaml:11:3: model.num_layrs: unknown key 'num_layrs'; did you mean 'num_layers'?",
        "experiments/many.yaml:13:7: train.lr: must be a number above 0 and at most 1, got -1",
    ]
    assert str(caught.value).count("\n") == 2


def test_missing_field_points_at_its_parent_mapping(repo: Path):
    text = (repo / "experiments" / "base.yaml").read_text().replace("  direction: decrease\n", "")
    (repo / "experiments" / "nodir.yaml").write_text(text.replace("name: base", "name: nodir"))
    hyp_line = text.splitlines().index("hypothesis:") + 1
    assert issues_of(repo / "experiments" / "nodir.yaml") == [
        f"experiments/nodir.yaml:{hyp_line}:1: hypothesis.direction: required field 'direction' is missing"
    ]


def test_flow_style_values_are_located_too(repo: Path):
    path = write(repo, "flow.yaml", "parallel: {dp: 1, tp: 1, pp: two}\n")
    assert issues_of(path) == [
        "experiments/flow.yaml:9:30: parallel.pp: must be a whole number from 1 to 512, got 'two'"
    ]


def test_dates_stay_strings_and_bom_and_crlf_are_fine(repo: Path):
    path = write(repo, "dated.yaml", "description: 2026-11-30\n")
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"\n", b"\r\n"))
    assert load_spec(path).description == "2026-11-30"


def test_file_size_limit_is_checked_before_reading(repo: Path):
    path = write(
        repo, "big.yaml", "description: >\n" + ("  words words words\n" * (MAX_FILE_BYTES // 19 + 10))
    )
    (issue,) = check_spec(path)[1]
    assert (issue.field, issue.line) == ("<file>", 1) and "the limit is 256 KiB" in issue.message


def test_non_utf8_reports_line_and_column_of_the_bad_byte(repo: Path):
    path = repo / "experiments" / "bad-bytes.yaml"
    path.write_bytes(b"name: bad-bytes\nowner: ok\ndescription: na\xefve\n")
    (issue,) = check_spec(path)[1]
    assert (issue.line, issue.col) == (3, 16)
    assert "not valid UTF-8 (byte 0xef" in issue.message


def test_load_spec_accepts_str_paths_and_explicit_repo_root(
    repo: Path, tmp_path_factory: pytest.TempPathFactory
):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    text = (repo / "experiments" / "base.yaml").read_text()
    (elsewhere / "base.yaml").write_text(text)
    # Outside any repository: the data root is <repo_root>/data, so point it at ours.
    assert load_spec(str(elsewhere / "base.yaml"), repo_root=repo).name == "base"
    assert find_repo_root(repo / "experiments" / "base.yaml") == repo.resolve()


# --------------------------------------------------------------------------- name and hypothesis


def test_name_must_match_file_stem_and_is_never_inherited(repo: Path):
    path = write(repo, "renamed.yaml", "")
    path.write_text(path.read_text().replace("name: renamed", "name: something-else"))
    assert issues_of(path) == [
        "experiments/renamed.yaml:1:7: name: 'something-else' must equal the file name 'renamed'"
    ]
    path.write_text("\n".join(path.read_text().splitlines()[1:]) + "\n")
    assert issues_of(path) == [
        "experiments/renamed.yaml:1:1: name: required field 'name' is missing; set `name: renamed` (the file name)"
    ]


def test_hypothesis_must_be_stated_not_inherited(repo: Path):
    path = write(repo, "lazy.yaml", "train:\n  lr: 0.004\n", hypothesis=False)
    assert issues_of(path) == [
        "experiments/lazy.yaml:1:1: hypothesis.statement: inherited from experiments/base.yaml; "
        "state what this experiment tests"
    ]


def test_baseline_must_name_an_existing_experiment(repo: Path):
    path = write(repo, "cand.yaml", "")
    path.write_text(path.read_text().replace("baseline: base", "baseline: bsae"))
    (issue,) = check_spec(path)[1]
    assert issue.field == "hypothesis.baseline" and "did you mean 'base'?" in issue.message


# --------------------------------------------------------------------------- extends


def test_extends_merges_mappings_and_replaces_lists(repo: Path):
    path = write(
        repo,
        "mix.yaml",
        """\
        model:
          num_layers: 2
        data:
          sources:
            - {name: code, path: data/demo/code.jsonl, weight: 1.0}
        """,
    )
    spec = load_spec(path)
    assert spec.model.num_layers == 2 and spec.model.hidden_size == 128  # merged
    assert [s.name for s in spec.data.sources] == ["code"]  # replaced
    assert spec.extends == "base.yaml" and spec.name == "mix"


def test_null_in_the_child_replaces_the_base_value(repo: Path):
    path = write(repo, "nokv.yaml", "model:\n  num_kv_heads: null\n")
    assert load_spec(path).model.num_kv_heads is None


def test_chain_of_five_is_allowed_and_locations_follow_each_file(repo: Path):
    previous = "base.yaml"
    for i in range(1, 5):
        (repo / "experiments" / f"link-{i}.yaml").write_text(f"extends: {previous}\ntrain:\n  seed: {i}\n")
        previous = f"link-{i}.yaml"
    path = write(repo, "top.yaml", "", extends=previous)
    spec = load_spec(path)  # top -> link-4 -> ... -> link-1 -> base: five hops
    assert spec.train.seed == 4
    loaded = load_located(path)
    assert loaded.locate("train.seed") == ("experiments/link-4.yaml", 3, 9)
    assert loaded.locate("model.hidden_size")[0] == "experiments/base.yaml"
    assert [p.name for p in loaded.files] == [
        "top.yaml",
        "link-4.yaml",
        "link-3.yaml",
        "link-2.yaml",
        "link-1.yaml",
        "base.yaml",
    ]


def test_errors_are_located_in_the_file_that_set_the_value(repo: Path):
    (repo / "experiments" / "mid.yaml").write_text("extends: base.yaml\nmodel:\n  num_layers: many\n")
    path = write(repo, "leaf.yaml", "train:\n  lr: zero\n", extends="mid.yaml")
    assert issues_of(path) == [
        "experiments/leaf.yaml:10:7: train.lr: must be a number above 0 and at most 1, got 'zero'",
        "experiments/mid.yaml:3:15: model.num_layers: must be a whole number from 1 to 512, got 'many'",
    ]


def test_extends_may_not_leave_the_experiments_directory(repo: Path):
    (repo / "shared.yaml").write_text((repo / "experiments" / "base.yaml").read_text())
    path = write(repo, "escape.yaml", "", extends="../shared.yaml")
    assert issues_of(path) == [
        "experiments/escape.yaml:2:10: extends: '../shared.yaml' points outside the experiments directory"
    ]


def test_extends_through_a_symlink_out_of_the_directory_is_refused(
    repo: Path, tmp_path_factory: pytest.TempPathFactory
):
    outside = tmp_path_factory.mktemp("outside") / "base.yaml"
    outside.write_text((repo / "experiments" / "base.yaml").read_text())
    (repo / "experiments" / "link.yaml").symlink_to(outside)
    path = write(repo, "via-link.yaml", "", extends="link.yaml")
    (issue,) = check_spec(path)[1]
    assert issue.field == "extends" and "outside the experiments directory" in issue.message


def test_cycle_is_reported_on_the_validated_files_extends_line(repo: Path):
    (repo / "experiments" / "loop-b.yaml").write_text("extends: loop-a.yaml\n")
    path = write(repo, "loop-a.yaml", "", extends="loop-b.yaml")
    assert issues_of(path) == [
        "experiments/loop-a.yaml:2:10: extends: extends cycle: loop-a.yaml -> loop-b.yaml -> loop-a.yaml"
    ]


# --------------------------------------------------------------------------- data roots


def test_data_paths_must_stay_inside_a_data_root(
    repo: Path, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
):
    external = tmp_path_factory.mktemp("datasets")
    (repo / "data" / "ext").symlink_to(external)
    body = "data:\n  sources:\n    - {name: code, path: data/ext/*.jsonl, weight: 1.0}\n"
    path = write(repo, "ext.yaml", body)
    (issue,) = check_spec(path)[1]
    assert issue.field == "data.sources[0].path" and "must be inside a data root" in issue.message

    monkeypatch.setenv("PIPELINE_DATA_ROOTS", str(external))
    assert load_spec(path).data.sources[0].path == "data/ext/*.jsonl"
    # An absolute path is fine only inside a configured root.
    path.write_text(path.read_text().replace("data/ext/*.jsonl", f"{external}/code.jsonl"))
    assert load_spec(path).data.sources[0].path == f"{external}/code.jsonl"
    path.write_text(path.read_text().replace(f"{external}/code.jsonl", "/etc/passwd"))
    (issue,) = check_spec(path)[1]
    assert "absolute path outside the data roots" in issue.message


def test_glob_paths_inside_the_data_root_are_accepted(repo: Path):
    body = "data:\n  sources:\n    - {name: code, path: data/demo/**/*.jsonl, weight: 1.0}\n"
    assert load_spec(write(repo, "globbed.yaml", body)).data.sources[0].path == "data/demo/**/*.jsonl"


# --------------------------------------------------------------------------- helpers


def test_dotted_paths_round_trip():
    for path in [("data", "sources", 2, "weight"), ("model",), ("a", 0, 1, "b")]:
        assert parse_dotted(dotted(path)) == path
    assert dotted(("data", "sources", 2, "weight")) == "data.sources[2].weight"


def test_deep_merge_semantics():
    base = {"a": {"x": 1, "y": [1, 2]}, "b": 1}
    assert deep_merge(base, {"a": {"y": [3]}, "c": None}) == {"a": {"x": 1, "y": [3]}, "b": 1, "c": None}
    assert base == {"a": {"x": 1, "y": [1, 2]}, "b": 1}  # inputs untouched


def test_locate_falls_back_to_the_nearest_set_ancestor(repo: Path):
    loaded = load_located(repo / "experiments" / "base.yaml")
    file, line, _ = loaded.locate("resource.rendezvous")
    text = (repo / "experiments" / "base.yaml").read_text().splitlines()
    assert file == "experiments/base.yaml" and text[line - 1] == "resource:"


def test_issues_do_not_depend_on_libyaml(monkeypatch: pytest.MonkeyPatch):
    """The C parser is only a speed-up: the pure-Python parser reports the very same issues."""
    import validation.yaml_source as yaml_source

    monkeypatch.chdir(REPO)
    files = sorted((REPO / "tests" / "bad_specs").glob("*.yaml"))
    files = [f for f in files if f.name != "cases.yaml"] + sorted((REPO / "experiments").glob("*.yaml"))
    with_c = [check_spec(f)[1] for f in files]
    monkeypatch.setattr(yaml_source, "_FastLocatingLoader", None)
    assert [check_spec(f)[1] for f in files] == with_c
