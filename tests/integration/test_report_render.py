"""The comment as GitHub would show it: every Mermaid block goes through the real Mermaid
parser in Node (`tests/js/`). A chart GitHub could not draw fails the test; a deliberately
broken chart proves the check can fail."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from reports.compare import HypothesisView
from reports.render import mermaid_blocks, render_markdown
from reports.report import make_report
from tests.infra.report_runs import record

JS_DIR = Path(__file__).parents[1] / "js"

HYPOTHESIS = HypothesisView(
    metric="eval/loss", direction="decrease", min_effect=0.02, alpha=0.05, seeds=3, baseline="base",
    statement='Doubling the LR lowers loss by 2 % | <script>alert("x")</script> cc @octocat "quoted"',
)


def report_of(cand_finals=(3.0, 3.02, 2.98), base_finals=(3.2, 3.22, 3.18), **record_changes):
    cands = [record("higher-lr", 1 + i, v, **record_changes) for i, v in enumerate(cand_finals)]
    bases = [record("base", 1 + i, v) for i, v in enumerate(base_finals)]
    return make_report(cands, bases, HYPOTHESIS)


# --------------------------------------------------------------------------- the real Mermaid parser


def mermaid_parse(diagrams: list[str]) -> list[dict]:
    """Runs tests/js/parse_mermaid.mjs (installs its node_modules once if missing)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None:
        pytest.skip("node is not installed: the Mermaid parser check needs Node.js 18+ (tests/js/)")
    if not (JS_DIR / "node_modules" / "mermaid").is_dir():
        if npm is None:
            pytest.skip("npm is not installed: cannot install tests/js dependencies")
        command = ["npm", "ci"] if (JS_DIR / "package-lock.json").is_file() else ["npm", "install"]
        installed = subprocess.run([*command, "--no-audit", "--no-fund"], cwd=JS_DIR, capture_output=True, text=True,
                                   timeout=600)
        if installed.returncode != 0:
            pytest.fail(f"`{' '.join(command)}` in tests/js failed (a package registry is needed once): "
                        f"{installed.stderr[-2000:]}")
    proc = subprocess.run([node, "parse_mermaid.mjs"], cwd=JS_DIR, input=json.dumps(diagrams), capture_output=True,
                          text=True, timeout=300)
    assert proc.stdout, proc.stderr
    results = json.loads(proc.stdout)
    assert len(results) == len(diagrams)
    assert (proc.returncode == 0) == all(r["ok"] for r in results), proc.stderr
    return results


def test_every_mermaid_block_parses_with_the_real_parser_and_a_broken_one_fails():
    reports = [report_of(), report_of(cand_finals=(3.0,), base_finals=(3.2,)),
               report_of(history={"train/loss": [(s, -1e-7 * s) for s in range(0, 5000, 7)],
                                  "eval/loss": [(10, 2.0), (20, 1.5)]})]
    blocks = [b for r in reports for b in mermaid_blocks(render_markdown(r))]
    assert len(blocks) >= 4
    broken = [
        blocks[0].replace("line \"", "line [", 1),                                 # a bracket where a title belongs
        re.sub(r"(line \"[^\"]*\" )\[", r"\1[1e-05, ", blocks[0], count=1),       # exponent notation in the data
        blocks[0].replace('title "', 'title "a"b"', 1),                             # an unescaped quote in the title
    ]
    assert all(b != blocks[0] for b in broken)
    results = mermaid_parse(blocks + broken)
    good, bad = results[:len(blocks)], results[len(blocks):]
    assert all(r["ok"] and r["type"] == "xychart" for r in good), [r["error"] for r in good if not r["ok"]]
    assert not any(r["ok"] for r in bad), bad
    assert all("Parse error" in r["error"] or "Expecting" in r["error"] for r in bad)
