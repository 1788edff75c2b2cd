"""The unit tier's guard: a unit test that starts a process or a server fails, naming the call.

Small test files run in-process with `pytester` (no interpreter is started), laid out as
`tests/<tier>/...` so the guard applies, with this suite's hooks and no other plugin."""

from __future__ import annotations

import pytest

CONFTEST = """
from tests.conftest import (pytest_collection_modifyitems, pytest_runtest_call, pytest_runtest_makereport,
                            pytest_runtest_setup, pytest_runtest_teardown)
"""

CALLS = {
    "subprocess_run": "subprocess.run(['true'])",
    "check_output": "subprocess.check_output(['echo', 'x'])",
    "system": "os.system('true')",
    "fork": "os.fork()",
    "multiprocessing": "multiprocessing.Process(target=print).start()",
    "listen": "socket.socket().listen()",
    "caught": "try:\n        subprocess.run(['git', 'rev-parse', 'HEAD'])\n    except BaseException:\n        pass",
}


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tier: str, body: str) -> pytest.RunResult:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeconftest(CONFTEST)
    (pytester.path / "tests" / tier).mkdir(parents=True)
    (pytester.path / "tests" / tier / "test_case.py").write_text(body)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q", "-rf")


def test_a_unit_test_that_starts_a_process_or_a_server_fails_naming_it(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    cases = "".join(f"\ndef test_{name}():\n    {call}\n" for name, call in CALLS.items())
    fixture = ("\n@pytest.fixture(scope='module')\ndef built():\n    return subprocess.run(['true'])\n"
               "\ndef test_module_fixture(built):\n    pass\n")
    pure = "\ndef test_pure():\n    assert json.loads('[1]') == [1]\n"
    result = _run(pytester, monkeypatch, "unit",
                  "import json, multiprocessing, os, socket, subprocess\nimport pytest\n" + cases + fixture + pure)
    result.assert_outcomes(failed=len(CALLS), errors=1, passed=1)
    result.stdout.fnmatch_lines([f"FAILED tests/unit/test_case.py::test_{name} *" for name in CALLS])
    assert result.stdout.str().count("unit tests start no process and no server") >= len(CALLS) + 1
    result.stdout.fnmatch_lines(["*_execute_child was called*"])


def test_other_tiers_are_not_guarded(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    # The guard is what stops a unit test; in another tier the same call reaches the real function
    # (here a refusing stand-in, so this unit test itself starts nothing).
    result = _run(pytester, monkeypatch, "integration", """
import subprocess

def test_it(monkeypatch):
    monkeypatch.setattr(subprocess.Popen, "_execute_child", lambda *a, **k: (_ for _ in ()).throw(OSError("real")))
    try:
        subprocess.run(['true'])
    except OSError as exc:
        assert str(exc) == "real"
""")
    result.assert_outcomes(passed=1)


def test_a_tier_marker_that_contradicts_the_directory_is_refused(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(pytester, monkeypatch, "unit", """
import pytest

@pytest.mark.integration
def test_misplaced():
    pass
""")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*marked 'integration' but lives in tests/unit/; move the file*"])
