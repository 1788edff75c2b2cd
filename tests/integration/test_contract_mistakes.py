"""The whole plug-in contract on the mistakes that make a hypothesis lie (issue 38), and on every
shipped architecture; exports checked where the trainer writes them.

Each mistake file (tests/infra/mistake_plugins.py: a correct GPT written from scratch with a
few lines changed) gets exactly one failure line from `check_architecture`, at the line of its
marker, naming the cause and the culprit. On the old main the causal leak, the export whose
weights are not the class its config.json names, the parameter created in forward, the unused
parameter and the unsaved buffer passed every check; dropout left on in eval was blamed on
the document boundary; a global head count in a `view` was reported at the class line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import models
from tests.infra.mistake_plugins import MISTAKES, load, marker_line, write

ARCHS = sorted(models.architectures())

EXPECTED = {  # mistake -> (method, start of the message: the cause and the culprit)
    "boundary_leak": ("build()", "forward(position_ids=...): a packed row's logits differ"),
    "causal_leak": ("Attention.forward", "causality: position 0 sees the future"),
    "tp_share_leak": ("Attention.forward", "causality: position 0 sees the future"),
    "export_mismatch": ("export()", "export_note() says transformers loads the export (loadable: true), but on the "
                                    "tiny model: config.json names GPT2LMHeadModel (model_type gpt2), which loads "
                                    "model.safetensors with 25 missing keys"),
    "param_in_forward": ("Block.forward", "parameter 'blocks.0.gain' is created inside forward"),
    "unused_parameter": ("LayerNorm.__init__", "parameter 'blocks.0.ln_2.weight' has no gradient"),
    "unsaved_buffer": ("GPT.__init__", "buffer 'running_rms' (registered with persistent=False, so not in "
                                       "state_dict()) holds state that training changed"),
    "eval_dropout": ("Attention.forward", "forward is not deterministic in eval mode"),
    "tp_global_heads": ("Attention.forward", "with tp=2 rank 0 holds 2 of the 4 heads, but this reshape"),
}


def test_every_mistake_has_its_expectation():
    assert set(EXPECTED) == set(MISTAKES)


def test_the_correct_file_passes_the_whole_contract(tmp_path: Path):
    from trainer.contract_checks import check_architecture

    path = write("from_scratch", tmp_path)
    assert check_architecture(load(path), str(path)) == []


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_the_whole_contract_names_each_mistake_in_one_line_at_its_culprit(tmp_path: Path, mistake: str):
    from trainer.contract_checks import check_architecture

    path = write(mistake, tmp_path, mistake)
    failures = check_architecture(load(path), str(path))
    assert len(failures) == 1, (MISTAKES[mistake].what, [f.text() for f in failures])
    (failure,) = failures
    method, start = EXPECTED[mistake]
    assert (failure.file, failure.line, failure.method) == (str(path), marker_line(path.read_text(), mistake), method)
    assert failure.message.startswith(start), failure.message
    assert "\n" not in failure.text()


@pytest.mark.parametrize("model_type", ARCHS)
def test_every_shipped_architecture_keeps_the_forward_state_and_export_promises(model_type: str):
    """Determinism, causality (one process and rank 0's tp=2 share), packed rows, the state round
    trip and the export check, on every tiny variant (the counts: tests/unit/test_models_contract.py)."""
    from trainer.contract_checks import check_architecture

    failures = check_architecture(models.architectures()[model_type], f"models/{model_type}.py",
                                  only=("determinism", "causal", "packed", "state", "export"))
    assert failures == [], [f.text() for f in failures]


# --------------------------------------------------------------------------- exports, where the trainer writes them


def _export(arch: Any, directory: Path) -> tuple[Any, Any]:
    """A tiny initialised model of `arch` exported as the trainer does (weights, the architecture's files)."""
    from trainer.contract_checks import initialised
    from trainer.hf_checkpoint import write_weights

    model = initialised(arch)
    directory.mkdir(parents=True, exist_ok=True)
    write_weights(model, arch, directory)
    return model, arch.export(model, directory)


def test_a_transformers_export_is_verified_where_it_is_written_and_says_use_cache_false(tmp_path: Path):
    from trainer.contract_checks import tiny
    from trainer.hf_checkpoint import EXPORT_ATOL, verify_export

    arch = tiny(models.architectures()["llama"], tie_word_embeddings=False)
    _, note = _export(arch, tmp_path / "llama")
    config = json.loads((tmp_path / "llama" / "config.json").read_text())
    assert config["use_cache"] is False  # with a cache, transformers ignores packed documents
    checked, verified = verify_export(arch, tmp_path / "llama", note)
    assert checked == note and checked.loadable
    assert verified == ("verified on the export: LlamaForCausalLM (model_type llama) loads it with no missing or "
                        f"unexpected keys, logits within {EXPORT_ATOL:g} on a plain and a packed row")
    # An export that keeps use_cache: true (a plug-in's own config) gives other logits on packed rows.
    (tmp_path / "llama" / "config.json").write_text(json.dumps(config | {"use_cache": True}))
    checked, verified = verify_export(arch, tmp_path / "llama", note)
    assert not checked.loadable and verified == "failed on the export"
    assert "on a packed row (tolerance 0.0001) (its config.json says use_cache: true" in checked.how
    assert checked.how.endswith("models.load_exported(dir) rebuilds it")


def test_an_export_whose_weights_are_not_the_class_its_config_names_is_recorded_not_loadable(tmp_path: Path):
    from trainer.contract_checks import tiny
    from trainer.hf_checkpoint import verify_export

    arch = tiny(load(write("export_mismatch", tmp_path, "export_mismatch")))
    _, note = _export(arch, tmp_path / "model")
    assert note.loadable  # what the file says
    checked, verified = verify_export(arch, tmp_path / "model", note)
    assert not checked.loadable and verified == "failed on the export"
    assert checked.how.startswith("transformers does not load it as the trained model: config.json names "
                                  "GPT2LMHeadModel (model_type gpt2), which loads model.safetensors with 25 missing "
                                  "keys"), checked.how
    # The report states a refused export with its reason (reports/report.py reads `how`).
    from reports.records import record_from_run_dir

    run = tmp_path / "run"
    run.mkdir()
    (run / "result.json").write_text(json.dumps({"status": "finished", "experiment": "x", "steps": 1,
                                                 "final_metrics": {"eval/loss": 3.0},
                                                 "export": checked.model_dump() | {"verified": verified}}))
    tags = record_from_run_dir(run).tags
    assert tags["export_loadable"] == "false" and "GPT2LMHeadModel" in tags["export"]


def test_a_model_too_large_to_load_twice_is_checked_on_a_tiny_model_of_its_configuration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import trainer.hf_checkpoint as hf
    from trainer.contract_checks import tiny

    arch = tiny(models.architectures()["llama_qknorm"], attn_gate=True)
    _, note = _export(arch, tmp_path / "model")
    monkeypatch.setattr(hf, "EXPORT_CHECK_MAX_PARAMETERS", arch.parameter_count() - 1)
    checked, verified = hf.verify_export(arch, tmp_path / "model", note)
    assert checked == note
    assert verified.startswith(f"verified on a tiny model of this configuration (this one has "
                               f"{arch.parameter_count():,} parameters")
    assert "LlamaQKNormForCausalLM (model_type llama_qknorm) loads it" in verified


def test_a_plain_pytorch_export_is_not_checked_and_says_so(tmp_path: Path):
    from trainer.contract_checks import tiny
    from trainer.hf_checkpoint import verify_export

    arch = tiny(models.architectures()["nanogpt"])
    _, note = _export(arch, tmp_path / "model")
    assert verify_export(arch, tmp_path / "model", note) == (
        note, "not checked: the architecture says transformers does not load it")
