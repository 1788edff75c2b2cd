"""`model.init_from` of a local Hugging Face checkpoint directory (trainer/hf_checkpoint.py): a
small random checkpoint that transformers itself saves loads into the trainer's model with the
very same logits as transformers' own `from_pretrained` (`torch.equal`), for a Llama-3.1-style
config (rope theta and llama3 scaling, norm eps, grouped-query attention, untied), a sharded
Qwen2 (q/k/v biases, tied) and a GPT-2 saved without its head; a config.json that disagrees with the spec is refused, naming the
field, at validate time (JSON only) and by the trainer."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from basics.errors import TrainingError
from validation.spec import model_spec

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
         "intermediate_size": 96, "vocab_size": 256, "max_position_embeddings": 256, "tie_word_embeddings": False,
         "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 64}}
GPT2 = {"model_type": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 256,
        "max_position_embeddings": 128, "layer_norm_eps": 1e-5}
QWEN2 = {"model_type": "qwen2", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
         "intermediate_size": 96, "vocab_size": 256, "max_position_embeddings": 256, "tie_word_embeddings": True,
         "rope_theta": 1000000.0, "rms_norm_eps": 1e-6}


def _save_with_transformers(fields: dict[str, Any], directory: Path, bare: bool = False, **save: Any) -> None:
    """What a user downloads: the transformers model of these fields, randomly initialised, saved
    (`bare`: the base model without its head, as GPT-2's original checkpoint: `h.0...`, not
    `transformer.h.0...`)."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM

    torch.manual_seed(0)
    config = model_spec({**fields}).hf_config()
    model = (AutoModel if bare else AutoModelForCausalLM).from_config(config)
    with torch.no_grad():  # HF zero-initialises biases: make them random so a skipped bias shows
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_()
    model.save_pretrained(directory, **save)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    _save_with_transformers(LLAMA, root / "llama")
    _save_with_transformers(QWEN2, root / "qwen2", max_shard_size="60KB")
    _save_with_transformers(GPT2, root / "gpt2", bare=True)
    return {"llama": root / "llama", "qwen2": root / "qwen2", "gpt2": root / "gpt2"}


def _trainer_model(fields: dict[str, Any], directory: Path) -> Any:
    import torch

    from trainer.parallel import ParallelDims, build_model

    spec = SimpleNamespace(model=model_spec({**fields, "init_from": str(directory)}),
                           train=SimpleNamespace(activation_checkpointing="none", precision="fp32"))
    topo = ParallelDims(world=1, rank=0, dp=1, tp=1, fsdp=False)
    return build_model(spec, topo, torch.device("cpu"), seed=1, init_from=directory)  # type: ignore[arg-type]


@pytest.mark.parametrize(("family", "fields"), [("llama", LLAMA), ("qwen2", QWEN2), ("gpt2", GPT2)])
def test_logits_equal_transformers_own_loading(checkpoints: dict[str, Path], family: str, fields: dict[str, Any]):
    import torch
    from transformers import AutoModelForCausalLM

    directory = checkpoints[family]
    assert (directory / "model.safetensors.index.json").is_file() == (family == "qwen2")  # sharded
    reference = AutoModelForCausalLM.from_pretrained(directory).eval()
    ours = _trainer_model(fields, directory).eval()
    ids = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(32)[None]  # llama3 scaling rescales the frequencies at every position
    with torch.no_grad():
        expected = reference(input_ids=ids, position_ids=positions, use_cache=False).logits
        got = ours(input_ids=ids, position_ids=positions, use_cache=False).logits
    assert torch.equal(got, expected)


def test_the_trainer_refuses_a_checkpoint_of_another_configuration(checkpoints: dict[str, Path]):
    with pytest.raises(TrainingError, match=r"config.json: model.rope_theta: config.json has rope_theta 500000.0"):
        _trainer_model({**LLAMA, "rope_theta": 10000.0}, checkpoints["llama"])


def test_validate_refuses_a_config_json_that_disagrees_naming_the_field(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch):
    """JSON only: no torch, no weights needed."""
    import json
    import shutil

    from validation.loader import check_spec

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "experiments").mkdir()
    (tmp_path / "data" / "ckpt").mkdir(parents=True)
    shutil.copy(repo / "experiments" / "base.yaml", tmp_path / "experiments" / "base.yaml")
    # What Meta's Llama-3-8B config.json says (transformers 4 spelling: rope_theta, no rope_parameters).
    (tmp_path / "data" / "ckpt" / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 4, "intermediate_size": 384, "vocab_size": 2048, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True}))
    (tmp_path / "experiments" / "warm.yaml").write_text(
        "name: warm\nextends: base.yaml\nhypothesis:\n  statement: Starting from the checkpoint lowers the "
        "held-out loss after 200 steps.\nmodel:\n  init_from: data/ckpt\n  rope_theta: 500000.0\n")
    monkeypatch.chdir(tmp_path)
    spec, issues = check_spec(tmp_path / "experiments" / "warm.yaml")
    assert spec is None
    assert [(i.file, i.field, i.line) for i in issues] == [("experiments/warm.yaml", "model.rms_norm_eps", 5)]
    assert "config.json has rms_norm_eps 1e-05, this spec builds 1e-06" in issues[0].message
