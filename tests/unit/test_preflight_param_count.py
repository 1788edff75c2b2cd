"""Each stock architecture's `parameter_count()` is exact: preflight's memory and FLOPs rest on it.

One test builds each supported architecture from config with transformers (random
init, nothing downloaded) and counts its parameters; everything else in preflight
is checked against hand-computed numbers without importing transformers.
"""

from __future__ import annotations

import pytest

from validation.spec import ModelSpec, model_spec

CASES = [
    {"model_type": "llama", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 256},
    {
        "model_type": "llama",
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "intermediate_size": 160,
        "vocab_size": 320,
        "tie_word_embeddings": False,
    },
    {
        "model_type": "gpt2",
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 4,
        "vocab_size": 256,
        "max_position_embeddings": 128,
    },
    {
        "model_type": "gpt2",
        "hidden_size": 32,
        "num_layers": 3,
        "num_heads": 2,
        "vocab_size": 300,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
    },
    {
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "vocab_size": 256,
    },
    {
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 1,
        "vocab_size": 256,
        "tie_word_embeddings": False,
    },
    {
        "model_type": "mistral",
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "vocab_size": 256,
    },
]


def _hf_config(spec: ModelSpec):
    import transformers

    if spec.model_type == "gpt2":
        return transformers.GPT2Config(
            n_embd=spec.hidden_size,
            n_layer=spec.num_layers,
            n_head=spec.num_heads,
            n_inner=spec.ffn_size,
            vocab_size=spec.vocab_size,
            n_positions=spec.max_position_embeddings,
            tie_word_embeddings=spec.tie_word_embeddings,
            bos_token_id=0,
            eos_token_id=0,
        )
    config_class = transformers.AutoConfig.for_model(spec.model_type).__class__
    return config_class(
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.kv_heads,
        intermediate_size=spec.ffn_size,
        vocab_size=spec.vocab_size,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=0,
        eos_token_id=0,
    )


def test_parameter_count_matches_transformers_for_every_model_type():
    transformers = pytest.importorskip("transformers")

    def count(config) -> int:
        # parameters() yields a tied embedding once, as the formula counts it.
        return sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(config).parameters())

    counted = {}
    for case in CASES:
        spec = model_spec(case)
        # Our own plain config, and the one the architecture file really builds (what preflight must describe).
        counted[str(case)] = (spec.parameter_count(), count(_hf_config(spec)), count(spec.hf_config()))
    mismatches = {k: v for k, v in counted.items() if len(set(v)) != 1}
    assert not mismatches, f"(formula, transformers, trainer's config) differ: {mismatches}"
    assert {t for t in (c["model_type"] for c in CASES)} == {"llama", "gpt2", "qwen2", "mistral"}
