"""The held-out metrics a verdict is computed on do not move under the experiment.

Same weights, same data version: `micro_batch_size` must not change eval/loss or eval/bpb
(the eval set is fixed per data version), mixture weights must not change the aggregate
(pooled over the fixed set), and bits per byte counts exactly the scored tokens' bytes.
"""

from __future__ import annotations

import contextlib
import copy
import math

import pytest

from basics.environment import scoped_environ
from tests.infra.golden_run import REPO, tiny_spec, write_corpus


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import torch

    from pipelines.dataprep.prepare import prepare_data
    from trainer.model import build_model
    from validation.spec import DataSpec, ExperimentSpec

    tmp = tmp_path_factory.mktemp("evalfixed")
    corpus = write_corpus(tmp / "corpus")
    raw = tiny_spec(corpus)
    raw["train"]["eval_batches"] = 2
    with scoped_environ(PIPELINE_DATA_ROOTS=str(tmp / "corpus")):
        def spec_with(micro: int, prose_weight: float = 0.6) -> ExperimentSpec:
            data = copy.deepcopy(raw)
            data["train"]["micro_batch_size"] = micro
            data["data"]["sources"][0]["weight"], data["data"]["sources"][1]["weight"] = prose_weight, 1 - prose_weight
            return ExperimentSpec.model_validate(data)

        prepared = prepare_data(DataSpec.model_validate(raw["data"]), REPO, tmp / "cache", progress=False)
        reweighted = prepare_data(spec_with(4, 0.2).data, REPO, tmp / "cache", progress=False)
    assert reweighted.version == prepared.version  # weights do not change the prepared data
    torch.manual_seed(0)
    model = build_model(spec_with(4).model).eval()
    return spec_with, prepared, model


def evaluate(spec, prepared, model) -> dict[str, float]:
    import torch

    from trainer.collectives import Collectives
    from trainer.evaluation import Evaluator
    from trainer.step import to_device

    evaluator = Evaluator(spec, prepared, Collectives(1, "cpu"), 0, contextlib.nullcontext,
                          lambda b: to_device(b, torch.device("cpu")))
    return evaluator(model)


def test_micro_batch_size_does_not_move_eval_metrics_of_the_same_weights(setup):
    spec_with, prepared, model = setup
    reference = evaluate(spec_with(16), prepared, model)
    assert {"eval/loss", "eval/bpb", "eval/prose/loss", "eval/code/bpb"} <= set(reference)
    for micro in (8, 4, 3):
        other = evaluate(spec_with(micro), prepared, model)
        assert set(other) == set(reference)
        for key, value in reference.items():
            assert other[key] == pytest.approx(value, rel=1e-5), (micro, key)


def test_mixture_weights_do_not_change_the_aggregate_metric(setup):
    spec_with, prepared, model = setup
    a = evaluate(spec_with(4, 0.6), prepared, model)
    b = evaluate(spec_with(4, 0.2), prepared, model)
    for key in ("eval/loss", "eval/bpb", "eval/prose/loss", "eval/code/loss"):
        assert b[key] == pytest.approx(a[key], rel=1e-6), key


def test_bits_per_byte_count_exactly_the_scored_tokens(setup):
    import numpy as np

    from trainer.batches import eval_batches
    from trainer.evaluation import EVAL_ROWS_PER_BATCH, token_byte_lengths

    spec_with, prepared, model = setup
    tokenizer = prepared.tokenizer
    lengths = token_byte_lengths(tokenizer)
    for index in range(len(lengths)):
        text = tokenizer.decode([index])
        if text and text.isascii() and tokenizer.id_to_token(index) != "<|endoftext|>":
            assert lengths[index] == len(text.encode("utf-8")), (index, text)
    # bpb = nats / ln 2 / bytes of the scored tokens, per source
    spec = spec_with(4)
    out = evaluate(spec, prepared, model)
    for source in prepared.sources:
        labels = np.concatenate([b["labels"] for b in eval_batches(prepared, source, spec.data.seq_len,
                                                                   EVAL_ROWS_PER_BATCH, spec.train.eval_batches)])
        targets = labels[:, 1:]
        scored = targets[targets != -100]
        n_bytes = sum(len(tokenizer.decode([int(t)]).encode("utf-8")) for t in scored)
        assert out[f"eval/{source}/bpb"] == pytest.approx(out[f"eval/{source}/loss"] / math.log(2) / n_bytes * len(scored),
                                                          rel=1e-3)
