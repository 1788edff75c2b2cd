"""Run directories -> records -> report files, and `pipeline report` on the command line.

Run directories are written here in the trainer's documented format (result.json,
metrics.jsonl, alerts.jsonl, spec.resolved.json, identity.json), laid out as the
orchestrator lays them out: `<experiment run>/train/seed-<n>/`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from reports import build_report, record_from_run_dir
from validation.errors import UsageError
from validation.spec import ExperimentSpec

SPEC = {
    "name": "higher-lr",
    "owner": "ml-platform",
    "hypothesis": {
        "statement": "Doubling the peak learning rate lowers the held-out loss by at least two percent.",
        "metric": "eval/loss", "direction": "decrease", "min_effect": 0.02, "baseline": "base", "seeds": 3,
    },
    "model": {"model_type": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "vocab_size": 256,
              "max_position_embeddings": 64},
    "data": {"sources": [{"name": "code", "path": "data/demo/code.jsonl", "weight": 0.6},
                         {"name": "docs", "path": "data/demo/docs.jsonl", "weight": 0.4}],
             "seq_len": 32, "tokenizer": {"vocab_size": 256}},
    "train": {"lr": 6e-3, "max_steps": 100, "micro_batch_size": 4},
}


def spec_for(name: str, lr: float, seed: int, code_weight: float = 0.6) -> dict:
    data = json.loads(json.dumps(SPEC))
    data["name"], data["train"]["lr"], data["train"]["seed"] = name, lr, seed
    data["data"]["sources"][0]["weight"], data["data"]["sources"][1]["weight"] = code_weight, round(1 - code_weight, 6)
    return ExperimentSpec.model_validate(data).resolved_dict()


def write_run(root: Path, name: str, seed: int, *, final_loss: float, lr: float, code_weight: float = 0.6,
              env: dict | None = None, trainer: str = "trainer-aaaa", alerts: list[dict] | None = None,
              check_ok: bool | None = True, status: str = "finished") -> Path:
    """A seed run directory shaped like the trainer's; losses decay to `final_loss`."""
    exp_dir = root / name
    run_dir = exp_dir / "train" / f"seed-{seed}"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.resolved.json").write_text(json.dumps(spec_for(name, lr, seed, code_weight)))
    (run_dir / "identity.json").write_text(json.dumps({
        "run_id": f"{name}-s{seed}", "experiment": name, "seed": seed, "code_version": "c0de", "dirty": False,
        "spec_hash": "abc", "data_version": f"data-{code_weight}", "identity": f"id-{name}-{seed}",
        "trainer_version": trainer, "pr": 7, "launcher": "local"}))
    lines = []
    for step in range(10, 101, 10):
        loss = final_loss + 2.0 * math.exp(-step / 30)
        lines.append({"step": step, "key": "train/loss", "value": loss + 0.1})
        if step % 50 == 0:
            lines.append({"step": step, "key": "eval/loss", "value": loss})
        lines.append({"step": step, "key": "data/mix/code", "value": code_weight + 0.01})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 1')  # torn last line
    (run_dir / "alerts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in alerts or []))
    if check_ok is not None:  # as validation.data.checks and the orchestrator's check stage write them
        (exp_dir / "stages").mkdir(exist_ok=True)
        (exp_dir / "check").mkdir(exist_ok=True)
        outcomes = [{"check": "min_documents", "source": "code", "observed": 80.0, "expected": "at least 50",
                     "passed": True, "message": ""},
                    {"check": "max_js_divergence", "source": "docs", "observed": 0.3, "expected": "at most 0.15",
                     "passed": check_ok, "message": "drifted"}]
        (exp_dir / "check" / "data_check.json").write_text(json.dumps(
            {"experiment": name, "success": check_ok, "total": 2, "failed": 0 if check_ok else 1, "outcomes": outcomes}))
        (exp_dir / "stages" / "check.json").write_text(json.dumps(
            {"stage": "check", "identity": "x", "status": "ok", "started_at": 0, "finished_at": 1,
             "outputs": {"ok": check_ok, "json": str(exp_dir / "check" / "data_check.json")}}))
    (run_dir / "result.json").write_text(json.dumps({
        "status": status, "mlflow_run_id": None, "steps": 100, "tokens": 12800, "wall_s": 36.0,
        "final_metrics": {"eval/loss": final_loss, "train/loss": final_loss + 0.1, "perf/tokens_per_s": 5000.0 + seed,
                          "perf/mfu": 0.01, "perf/peak_mem_gb": 0.5},
        "env": env or {"python": "3.11", "torch": "2.13.0"}, "alerts": len(alerts or [])}))
    return run_dir


@pytest.mark.unit
def test_record_from_run_dir_reads_every_file(tmp_path):
    alert = {"level": "P1", "kind": "grad_norm_spike", "message": "grad norm 40x its mean", "step": 30}
    d = write_run(tmp_path, "higher-lr", 1234, final_loss=3.0, lr=6e-3, alerts=[alert])
    r = record_from_run_dir(d)
    assert (r.run_id, r.experiment, r.seed, r.status) == ("higher-lr-s1234", "higher-lr", 1234, "finished")
    assert r.final_metrics["eval/loss"] == 3.0
    assert [s for s, _ in r.history["train/loss"]] == list(range(10, 101, 10))
    assert r.params["train.lr"] == 6e-3 and r.params["model.hidden_size"] == 32
    assert r.tags["trainer_version"] == "trainer-aaaa" and r.env_hash
    assert r.data.version == "data-0.6" and r.data.mixture_requested == {"code": 0.6, "docs": 0.4}
    assert r.data.mixture_realised == {"code": pytest.approx(0.61)} and r.data.checks_passed is True
    assert r.alerts[0].kind == "grad_norm_spike" and r.alerts[0].step == 30
    assert r.cost.device_hours == pytest.approx(0.01)  # 36 s x 1 process
    assert r.cost.estimate_device_hours is not None and r.cost.estimate_device_hours > 0  # from preflight
    assert r.perf.tokens_per_s == 5000.0 + 1234
    assert r.hypothesis["metric"] == "eval/loss"


@pytest.mark.unit
def test_a_runs_speed_is_its_median_window_not_its_last(tmp_path):
    # Seen in a real `pipeline run experiments/more-code.yaml`: the baseline's last window read
    # 1,199 tokens/s against ~16,000 in every other window, and the report called the candidate
    # +1275 % faster under "tokens/s (mean)".
    d = write_run(tmp_path, "base", 1234, final_loss=3.0, lr=3e-4)
    windows = [16000.0, 16500.0, 15800.0, 1199.0]
    complete = (d / "metrics.jsonl").read_text().rsplit("\n", 1)[0] + "\n"  # without the torn last line
    (d / "metrics.jsonl").write_text(complete + "".join(
        json.dumps({"step": 10 * (i + 1), "key": "perf/tokens_per_s", "value": v}) + "\n" for i, v in enumerate(windows)))
    r = record_from_run_dir(d)
    assert r.perf.tokens_per_s == pytest.approx(15900.0)  # median of the windows
    assert r.final_metrics["perf/tokens_per_s"] == pytest.approx(15900.0)  # what the metric table compares
    assert r.final_metrics["eval/loss"] == 3.0  # other metrics keep their final value


@pytest.mark.unit
def test_a_directory_without_result_json_is_refused(tmp_path):
    with pytest.raises(UsageError, match="not a finished run"):
        record_from_run_dir(tmp_path)


@pytest.mark.unit
def test_build_report_writes_markdown_json_and_pngs(tmp_path):
    seeds = (1234, 1235, 1236)
    cands = [write_run(tmp_path / "c", "higher-lr", s, final_loss=3.0 + (s - 1234) * 0.02, lr=6e-3, code_weight=0.7,
                       env={"python": "3.11", "torch": "2.14.0"}, trainer="trainer-bbbb") for s in seeds]
    bases = [write_run(tmp_path / "b", "base", s, final_loss=3.2 + (s - 1234) * 0.021, lr=3e-3, check_ok=False)
             for s in seeds]
    summary = tmp_path / "summary.md"
    built = build_report(cands, bases, out_dir=tmp_path / "out", env={"GITHUB_STEP_SUMMARY": str(summary)})

    assert built.verdict.outcome == "supported", built.verdict.reason
    assert not (tmp_path / "out" / "report_full.md").exists()  # only written when the comment had to be cut
    md = (tmp_path / "out" / "report.md").read_text()
    assert md == built.markdown and summary.read_text().strip() == md.strip()
    assert "`train.lr`" in md and "`data.sources.code.weight`" in md and "`model.hidden_size`" not in md  # only what changed
    assert "Stale baseline" in md and "Different environments" in md
    assert "Data checks: baseline ❌ failed: max_js_divergence (docs); candidate ✅ passed" in md
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["verdict"]["outcome"] == "supported" and result["truncated"] is False
    assert [p["seed"] for p in result["pairs"]] == list(seeds)
    assert {c["field"] for c in result["params_diff"]} == {"train.lr", "data.sources.code.weight", "data.sources.docs.weight"}
    for name in result["plots"]:
        assert (tmp_path / "out" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(result["plots"]) == {"eval_loss.png", "train_loss.png"}


@pytest.mark.unit
def test_cli_report_prints_the_verdict_and_fails_cleanly(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from pipelines.cli import app

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    cand = write_run(tmp_path / "c", "higher-lr", 1234, final_loss=3.0, lr=6e-3)
    base = write_run(tmp_path / "b", "base", 1234, final_loss=3.2, lr=3e-3)
    runner = CliRunner()
    ok = runner.invoke(app, ["report", "--candidate", str(cand), "--baseline", str(base), "--out", str(tmp_path / "r")])
    assert ok.exit_code == 0, ok.output
    assert "verdict: INCONCLUSIVE: one seed" in ok.output  # the outcome once (was "inconclusive: Inconclusive:")
    assert (tmp_path / "r" / "result.json").is_file()

    bad = runner.invoke(app, ["report", "--candidate", str(tmp_path / "nope")])
    assert bad.exit_code == UsageError.exit_code
    assert "not a finished run" in bad.output and "Traceback" not in bad.output


@pytest.mark.integration
def test_records_from_a_real_mlflow_store_and_report_files_logged_back(tmp_path, monkeypatch):
    """MLflow's own client on a sqlite store (the laptop default); no mocks."""
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    from reports import records_from_mlflow

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = {}
    for name, final in (("higher-lr", 3.0), ("base", 3.2)):
        exp_id = client.create_experiment(name, artifact_location=(tmp_path / "artifacts" / name).as_uri())
        for seed in (1, 2):
            run = client.create_run(exp_id)
            value = final + seed / 100
            client.log_batch(
                run.info.run_id,
                metrics=[Metric("train/loss", value + 2 / s, 0, s) for s in range(1, 21)]
                + [Metric("eval/loss", value, 0, 20), Metric("perf/tokens_per_s", 4000.0, 0, 20)],
                params=[Param("train.lr", "0.006" if name == "higher-lr" else "0.003"), Param("train.seed", str(seed))],
                tags=[RunTag("pipeline.seed", str(seed)), RunTag("pipeline.trainer_version", "t1"),
                      RunTag("pipeline.data_version", "d1"), RunTag("env.torch", "2.13.0" if name == "base" else "2.14.0"),
                      RunTag("env.hostname", f"host-{seed}"), RunTag("alert.loss_rise", "P1 step 12: loss rose for 50 steps"),
                      RunTag("pipeline.hypothesis_registered", json.dumps(
                          {k: SPEC["hypothesis"].get(k, 0.05) for k in ("metric", "direction", "min_effect", "alpha",
                                                                          "seeds", "baseline")}))],
            )
            client.set_terminated(run.info.run_id)
            runs[(name, seed)] = run.info.run_id

    cands = records_from_mlflow(client, "higher-lr", public_url="https://mlflow.example.internal")
    bases = records_from_mlflow(client, "base")
    assert records_from_mlflow(client, "no-such-experiment") == []
    assert sorted(r.seed for r in cands) == [1, 2] and all(r.status == "finished" for r in cands)
    first = next(r for r in cands if r.seed == 1)
    assert first.final_metrics["eval/loss"] == pytest.approx(3.01)
    assert [s for s, _ in first.history["train/loss"]] == list(range(1, 21))
    assert first.params["train.lr"] == 0.006 and first.tags["trainer_version"] == "t1"
    assert first.mlflow_url.startswith("https://mlflow.example.internal/#/experiments/")
    assert first.env == {"torch": "2.14.0"}  # the host name does not make runs incomparable
    assert (first.alerts[0].level, first.alerts[0].kind, first.alerts[0].step) == ("P1", "loss_rise", 12)
    assert first.registrations["higher-lr"]["hypothesis"]["direction"] == "decrease"  # preregistered at start

    built = build_report(cands, bases, hypothesis=SPEC["hypothesis"], out_dir=tmp_path / "report", mlflow_client=client)
    assert built.verdict.outcome == "supported", built.verdict.reason  # 2 seeds, -6.2 % each
    assert "torch: 2.14.0 vs 2.13.0" in built.markdown and not built.report.hypothesis_changes
    logged = {Path(a.path).name for a in client.list_artifacts(built.report.candidates[0].mlflow_run_id, "report")}
    assert {"report.md", "train_loss.png"} <= logged


@pytest.mark.unit
def test_a_truncated_comment_comes_with_the_full_report(tmp_path):
    cand = write_run(tmp_path / "c", "higher-lr", 1, final_loss=3.0, lr=6e-3)
    base = write_run(tmp_path / "b", "base", 1, final_loss=3.2, lr=3e-3)
    built = build_report([cand], [base], out_dir=tmp_path / "out", max_chars=2500, env={})
    assert len(built.markdown) <= 2500 and "report_full.md" in built.markdown
    full = (tmp_path / "out" / "report_full.md").read_text()
    assert "Report truncated" not in full and "<summary>Runs" in full
    assert json.loads((tmp_path / "out" / "result.json").read_text())["truncated"] is True
