"""Property-based fuzzing of the loader: whatever the bytes, the answer is a clean `SpecError`.

Four generators, from blind to informed: arbitrary bytes, arbitrary text, arbitrary YAML
trees dumped by PyYAML, and the real base experiment with one field replaced by an
arbitrary tree (which reaches the models and the cross-field rules). No input may raise
anything but `SpecError`, and every issue must be one printable line with a location.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from basics.errors import SpecError
from validation.loader import load_spec

REPO = Path(__file__).resolve().parents[2]
BASE_TEXT = (REPO / "experiments" / "base.yaml").read_text(encoding="utf-8")
BASE = yaml.safe_load(BASE_TEXT)
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "experiments").mkdir()
    (root / "data").mkdir()
    shutil.copy(REPO / "experiments" / "base.yaml", root / "experiments" / "base.yaml")
    return root / "experiments" / "fuzzed.yaml"


def check_clean(path: Path, content: bytes) -> None:
    path.write_bytes(content)
    try:
        load_spec(path)
    except SpecError as exc:
        assert exc.issues
        for issue in exc.issues:
            text = issue.text()
            assert "\n" not in text and "\r" not in text
            assert issue.line >= 1 and issue.col >= 1 and issue.field
            text.encode("utf-8")  # printable: no lone surrogates


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**60), max_value=10**60),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)
trees = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=25,
)


def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            out += _paths(value, (*prefix, index))
    return out


BASE_PATHS = _paths(BASE)


@FUZZ
@given(content=st.binary(max_size=3000))
def test_arbitrary_bytes(target: Path, content: bytes):
    check_clean(target, content)


@FUZZ
@given(content=st.text(max_size=3000))
def test_arbitrary_text(target: Path, content: str):
    check_clean(target, content.encode("utf-8", "surrogatepass"))


@FUZZ
@given(tree=trees)
def test_arbitrary_yaml_trees(target: Path, tree: Any):
    check_clean(target, yaml.safe_dump(tree, allow_unicode=True).encode("utf-8", "surrogatepass"))


@FUZZ
@given(path=st.sampled_from(BASE_PATHS), value=trees, extends=st.booleans())
def test_base_with_one_field_replaced(target: Path, path: tuple, value: Any, extends: bool):
    data = copy.deepcopy(BASE)
    data["name"] = "fuzzed"
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    if extends:
        data["extends"] = "base.yaml"
    check_clean(
        target, yaml.safe_dump(data, allow_unicode=True, sort_keys=False).encode("utf-8", "surrogatepass")
    )


@FUZZ
@given(position=st.integers(min_value=0, max_value=len(BASE_TEXT)), junk=st.text(min_size=1, max_size=8))
def test_base_text_with_junk_inserted(target: Path, position: int, junk: str):
    text = BASE_TEXT.replace("name: base", "name: fuzzed")
    check_clean(target, (text[:position] + junk + text[position:]).encode("utf-8", "surrogatepass"))


YAML_FRAGMENTS = [
    "name: fuzzed\n",
    "a: ",
    "&x ",
    "*x ",
    "!!python/object:os.system ",
    "!!str ",
    "!custom ",
    "{",
    "}",
    "[",
    "]",
    ", ",
    ": ",
    "- ",
    "? ",
    "\n",
    "\n  ",
    "\t",
    '"',
    "'",
    "|\n",
    ">\n",
    "%YAML 1.1\n",
    "---\n",
    "...\n",
    "<<: *x\n",
    "1e999",
    ".nan",
    "0x1F",
    "1_000",
    "9" * 40,
    "\\ud800",
    "\x85",
    "\ufeff",
    "#",
    "extends: base.yaml\n",
    "extends: ../../etc/x.yaml\n",
    "data:\n  sources:\n    - path: ../x\n",
]


@FUZZ
@given(parts=st.lists(st.sampled_from(YAML_FRAGMENTS), max_size=40))
def test_yaml_syntax_soup(target: Path, parts: list[str]):
    check_clean(target, "".join(parts).encode("utf-8", "surrogatepass"))
