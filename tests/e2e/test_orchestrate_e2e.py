"""`pipeline run` end to end on CPU: baseline first, candidate, report, sticky comment;
a second run reuses everything; another candidate reuses the baseline's training.

One module repository, one baseline training for every test: the first run (`first_run`: baseline,
then candidate) starts two `pipeline run` processes of two more PRs (tiny-a, tiny-b) when it begins
to train the baseline they also need (the two-processes test reads them), and another PR's
candidate (`other_pr`) is submitted with `--detach` and followed to its report by a later run,
which both the reuse test and the detach test read (one training instead of one each)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipelines.orchestrate import ExperimentFlow, Reporter, RunOptions
from pipelines.rundir import read_json
from tests.infra.tiny_experiments import BASE, CANDIDATE


class Recorder(Reporter):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def stage(self, experiment: str, stage: str, event: str, detail: str = "") -> None:
        self.events.append((experiment, stage, event))

    def training(self, label: str, run_dir: Path, total_steps: int):
        self.events.append((label, "training", str(total_steps)))
        return lambda: None


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.infra.corpus import demo_corpus

    root = tmp_path_factory.mktemp("repo")
    (root / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    (root / "experiments").mkdir()
    (root / "experiments" / "tiny-base.yaml").write_text(BASE)
    (root / "experiments" / "tiny-lr.yaml").write_text(CANDIDATE.format(name="tiny-lr", lr=0.006))
    (root / "experiments" / "tiny-lr2.yaml").write_text(CANDIDATE.format(name="tiny-lr2", lr=0.009))
    (root / "experiments" / "tiny-a.yaml").write_text(CANDIDATE.format(name="tiny-a", lr=0.005))
    (root / "experiments" / "tiny-b.yaml").write_text(CANDIDATE.format(name="tiny-b", lr=0.007))
    demo_corpus(root / "data" / "demo", 150_000)
    return root


class StartsTwoPRs(Recorder):
    """A Recorder that, when the baseline's training starts (its locks held), starts two
    `pipeline run` processes of two other PRs needing the same baseline (tiny-a, tiny-b)."""

    def __init__(self, repo: Path, uri: str) -> None:
        super().__init__()
        self.repo, self.uri = repo, uri
        self.procs: list[Any] = []
        self.logs: list[Path] = []
        self.outputs: list[str] = []

    def training(self, label: str, run_dir: Path, total_steps: int):
        if label == "tiny-base seed 1234" and not self.procs:
            import os
            import subprocess
            import sys

            env = dict(os.environ, PIPELINE_RUNS_DIR=str(self.repo / "runs"), MLFLOW_TRACKING_URI=self.uri)
            for name in ("tiny-a", "tiny-b"):
                log = self.repo / f"{name}.out"
                self.logs.append(log)
                with log.open("w") as out:
                    self.procs.append(subprocess.Popen(
                        [sys.executable, "-m", "pipelines", "run", f"experiments/{name}.yaml", "--no-smoke"],
                        cwd=self.repo, env=env, stdout=out, stderr=subprocess.STDOUT, text=True))
        return super().training(label, run_dir, total_steps)

    def wait(self) -> list[str]:
        for proc in self.procs:
            proc.wait(timeout=600)
        return [log.read_text() for log in self.logs]


@pytest.fixture(scope="module")
def first_run(repo: Path) -> tuple[StartsTwoPRs, Any, Any]:
    """The first `pipeline run` of tiny-lr in `repo` (PR 42): what it recorded, the candidate and the
    baseline. A fixture, so a test that needs the finished first run gets it alone or in any order.
    Its recorder also holds the two `pipeline run` processes (tiny-a, tiny-b) it started when the
    baseline's training began, finished (`.procs`, their output in `.outputs`)."""
    uri = f"sqlite:///{repo / 'mlflow.db'}"
    # Create the MLflow schema once: several processes migrating a new sqlite file at once is an
    # MLflow limitation, not what these tests are about.
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=uri).search_experiments()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PIPELINE_RUNS_DIR", str(repo / "runs"))
        rec = StartsTwoPRs(repo, uri)
        flow = ExperimentFlow(repo, RunOptions(tracking_uri=uri, pr=42), rec)
        try:
            candidate, baseline = flow.run(repo / "experiments" / "tiny-lr.yaml")
        finally:
            rec.outputs = rec.wait()
    return rec, candidate, baseline


@pytest.fixture(scope="module")
def other_pr(repo: Path, first_run: tuple[Recorder, Any, Any]) -> dict[str, Any]:
    """Another PR's candidate (tiny-lr2) against the baseline the first run trained, submitted
    with `--detach`, then followed to its report by a later run: what each of the two flows
    recorded and returned, and what the run directory held in between."""
    from pipelines.orchestrate import Detached

    uri = f"sqlite:///{repo / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PIPELINE_RUNS_DIR", str(repo / "runs"))
        detach_rec = Recorder()
        flow = ExperimentFlow(repo, RunOptions(tracking_uri=uri, smoke=False, detach=True), detach_rec)
        with pytest.raises(Detached):
            flow.run(repo / "experiments" / "tiny-lr2.yaml")
        submitted = {name: (seed, seed_dir, kind, job_id) for name, seed, seed_dir, kind, job_id in flow.detached}
        between = {name: {"launch": (d / "launch.json").exists(),
                          "train_marker": (d.parent.parent / "stages" / "train.json").exists()}
                   for name, (_, d, _, _) in submitted.items()}
        follow_rec = Recorder()
        candidate, baseline = ExperimentFlow(repo, RunOptions(tracking_uri=uri, smoke=False), follow_rec).run(
            repo / "experiments" / "tiny-lr2.yaml")
    return {"detach_events": detach_rec.events, "submitted": submitted, "between": between,
            "follow_events": follow_rec.events, "candidate": candidate, "baseline": baseline}


def test_run_trains_baseline_then_candidate_and_reports(repo: Path, first_run: tuple[Recorder, Any, Any]) -> None:
    uri = f"sqlite:///{repo / 'mlflow.db'}"
    rec, candidate, baseline = first_run

    assert baseline is not None and baseline.spec.name == "tiny-base"
    # The baseline's stages all ran before the candidate's.
    order = [(e, s) for e, s, ev in rec.events if ev == "finished"]
    assert order.index(("tiny-base", "evaluate")) < order.index(("tiny-lr", "check"))
    for result in (candidate, baseline):
        assert result.run_dir.is_absolute() and result.run_dir.parent.name == result.spec.name
        for stage in ("validate", "prepare", "check", "smoke", "train", "evaluate"):
            marker = read_json(result.run_dir / "stages" / f"{stage}.json")
            if stage == "smoke" and result is baseline:
                assert marker is None  # the smoke run guards the candidate only
                continue
            assert marker and marker["status"] == "ok", (result.spec.name, stage, marker)
        (seed_dir,) = result.seed_dirs
        finished = read_json(seed_dir / "result.json")
        assert finished["status"] == "finished" and finished["steps"] == 8
        ident = read_json(seed_dir / "identity.json")
        assert ident["experiment"] == result.spec.name and ident["pr"] == 42 and ident["seed"] == 1234
    # Paired on the same seed, same data version (weights do not change the prepared data).
    assert baseline.data_version == candidate.data_version

    assert candidate.verdict in {"supported", "refuted", "inconclusive"}
    report = (candidate.report_dir / "report.md").read_text()
    assert "tiny-lr" in report and "tiny-base" in report
    comment = (candidate.report_dir / "comment.md").read_text()
    assert comment.startswith("<!-- gitops-train:experiment=tiny-lr -->")
    # Issue 37: the plan's estimate is recorded at launch (identity.json, so an MLflow tag) and the
    # comment's first screen prices the runs against it, says what merging does and links MLflow.
    from reports.records import launch_estimate
    from validation.loader import load_spec

    planned = launch_estimate(load_spec(repo / "experiments" / "tiny-lr.yaml"))["estimate_device_hours"]
    assert read_json(candidate.seed_dirs[0] / "identity.json")["estimate_device_hours"] == planned
    top = comment.split("<details", 1)[0]
    assert "❌" not in top and "the approved plan estimated (recorded at launch)" in top and "**If merged:**" in top
    assert "[MLflow: compare the 2 runs](http://127.0.0.1:5000/#/compare-runs?" in top
    assert (candidate.report_dir / "summary.txt").read_text().startswith(candidate.verdict.upper() + ": tiny-lr vs")

    # Both runs are in MLflow with their identity tags.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    for result in (candidate, baseline):
        exp = client.get_experiment_by_name(result.spec.name)
        runs = client.search_runs([exp.experiment_id])
        assert len(runs) == 1
        tags = runs[0].data.tags
        assert tags["pipeline.identity"] == read_json(result.seed_dirs[0] / "identity.json")["identity"]
        assert float(tags["pipeline.estimate_device_hours"]) > 0  # what records_from_mlflow reads
        assert "eval/loss" in runs[0].data.metrics


def test_second_run_is_all_cached_and_other_candidate_reuses_baseline(
        repo: Path, first_run: tuple[Recorder, Any, Any], other_pr: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(repo / "runs"))
    uri = f"sqlite:///{repo / 'mlflow.db'}"
    rec = Recorder()
    flow = ExperimentFlow(repo, RunOptions(tracking_uri=uri, smoke=False), rec)
    candidate, baseline = flow.run(repo / "experiments" / "tiny-lr.yaml")
    skipped = {(e, s) for e, s, ev in rec.events if ev == "skipped"}
    assert {("tiny-base", "train"), ("tiny-lr", "train"), ("tiny-base", "check"), ("tiny-lr", "evaluate")} <= skipped
    assert not [e for e in rec.events if e[1] == "training"], "nothing may be trained again"
    assert candidate.report_dir and (candidate.report_dir / "report.md").exists()

    # Another PR's candidate against the same baseline (`other_pr`): the baseline is not trained
    # again. The only training launched for that PR is its candidate's (what --detach submitted),
    # and neither of its flows trained anything else.
    assert set(other_pr["submitted"]) == {"tiny-lr2"}, other_pr["submitted"]
    for events in (other_pr["detach_events"], other_pr["follow_events"]):
        trained = [label for label, kind, _ in events if kind == "training"]
        assert set(trained) <= {"tiny-lr2 seed 1234"}, trained
        assert ("tiny-base", "train", "skipped") in events, events
    other, base2 = other_pr["candidate"], other_pr["baseline"]
    assert other.seed_dirs == [other_pr["submitted"]["tiny-lr2"][1]]
    assert base2 is not None and base2.seed_dirs == baseline.seed_dirs
    assert json.loads((other.report_dir / "result.json").read_text())


def test_two_experiments_at_once_share_one_baseline_training(repo: Path, first_run: tuple[StartsTwoPRs, Any, Any]) -> None:
    """Two `pipeline run` processes (two PRs) started together, while the first run trains the
    baseline they need too (`first_run`): separate run directories and MLflow runs, the shared
    baseline trained once, no shared temp files, both succeed."""
    from mlflow.tracking import MlflowClient

    rec = first_run[0]
    assert len(rec.procs) == 2  # started when the baseline's training began
    assert [p.returncode for p in rec.procs] == [0, 0], rec.outputs
    assert [label for label, kind, _ in rec.events if kind == "training"][0] == "tiny-base seed 1234"

    runs = repo / "runs"
    uri = f"sqlite:///{repo / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    # runs/<YYYYMMDD>/<experiment>/<run-id> (runs/registry/ holds the preregistrations)
    for name in ("tiny-a", "tiny-b", "tiny-base"):
        dirs = [p for p in runs.glob(f"[0-9]*/{name}/*") if p.is_dir()]
        assert len(dirs) == 1, (name, dirs)
        exp = client.get_experiment_by_name(name)
        assert len(client.search_runs([exp.experiment_id])) == 1, name
    assert not list(runs.rglob("*.tmp")), "no temp file may be left behind"


def test_detach_submits_and_a_later_run_follows_the_job_to_the_report(
        repo: Path, other_pr: dict[str, Any]) -> None:
    # `other_pr`: tiny-lr2 submitted with --detach (the baseline had a finished run, so only the
    # candidate was submitted), then a plain run followed it.
    seed, seed_dir, kind, job_id = other_pr["submitted"]["tiny-lr2"]
    assert (seed, kind) == (1234, "local") and job_id
    assert other_pr["between"]["tiny-lr2"] == {"launch": True, "train_marker": False}  # not done yet: no marker
    assert (seed_dir / "launch.json").exists()

    candidate = other_pr["candidate"]
    assert candidate.seed_dirs == [seed_dir]
    assert read_json(seed_dir / "result.json")["status"] == "finished"
    assert (candidate.report_dir / "report.md").exists()
    # Followed, not launched a second time: one MLflow run for the experiment.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny-lr2")
    assert len(client.search_runs([exp.experiment_id])) == 1
