"""`pipeline run` end to end on CPU: baseline first, candidate, report, sticky comment;
a second run reuses everything; another candidate reuses the baseline's training."""

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
    demo_corpus(root / "data" / "demo", 150_000)
    return root


@pytest.fixture(scope="module")
def first_run(repo: Path) -> tuple[Recorder, Any, Any]:
    """The first `pipeline run` of tiny-lr in `repo` (PR 42): what it recorded, the candidate and the
    baseline. A fixture, so a test that needs the finished first run gets it alone or in any order."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PIPELINE_RUNS_DIR", str(repo / "runs"))
        rec = Recorder()
        flow = ExperimentFlow(repo, RunOptions(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}", pr=42), rec)
        candidate, baseline = flow.run(repo / "experiments" / "tiny-lr.yaml")
    return rec, candidate, baseline


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

    # Both runs are in MLflow with their identity tags.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    for result in (candidate, baseline):
        exp = client.get_experiment_by_name(result.spec.name)
        runs = client.search_runs([exp.experiment_id])
        assert len(runs) == 1
        tags = runs[0].data.tags
        assert tags["pipeline.identity"] == read_json(result.seed_dirs[0] / "identity.json")["identity"]
        assert "eval/loss" in runs[0].data.metrics


def test_second_run_is_all_cached_and_other_candidate_reuses_baseline(
        repo: Path, first_run: tuple[Recorder, Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(repo / "runs"))
    uri = f"sqlite:///{repo / 'mlflow.db'}"
    rec = Recorder()
    flow = ExperimentFlow(repo, RunOptions(tracking_uri=uri, smoke=False), rec)
    candidate, baseline = flow.run(repo / "experiments" / "tiny-lr.yaml")
    skipped = {(e, s) for e, s, ev in rec.events if ev == "skipped"}
    assert {("tiny-base", "train"), ("tiny-lr", "train"), ("tiny-base", "check"), ("tiny-lr", "evaluate")} <= skipped
    assert not [e for e in rec.events if e[1] == "training"], "nothing may be trained again"
    assert candidate.report_dir and (candidate.report_dir / "report.md").exists()

    # Another PR's candidate against the same baseline: the baseline is not trained again.
    rec2 = Recorder()
    other, base2 = ExperimentFlow(repo, RunOptions(tracking_uri=uri, smoke=False), rec2).run(
        repo / "experiments" / "tiny-lr2.yaml")
    trained = [label for label, kind, _ in rec2.events if kind == "training"]
    assert trained == ["tiny-lr2 seed 1234"]
    assert base2 is not None and base2.seed_dirs == baseline.seed_dirs
    assert json.loads((other.report_dir / "result.json").read_text())


def test_two_experiments_at_once_share_one_baseline_training(tmp_path: Path) -> None:
    """Two `pipeline run` processes (two PRs) started together: separate run directories and
    MLflow runs, the shared baseline trained once, no shared temp files, both succeed."""
    import os
    import subprocess
    import sys

    from tests.infra.corpus import demo_corpus

    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "tiny-base.yaml").write_text(BASE)
    (tmp_path / "experiments" / "tiny-a.yaml").write_text(CANDIDATE.format(name="tiny-a", lr=0.005))
    (tmp_path / "experiments" / "tiny-b.yaml").write_text(CANDIDATE.format(name="tiny-b", lr=0.007))
    demo_corpus(tmp_path / "data" / "demo", 150_000)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # Create the MLflow schema once: two processes migrating a new sqlite file at once is an
    # MLflow limitation, not what this test is about.
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=uri).search_experiments()
    env = dict(os.environ, PIPELINE_RUNS_DIR=str(tmp_path / "runs"), MLFLOW_TRACKING_URI=uri)
    procs = [
        subprocess.Popen([sys.executable, "-m", "pipelines", "run", f"experiments/{n}.yaml", "--no-smoke"],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for n in ("tiny-a", "tiny-b")
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs

    runs = tmp_path / "runs"
    # runs/<YYYYMMDD>/<experiment>/<run-id> (runs/registry/ holds the preregistrations)
    dirs = {p.parent.name: p for p in runs.glob("[0-9]*/*/*") if p.is_dir()}
    assert set(dirs) == {"tiny-a", "tiny-b", "tiny-base"}
    client = MlflowClient(tracking_uri=uri)
    for name, expected in (("tiny-a", 1), ("tiny-b", 1), ("tiny-base", 1)):
        exp = client.get_experiment_by_name(name)
        assert len(client.search_runs([exp.experiment_id])) == expected, name
    assert not list(runs.rglob("*.tmp")), "no temp file may be left behind"


def test_detach_submits_and_a_later_run_follows_the_job_to_the_report(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.orchestrate import Detached

    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(repo / "runs"))
    (repo / "experiments" / "tiny-detach.yaml").write_text(CANDIDATE.format(name="tiny-detach", lr=0.008))
    uri = f"sqlite:///{repo / 'mlflow.db'}"
    flow = ExperimentFlow(repo, RunOptions(tracking_uri=uri, smoke=False, detach=True), Recorder())
    with pytest.raises(Detached):
        flow.run(repo / "experiments" / "tiny-detach.yaml")
    # The candidate is submitted (and the baseline too when it has no finished run yet).
    submitted = {name: (seed, seed_dir, kind, job_id) for name, seed, seed_dir, kind, job_id in flow.detached}
    seed, seed_dir, kind, job_id = submitted["tiny-detach"]
    assert (seed, kind) == (1234, "local") and job_id
    assert (seed_dir / "launch.json").exists()
    assert not (seed_dir.parent.parent / "stages" / "train.json").exists()  # not done yet: no marker

    rec = Recorder()
    candidate, _ = ExperimentFlow(repo, RunOptions(tracking_uri=uri, smoke=False), rec).run(
        repo / "experiments" / "tiny-detach.yaml")
    assert candidate.seed_dirs == [seed_dir]
    assert read_json(seed_dir / "result.json")["status"] == "finished"
    assert (candidate.report_dir / "report.md").exists()
    # Followed, not launched a second time: one MLflow run for the experiment.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("tiny-detach")
    assert len(client.search_runs([exp.experiment_id])) == 1
