"""`pipeline smoke FILE` end to end: an experiment YAML in a fresh repository layout, the demo
corpus built for it, the shrunk model trained in-process, checks and result JSON written."""

from __future__ import annotations

import json
from pathlib import Path

EXPERIMENT = """\
name: smoke-check
owner: ml-platform
hypothesis:
  statement: A tiny llama on the demo mixture learns enough to lower its held-out loss.
  metric: eval/loss
  direction: decrease
  min_effect: 0.01
  baseline: champion
model:
  model_type: llama
  hidden_size: 256
  num_layers: 8
  num_heads: 8
  num_kv_heads: 4
  vocab_size: 512
data:
  sources:
    - {name: code, path: data/demo/code.jsonl, weight: 0.6}
    - {name: docs, path: data/demo/docs.jsonl, weight: 0.4}
  seq_len: 256
  tokenizer: {kind: bpe, vocab_size: 512}
train:
  max_steps: 5000
  micro_batch_size: 16
"""


def test_pipeline_smoke_passes_and_writes_its_result(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pipelines.cli import app
    from pipelines.dataprep.demo_corpus import build_demo_corpus

    (tmp_path / "experiments").mkdir()
    spec_file = tmp_path / "experiments" / "smoke-check.yaml"
    spec_file.write_text(EXPERIMENT)
    corpus = build_demo_corpus(tmp_path / "data" / "demo", 120_000)
    corpus.paths.pop("reference").unlink()
    out = tmp_path / "smoke.json"
    result = CliRunner().invoke(app, ["smoke", str(spec_file), "--run-dir", str(tmp_path / "run"), "--out", str(out)])
    assert result.exit_code == 0, result.output[-3000:]
    smoke = json.loads(out.read_text())
    assert smoke["status"] == "passed" and all(smoke["checks"].values()), smoke["checks"]
    assert smoke["model"]["hidden_size"] == 64 and smoke["model"]["num_layers"] == 2
    assert smoke["steps"] == 30 and len(smoke["losses"]) == 30
    assert smoke["losses"][-1] < smoke["losses"][0]
    assert smoke["tokens_per_s"] > 0 and {"eval/code/loss", "eval/docs/bpb", "eval/loss"} <= set(smoke["eval"])
    assert "passed" in result.output
