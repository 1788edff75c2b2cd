"""The fields of published Hugging Face configurations are spec fields, passed to the
transformers config each architecture file builds. Reproduced on the old main: Llama-3 was built
with rope theta 10,000 and RMSNorm eps 1e-6 (published 500,000 and 1e-5), Qwen2 with theta 1e4
(published 1e6), and Mistral's sliding window was dropped. Their defaults stay transformers'
own, so the shipped experiments build the very same model as before."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from validation.spec import model_spec

SMALL = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 256, "max_position_embeddings": 256}


def test_llama3_rope_theta_and_norm_eps_reach_the_transformers_config():
    config = model_spec({"model_type": "llama", **SMALL, "rope_theta": 500000.0, "rms_norm_eps": 1e-5}).hf_config()
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 500000.0}
    assert config.rms_norm_eps == 1e-5


def test_llama31_rope_scaling_reaches_the_transformers_config():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    config = model_spec({"model_type": "llama", **SMALL, "rope_theta": 500000.0, "rope_scaling": scaling}).hf_config()
    assert config.rope_parameters == {"rope_theta": 500000.0, **scaling}
    with pytest.raises(ValidationError, match="llama3 needs high_freq_factor"):
        model_spec({"model_type": "llama", **SMALL, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                    "low_freq_factor": 1.0, "original_max_position_embeddings": 64}})


def test_qwen2_theta_and_mistral_sliding_window_reach_the_transformers_config():
    assert model_spec({"model_type": "qwen2", **SMALL, "rope_theta": 1e6}).hf_config().rope_parameters["rope_theta"] == 1e6
    mistral = model_spec({"model_type": "mistral", **SMALL, "sliding_window": 4096}).hf_config()
    assert mistral.sliding_window == 4096


def test_the_sliding_window_changes_what_a_token_attends_to():
    import torch

    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    logits = []
    for window in (None, 4):
        torch.manual_seed(0)
        model = model_spec({"model_type": "mistral", **SMALL, "num_layers": 1, "sliding_window": window}).build()
        with torch.no_grad():
            logits.append(model.eval()(input_ids=ids, position_ids=torch.arange(12)[None], use_cache=False).logits)
    assert torch.equal(logits[0][:, :4], logits[1][:, :4])  # inside the window: the same
    assert not torch.allclose(logits[0][:, 4:], logits[1][:, 4:])  # beyond it: the window is honoured


def test_biases_and_gpt2_norm_eps_reach_the_transformers_config():
    llama = model_spec({"model_type": "llama", **SMALL, "attention_bias": True, "mlp_bias": True}).hf_config()
    assert llama.attention_bias and llama.mlp_bias
    assert model_spec({"model_type": "gpt2", **SMALL, "layer_norm_eps": 1e-6}).hf_config().layer_norm_epsilon == 1e-6


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "mistral", "llama_qknorm"])
def test_defaults_are_transformers_own_so_shipped_models_do_not_change(model_type: str):
    config = model_spec({"model_type": model_type, **SMALL}).hf_config()
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    assert config.rms_norm_eps == 1e-6
    assert getattr(config, "sliding_window", None) is None
    assert not getattr(config, "attention_bias", False) and not getattr(config, "mlp_bias", False)
