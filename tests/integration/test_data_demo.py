"""The demo corpus at full size: prepared (and reused from the cache), packed, and three
distinct token distributions."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines.dataprep.demo_corpus import build_demo_corpus
from pipelines.dataprep.prepare import prepare_data
from tests.infra.data_helpers import demo_sources, make_spec
from trainer.batches import MixtureBatcher, eval_batches, packing_efficiency
from validation.data.profile import js_divergence


def test_full_demo_prepares_packs_and_is_distinct(tmp_path: Path) -> None:
    corpus = build_demo_corpus(tmp_path / "data/demo")
    assert corpus.bytes["code"] >= 3_000_000 and corpus.bytes["docs"] >= 1_000_000
    spec = make_spec(demo_sources({"code": 0.4, "docs": 0.4, "reference": 0.2}), seq_len=128,
                     tokenizer={"kind": "bpe", "vocab_size": 2048})
    prepared = prepare_data(spec.data, tmp_path, progress=False)
    assert prepared_is_reused(spec, tmp_path, prepared.version)
    profiles = {s: prepared.stats[s]["token_profile"]["distribution"] for s in prepared.sources}
    assert js_divergence(profiles["code"], profiles["docs"]) > 0.1  # three really different distributions
    assert js_divergence(profiles["code"], profiles["reference"]) > 0.1
    medians = {s: prepared.stats[s]["doc_tokens"]["p50"] for s in prepared.sources}
    assert medians["docs"] < medians["code"] < medians["reference"]
    batcher = MixtureBatcher(prepared, spec.data.weights(), 128, 16, 1, 1234)
    efficiency = [packing_efficiency(batcher.batch(step, 0)) for step in range(50)]
    assert min(e["efficiency"] for e in efficiency) >= 0.99
    assert np.mean([e["supervised_fraction"] for e in efficiency]) > 0.9
    for source in prepared.sources:
        assert next(eval_batches(prepared, source, 128, 4, 1))["input_ids"].shape[1] == 128


def prepared_is_reused(spec, repo: Path, version: str) -> bool:
    again = prepare_data(spec.data, repo, progress=False)
    return again.cache_hit and again.version == version
