"""Every committed experiment file is a test case (like litgpt's config hub tests).

Each must load, carry its own name and a real hypothesis, point editors at the schema,
and plan; the examples that extend `base.yaml` must each change one kind of thing.
The committed `schema.json` must equal what the models generate now.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from pipelines import cmd_validate
from pipelines.cmd_validate import diff_specs
from validation.loader import load_located, load_spec
from validation.schema import experiment_schema, is_current, render_schema

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "experiments"
# The examples this project ships. Only they are held to these rules (one change each, laptop
# sized, extending base.yaml): an experiment a user adds in a pull request is theirs, and
# passes CI whenever `pipeline validate` accepts it (issue 23, part 8).
SHIPPED = ("base", "deeper-narrow", "higher-lr", "more-code", "moe", "muon", "nanogpt", "qknorm")
FILES = [EXPERIMENTS / f"{name}.yaml" for name in SHIPPED]
IDS = list(SHIPPED)


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_experiment_loads_with_its_own_name_and_hypothesis(path: Path):
    loaded = load_located(path)
    assert loaded.issues == []
    spec = loaded.spec
    assert spec is not None and spec.name == path.stem
    # The hypothesis is written in this file, not inherited from a base.
    assert loaded.locate("hypothesis.statement")[0].endswith(path.name)
    assert spec.hypothesis.baseline != spec.name


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_experiment_points_editors_at_the_schema(path: Path):
    text = path.read_text(encoding="utf-8")
    assert (
        text.startswith("# yaml-language-server: $schema=./schema.json\n")
        or "\n$schema: ./schema.json\n" in text
    )


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_experiment_plans(path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)
    app = typer.Typer()
    cmd_validate.register(app)
    result = CliRunner().invoke(app, ["plan", str(path.relative_to(REPO)), "--format", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["experiment"] == path.stem
    try:
        import validation.plan  # noqa: F401
    except ImportError:
        pytest.skip("validation.preflight is not available yet")
    assert plan["preflight"] is not None and plan["preflight_note"] == "ok"


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_experiment_is_small_enough_for_a_laptop(path: Path):
    spec = load_spec(path)
    assert spec.resource.gpus_per_node == 0 and spec.resource.launcher == "local"
    assert spec.model.parameter_count() < 3_000_000
    assert spec.total_steps(1) * spec.global_batch(1) * spec.data.seq_len <= 1_000_000


def test_every_shipped_example_exists():
    assert all(p.is_file() for p in FILES), [p.name for p in FILES if not p.is_file()]


def test_base_is_the_champion_candidate_and_examples_each_change_one_kind_of_thing():
    base = load_spec(EXPERIMENTS / "base.yaml")
    assert base.extends is None and base.hypothesis.baseline == "champion"
    assert [s.name for s in base.data.sources] == ["code", "docs", "reference"]
    changed_sections: dict[str, set[str]] = {}
    for path in FILES:
        spec = load_spec(path)
        if spec.extends is None:
            continue
        assert spec.extends == "base.yaml" and spec.hypothesis.baseline == "base"
        changes = diff_specs(base.resolved_dict(), spec.resolved_dict())
        assert changes, f"{path.name} changes nothing that is trained"
        changed_sections[spec.name] = {field.split(".")[0] for field, _, _ in changes}
    assert len(changed_sections) >= 3
    assert {"data", "model", "train"} <= set().union(*changed_sections.values())
    assert all(len(sections) == 1 for sections in changed_sections.values()), changed_sections


def test_committed_schema_is_current():
    assert is_current(EXPERIMENTS / "schema.json"), "experiments/schema.json is stale: run `pipeline schema`"


def test_schema_is_stable_and_uses_yaml_names():
    assert render_schema() == render_schema()
    schema = experiment_schema()
    assert "$schema" in schema["properties"] and "schema_ref" not in schema["properties"]
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"name", "owner", "hypothesis", "model", "data", "train"}


def test_complete_base_file_satisfies_the_json_schema():
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    instance = yaml.safe_load((EXPERIMENTS / "base.yaml").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(json.loads((EXPERIMENTS / "schema.json").read_text())).validate(instance)
    instance["data"]["seq_lenn"] = 3
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(experiment_schema()).validate(instance)
    # The plug-in sections are described by their shared contract (a new architecture file
    # needs no schema change): a typo among the common fields is caught, an architecture's
    # own keys are left to `pipeline validate`, which reads the architecture file.
    instance["data"].pop("seq_lenn")
    instance["model"]["hidden_size"] = "wide"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(experiment_schema()).validate(instance)


def test_readme_experiment_snippet_is_valid_and_matches_the_committed_file(tmp_path: Path):
    import re
    import shutil

    readme = REPO / "README.md"
    blocks = (
        re.findall(r"```yaml\n(.*?)```", readme.read_text(encoding="utf-8"), flags=re.S)
        if readme.exists()
        else []
    )
    snippets = [b for b in blocks if re.search(r"^name: [a-z0-9][a-z0-9_-]+$", b, flags=re.M)]
    if not snippets:
        pytest.skip("README shows no experiment file")
    (tmp_path / "experiments").mkdir()
    (tmp_path / "data").mkdir()
    shutil.copy(EXPERIMENTS / "base.yaml", tmp_path / "experiments" / "base.yaml")
    for snippet in snippets:
        name = re.search(r"^name: (\S+)$", snippet, flags=re.M).group(1)
        path = tmp_path / "experiments" / f"{name}.yaml"
        path.write_text(snippet, encoding="utf-8")
        spec = load_spec(path)
        committed = EXPERIMENTS / f"{name}.yaml"
        if committed.exists():
            # Same training configuration as the committed example (hypothesis wording may be shorter).
            assert spec.spec_hash() == load_spec(committed).spec_hash()
