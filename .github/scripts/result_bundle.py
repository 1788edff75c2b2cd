"""The result bundle that experiment-pr.yml hands to experiment-comment.yml.

Two halves, run on opposite sides of the trust boundary:

* `render` runs in the untrusted PR job (the PR's copy of this file): it turns the
  stage outcomes and the files the stages wrote into one `comment.md` per experiment
  (and `smoke-loss.png` from the smoke run's losses).
* `verify` runs in the trusted comment job (the default branch's copy): it reads the
  downloaded bundle strictly as data. The PR number must be digits, the head SHA 40
  hex and equal to the workflow run's head SHA, every name an experiment name, every
  body a plain UTF-8 file under GitHub's comment limit (65,536 characters) without any
  `<!-- gitops-train:` marker (state is composed by the trusted side only); and the API
  must confirm that the
  PR's current head is that commit. Only then are `pr` and `experiments` written to
  $GITHUB_OUTPUT for `pipeline comment`.

The verify side uses the standard library only: it must not depend on anything the
PR ships (render imports matplotlib lazily for the PNG).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

# Same pattern as ExperimentSpec.name (validation/spec.py); duplicated on purpose so
# the trusted side imports nothing from the repository's packages.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{2,63}$")
PR_RE = re.compile(r"^[1-9][0-9]{0,8}$")
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
COMMENT_LIMIT = 65_536  # characters, GitHub's limit for a comment body
MARKER_RE = re.compile(r"<!--\s*gitops-train", re.I)
STAGES_IN_ORDER = ("validate", "plan", "dry run", "contract", "data", "data check", "smoke")
# Stages that run only when the pull request has something for them: `contract` checks the plug-in
# files under models/ a pull request adds or changes, and is skipped when it changes none.
OPTIONAL_STAGES = frozenset({"contract"})
# At most this many experiments per pull request get a comment (and can be trained: the same
# cap as pipelines.github.chatops.MAX_EXPERIMENTS_PER_PR); one bundle cannot make the comment
# job post a thousand comments and spend the repository's API budget.
MAX_EXPERIMENTS = 10


class BundleRejected(Exception):
    """The bundle is not what an honest experiment-pr run writes; nothing is posted."""


@dataclass(frozen=True)
class VerifiedBundle:
    pr: int
    head_sha: str
    experiments: list[str]
    dropped: int = 0  # experiments past MAX_EXPERIMENTS: named in a notice, never posted


def _read_small_text(path: Path, limit: int = 200) -> str:
    if path.is_symlink() or not path.is_file():
        raise BundleRejected(f"{path.name}: missing or not a plain file")
    data = path.read_bytes()
    if len(data) > limit:
        raise BundleRejected(f"{path.name}: larger than {limit} bytes")
    try:
        return data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise BundleRejected(f"{path.name}: not ASCII") from None


def read_bundle(bundle: Path, run_head_sha: str) -> VerifiedBundle:
    """Check the bundle's shape and values; raise BundleRejected with one line on the first problem."""
    pr_text = _read_small_text(bundle / "pr-number")
    if not PR_RE.fullmatch(pr_text):
        raise BundleRejected(f"pr-number: {pr_text[:20]!r} is not a pull request number")
    sha = _read_small_text(bundle / "head-sha")
    if not SHA_RE.fullmatch(sha):
        raise BundleRejected("head-sha: not a 40-hex commit SHA")
    if sha != run_head_sha:
        raise BundleRejected(f"head-sha: bundle says {sha}, the workflow run tested {run_head_sha}")
    names = list(dict.fromkeys(_read_small_text(bundle / "experiments", limit=64 * 66).split()))
    for name in names:
        if not NAME_RE.fullmatch(name):
            raise BundleRejected(f"experiments: {name[:70]!r} is not an experiment name")
    dropped = max(0, len(names) - MAX_EXPERIMENTS)
    names = names[:MAX_EXPERIMENTS]
    for name in names:
        if not NAME_RE.fullmatch(name):
            raise BundleRejected(f"experiments: {name[:70]!r} is not an experiment name")
        body = bundle / name / "comment.md"
        if body.is_symlink() or not body.is_file():
            raise BundleRejected(f"{name}/comment.md: missing or not a plain file")
        # GitHub's limit counts characters; 4 bytes per character is the most UTF-8 needs.
        if body.stat().st_size > 4 * COMMENT_LIMIT:
            raise BundleRejected(f"{name}/comment.md: over GitHub's {COMMENT_LIMIT}-character comment limit")
        try:
            text = body.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise BundleRejected(f"{name}/comment.md: not UTF-8") from None
        if len(text) > COMMENT_LIMIT:
            raise BundleRejected(f"{name}/comment.md: over GitHub's {COMMENT_LIMIT}-character comment limit")
        # Sticky-comment markers and state are written by the trusted side only.
        if MARKER_RE.search(text):
            raise BundleRejected(f"{name}/comment.md: contains a gitops-train marker (only the trusted side writes those)")
    return VerifiedBundle(pr=int(pr_text), head_sha=sha, experiments=names, dropped=dropped)


def pull_request_head(api_url: str, repository: str, pr: int, token: str | None) -> tuple[str, str]:
    """(head SHA, state) of a pull request, asked from the REST API."""
    request = urllib.request.Request(f"{api_url.rstrip('/')}/repos/{repository}/pulls/{pr}")
    request.add_header("Accept", "application/vnd.github+json")
    request.add_header("X-GitHub-Api-Version", "2022-11-28")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            payload = json.load(response)
    except urllib.error.HTTPError as exc:
        raise BundleRejected(f"pull request #{pr}: the API answered {exc.code}") from None
    except (urllib.error.URLError, TimeoutError, ValueError) as exc:
        raise BundleRejected(f"pull request #{pr}: the API could not be read ({exc})") from None
    return str(payload["head"]["sha"]), str(payload.get("state", ""))


def verify(bundle: Path, run_head_sha: str, api_url: str, repository: str, token: str | None) -> VerifiedBundle:
    verified = read_bundle(bundle, run_head_sha)
    head, state = pull_request_head(api_url, repository, verified.pr, token)
    if head != run_head_sha:
        raise BundleRejected(
            f"pull request #{verified.pr}: its head is {head}, the run tested {run_head_sha} (stale or foreign bundle)"
        )
    if state and state != "open":
        raise BundleRejected(f"pull request #{verified.pr} is {state}")
    return verified


# --------------------------------------------------------------------------- render (untrusted side)

_ICON = {"success": "✅", "failure": "❌", "skipped": "⏭️", "cancelled": "⏹️"}


def _smoke_line(folder: Path) -> str | None:
    try:
        smoke = json.loads((folder / "smoke.json").read_text(encoding="utf-8"))
        losses = [float(x) for x in smoke.get("losses") or []]
    except (OSError, ValueError, TypeError):
        return None
    checks = ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in (smoke.get("checks") or {}).items())
    loss = f"loss {losses[0]:.3f} → {losses[-1]:.3f} over {len(losses)} steps" if losses else "no losses"
    return f"Smoke run: {smoke.get('status', '?')}; {loss}; {checks}."


def plot_smoke_losses(folder: Path) -> Path | None:
    """`smoke-loss.png` from smoke.json (matplotlib is imported here only: the verify side
    of this file must stay standard-library only)."""
    try:
        losses = [float(x) for x in json.loads((folder / "smoke.json").read_text(encoding="utf-8"))["losses"]]
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except (OSError, ValueError, KeyError, TypeError, ImportError):
        return None
    fig, ax = plt.subplots(figsize=(5, 3), dpi=100)
    ax.plot(range(1, len(losses) + 1), losses)
    ax.set(xlabel="step", ylabel="train/loss", title=f"smoke: {folder.name}")
    fig.tight_layout()
    out = folder / "smoke-loss.png"
    fig.savefig(out)
    plt.close(fig)
    return out


def render_comment(name: str, stages: dict[str, str], folder: Path) -> str:
    """Markdown for one experiment's sticky comment at the end of the PR checks."""
    passed = all(stages.get(stage) == "success"
                 or (stage in OPTIONAL_STAGES and stages.get(stage, "skipped") == "skipped")
                 for stage in STAGES_IN_ORDER)
    lines = [f"### Experiment `{name}`", ""]
    for stage in STAGES_IN_ORDER:
        outcome = stages.get(stage) or "skipped"
        if stage in OPTIONAL_STAGES and outcome == "skipped":
            continue
        lines.append(f"- {_ICON.get(outcome, '•')} {stage}: {outcome}")
    lines.append("")
    smoke = _smoke_line(folder)
    if smoke:
        lines += [smoke, ""]
    for md in sorted(folder.glob("*/*.md")):
        text = md.read_text(encoding="utf-8", errors="replace")[:15_000]
        lines += [f"<details><summary>{md.parent.name}</summary>", "", text.rstrip(), "", "</details>", ""]
    plan = folder / "plan.txt"
    if plan.is_file() and plan.stat().st_size:
        # The plan's summary; the resolved spec it prints after is in plan.json.
        text = plan.read_text(encoding="utf-8", errors="replace").split("\nresolved spec:", 1)[0][:20_000]
        lines += ["<details><summary>Plan</summary>", "", "```text", text.rstrip(), "```", "", "</details>", ""]
    if passed:
        lines.append("**Awaiting `/train`** from a maintainer (write access).")
    else:
        lines.append("Checks did not pass; see the workflow run's annotations and log.")
    body = "\n".join(lines) + "\n"
    # Structural cut (fences and <details> closed, a note at the end); room for the header.
    from pipelines.github.comment import fit_markdown

    return fit_markdown(body, COMMENT_LIMIT - 200)


def render(bundle: Path, stages: dict[str, str]) -> list[Path]:
    written = []
    names = (bundle / "experiments").read_text(encoding="utf-8").split()
    for name in names:
        folder = bundle / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "stages.json").write_text(json.dumps(stages, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        plot_smoke_losses(folder)
        out = folder / "comment.md"
        out.write_text(render_comment(name, stages, folder), encoding="utf-8")
        written.append(out)
    return written


def _write_outputs(values: dict[str, str]) -> None:
    target = os.environ.get("GITHUB_OUTPUT")
    lines = "".join(f"{key}={value}\n" for key, value in values.items())
    if target:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(lines)
    else:
        sys.stdout.write(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_render = sub.add_parser("render", help="write <name>/comment.md for every experiment in the bundle")
    p_render.add_argument("bundle", type=Path)
    p_render.add_argument("--stage", action="append", default=[], help="STAGE=OUTCOME (a step's outcome)")
    p_verify = sub.add_parser("verify", help="check a downloaded bundle; write pr and experiments outputs")
    p_verify.add_argument("bundle", type=Path)
    p_verify.add_argument("--head-sha", required=True, help="head_sha of the workflow run that made the bundle")
    args = parser.parse_args(argv)

    if args.command == "render":
        stages = dict(item.split("=", 1) for item in args.stage)
        for path in render(args.bundle, stages):
            print(f"wrote {path}")
        return 0

    try:
        verified = verify(
            args.bundle, args.head_sha,
            api_url=os.environ["GITHUB_API_URL"],
            repository=os.environ["GITHUB_REPOSITORY"],
            token=os.environ.get("GH_TOKEN") or os.environ.get("GITHUB_TOKEN"),
        )
    except BundleRejected as exc:
        print(f"::error title=result bundle rejected::{exc}")
        return 1
    _write_outputs({"pr": str(verified.pr), "experiments": " ".join(verified.experiments),
                    "dropped": str(verified.dropped)})
    if verified.dropped:
        print(f"::warning title=too many experiments::{verified.dropped} experiment(s) past the cap of "
              f"{MAX_EXPERIMENTS} per pull request get no comment")
    print(f"bundle verified: PR #{verified.pr} at {verified.head_sha}: {' '.join(verified.experiments) or '(none)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
