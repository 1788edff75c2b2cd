"""The JSON Schema of an experiment file, generated from the pydantic models.

`experiments/schema.json` is committed so editors (the YAML language server, via the
`$schema` line at the top of each file) complete and check fields while typing. It is
generated, never edited: `pipeline schema` rewrites it and `pipeline schema --check`
(and a test) fail when it no longer matches the models.

The plug-in sections (`model`, `train.optimizer`) are described by the contract they all
share (`models.Architecture`, `models.OptimizerConfig`: the common fields, the selecting
name, further keys allowed), not by a list of today's files: a pull request that adds an
architecture as `models/<name>.py` must not have to regenerate this file, and its fields are
checked, with file:line, by `pipeline validate`, which reads the architecture file itself.

The schema describes a *complete* file. A file that `extends:` another may leave out
required sections, so editors will flag those as missing; the loader is the authority.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from models import Architecture, OptimizerConfig
from validation.spec import ExperimentSpec

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_FILE = Path("experiments") / "schema.json"


def experiment_schema() -> dict[str, Any]:
    """The schema as data: field names as written in YAML (aliases), descriptions from docstrings."""
    schema = ExperimentSpec.model_json_schema(by_alias=True, mode="validation")
    _generic_plugin_sections(schema)
    schema["$schema"] = SCHEMA_DIALECT
    schema["title"] = "Experiment"
    schema["description"] = (
        "One experiment of the GitOps training pipeline (experiments/<name>.yaml). "
        "Generated from validation/spec.py by `pipeline schema`; do not edit."
    )
    return schema


def _generic_plugin_sections(schema: dict[str, Any]) -> None:
    """Replace the plug-in unions by the shared contract (see the module docstring)."""
    defs: dict[str, Any] = schema.get("$defs", {})
    for name in [k for k in defs if k.startswith("models__") or k.startswith("Foreign")]:
        del defs[name]

    def generic(base: type[Any], key: str, where: str) -> dict[str, Any]:
        part: dict[str, Any] = base.model_json_schema(by_alias=True, mode="validation")
        part.pop("title", None)
        part["properties"][key] = {"type": "string", "pattern": r"^[a-z][a-z0-9_]{0,63}$",
                                   "description": f"A file under {where} (its name without .py); "
                                                  "its own fields follow and are checked by `pipeline validate`."}
        part["additionalProperties"] = True
        return part

    model_doc = schema["properties"]["model"].get("description", "")
    schema["properties"]["model"] = generic(Architecture, "model_type", "models/") | {"description": model_doc}
    train = defs["TrainSpec"]["properties"]
    optimizer_doc = train["optimizer"].get("description", "")
    train["optimizer"] = generic(OptimizerConfig, "name", "models/optimizers/") | {
        "description": optimizer_doc, "default": {"name": "adamw"}}


def render_schema() -> str:
    """Canonical text: sorted keys, two-space indent, trailing newline (stable diffs)."""
    return json.dumps(experiment_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def schema_path(repo_root: Path) -> Path:
    return repo_root / SCHEMA_FILE


def is_current(path: Path) -> bool:
    """True when the committed schema file equals what the models generate now."""
    try:
        return path.read_text(encoding="utf-8") == render_schema()
    except OSError:
        return False


def write_schema(path: Path) -> bool:
    """Write the schema if it changed; returns whether the file was (re)written."""
    text = render_schema()
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return True
