"""Run directories -> records -> report files, and `pipeline report` on the command line.

Run directories are written by `tests/infra/report_runs.write_run` in the trainer's
documented format (result.json, metrics.jsonl, alerts.jsonl, spec.resolved.json,
identity.json), laid out as the orchestrator lays them out: `<experiment run>/train/seed-<n>/`.
"""

from __future__ import annotations

import json

import pytest

from basics.errors import UsageError
from reports import build_report, record_from_run_dir
from reports.records import launch_estimate
from tests.infra.report_runs import SPEC, write_run
from validation.spec import ExperimentSpec


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
    assert r.cost.estimate_device_hours == pytest.approx(launch_estimate(ExperimentSpec.model_validate(SPEC))["estimate_device_hours"])  # recorded at launch
    assert r.perf.tokens_per_s == 5000.0 + 1234
    assert r.hypothesis["metric"] == "eval/loss"


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


def test_a_directory_without_result_json_is_refused(tmp_path):
    with pytest.raises(UsageError, match="not a finished run"):
        record_from_run_dir(tmp_path)


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
    assert "Data checks: candidate ✅ 2/2 expectations met; baseline ❌ 1/2 expectations met: max_js_divergence (docs)" in md
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["verdict"]["outcome"] == "supported" and result["truncated"] is False
    assert [p["seed"] for p in result["pairs"]] == list(seeds)
    assert {c["field"] for c in result["params_diff"]} == {"train.lr", "data.sources.code.weight", "data.sources.docs.weight"}
    for name in result["plots"]:
        assert (tmp_path / "out" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(result["plots"]) == {"eval_loss.png", "train_loss.png"}


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


def test_a_truncated_comment_comes_with_the_full_report(tmp_path):
    cand = write_run(tmp_path / "c", "higher-lr", 1, final_loss=3.0, lr=6e-3)
    base = write_run(tmp_path / "b", "base", 1, final_loss=3.2, lr=3e-3)
    built = build_report([cand], [base], out_dir=tmp_path / "out", max_chars=2500, env={})
    assert len(built.markdown) <= 2500 and "report_full.md" in built.markdown
    full = (tmp_path / "out" / "report_full.md").read_text()
    assert "Report truncated" not in full and "<summary>Runs" in full
    assert json.loads((tmp_path / "out" / "result.json").read_text())["truncated"] is True
