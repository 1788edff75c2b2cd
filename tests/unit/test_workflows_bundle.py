"""The result bundle checks (`.github/scripts/result_bundle.py`): what the trusted comment
job accepts from the untrusted PR job. The API half is exercised end to end in
test_workflows_run.py; here, the shape checks on files an attacker controls."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".github" / "scripts" / "result_bundle.py"
_spec = importlib.util.spec_from_file_location("result_bundle", SCRIPT)
assert _spec and _spec.loader
bundle_mod = importlib.util.module_from_spec(_spec)
sys.modules["result_bundle"] = bundle_mod  # dataclasses look their module up there
_spec.loader.exec_module(bundle_mod)

SHA = "a" * 40


def make_bundle(root: Path, pr: str = "7", sha: str = SHA, names: tuple[str, ...] = ("higher-lr",)) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pr-number").write_text(pr + "\n")
    (root / "head-sha").write_text(sha + "\n")
    (root / "experiments").write_text("".join(n + "\n" for n in names))
    for name in names:
        if bundle_mod.NAME_RE.fullmatch(name):
            (root / name).mkdir(exist_ok=True)
            (root / name / "comment.md").write_text(f"### {name}\n")
    return root


def test_an_honest_bundle_is_read(tmp_path: Path) -> None:
    verified = bundle_mod.read_bundle(make_bundle(tmp_path / "b", names=("higher-lr", "base")), SHA)
    assert (verified.pr, verified.head_sha, verified.experiments) == (7, SHA, ["higher-lr", "base"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pr": "7; rm -rf /"}, "not a pull request number"),
        ({"pr": "0"}, "not a pull request number"),
        ({"pr": "-3"}, "not a pull request number"),
        ({"sha": "b" * 40}, "the workflow run tested"),
        ({"sha": "HEAD"}, "not a 40-hex commit SHA"),
        ({"names": ("../../etc",)}, "is not an experiment name"),
        ({"names": ("$(id)",)}, "is not an experiment name"),
    ],
    ids=["shell-in-pr", "pr-zero", "pr-negative", "other-sha", "symbolic-sha", "path-traversal", "shell-in-name"],
)
def test_a_tampered_bundle_is_rejected(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(bundle_mod.BundleRejected, match=message):
        bundle_mod.read_bundle(make_bundle(tmp_path / "b", **kwargs), SHA)


def test_symlinks_and_oversized_bodies_are_rejected(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b")
    body = root / "higher-lr" / "comment.md"
    body.unlink()
    secret = tmp_path / "secret.txt"
    secret.write_text("token")
    body.symlink_to(secret)
    with pytest.raises(bundle_mod.BundleRejected, match="not a plain file"):
        bundle_mod.read_bundle(root, SHA)
    body.unlink()
    body.write_text("x" * (bundle_mod.COMMENT_LIMIT + 1))
    with pytest.raises(bundle_mod.BundleRejected, match="comment limit"):
        bundle_mod.read_bundle(root, SHA)


def test_render_says_awaiting_train_only_when_every_stage_passed(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b")
    (root / "higher-lr" / "plan.txt").write_text("plan: higher-lr\n  tier small\n\nresolved spec:\n  name: x\n")
    (root / "higher-lr" / "smoke.json").write_text('{"status": "passed", "losses": [5.0, 4.0, 3.5], "checks": {"resume": true}}')
    stages = dict.fromkeys(bundle_mod.STAGES_IN_ORDER, "success")
    (path,) = bundle_mod.render(root, stages)
    text = path.read_text()
    assert "Awaiting `/train`" in text and "tier small" in text and "resolved spec" not in text
    assert "loss 5.000 → 3.500 over 3 steps" in text
    assert (root / "higher-lr" / "smoke-loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (path,) = bundle_mod.render(root, {**stages, "smoke": "failure"})
    text = path.read_text()
    assert "Awaiting" not in text and "smoke: failure" in text


def test_the_contract_stage_counts_only_when_a_plug_in_file_changed(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b")
    stages = dict.fromkeys(bundle_mod.STAGES_IN_ORDER, "success")
    (path,) = bundle_mod.render(root, {**stages, "contract": "skipped"})
    text = path.read_text()
    assert "Awaiting `/train`" in text and "contract" not in text and "dry run: success" in text
    (path,) = bundle_mod.render(root, {**stages, "contract": "failure"})
    text = path.read_text()
    assert "Awaiting" not in text and "contract: failure" in text
    (path,) = bundle_mod.render(root, {**stages, "dry run": "failure"})
    assert "Awaiting" not in path.read_text()


def test_a_bundle_of_a_thousand_experiments_posts_at_most_the_cap(tmp_path: Path) -> None:
    """Issue 19 item 5: the comment job posts at most MAX_EXPERIMENTS comments per run and says
    how many were left out."""
    from tests.infra.github_emulator import SHA_A

    names = [f"e{i:02d}" for i in range(100)] + [f"{a}{b}{c}" for a in "fghijklmn" for b in "abcdefghij"
                                                  for c in "abcdefghij"]
    assert len(names) == 1000  # 4,000 bytes: within the experiments file's size limit
    (tmp_path / "pr-number").write_text("7\n")
    (tmp_path / "head-sha").write_text(SHA_A + "\n")
    (tmp_path / "experiments").write_text("\n".join(names) + "\n")
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "comment.md").write_text("### ok\n")
    verified = bundle_mod.read_bundle(tmp_path, SHA_A)
    assert len(verified.experiments) == bundle_mod.MAX_EXPERIMENTS == 10
    assert verified.dropped == 990
