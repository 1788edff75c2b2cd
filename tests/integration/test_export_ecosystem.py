"""An export (RUN/model/, written by the trainer's own export code) as the ecosystem loads it with
its defaults: `AutoTokenizer` + `AutoModelForCausalLM`, `generate()`, and lm-eval's `HFLM`,
which must give the project adapter's own log-likelihoods (trainer/lm_eval_scoring.py); a
plug-in transformers cannot load (nanogpt) is scored by lm-eval through the adapter's name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lm_eval")

from models import architectures  # noqa: E402
from models._export import write_export  # noqa: E402
from tests.infra.lm_eval_tasks import LINES  # noqa: E402
from trainer.lm_eval_scoring import LM_NAME, ProjectLM  # noqa: E402

EOT = "<|endoftext|>"


class Req:
    def __init__(self, *args: Any):
        self.args = args


def _tokenizer(path: Path, special: list[str]) -> Path:
    """A byte-level BPE as `pipeline data` fits it (its special tokens first, ids 0, 1, ...)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(LINES * 4, trainers.BpeTrainer(
        vocab_size=300, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok.save(str(path))
    return path


def export(out: Path, model_type: str, special: list[str] | None = None) -> Path:
    """A random tiny model exported as the trainer does (weights, then `write_export`)."""
    from safetensors.torch import save_file

    fields = {"model_type": model_type, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "vocab_size": 320,
              "max_position_embeddings": 64, "intermediate_size": 64}
    if model_type == "llama":
        fields["num_kv_heads"] = 2
    arch = architectures()[model_type].model_validate(fields)
    torch.manual_seed(0)
    model = arch.build()
    out.mkdir(parents=True)
    tied = set(arch.tied_weight_names) if arch.tie_word_embeddings else set()
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k not in tied}, str(out / "model.safetensors"))
    write_export(arch, model, out, _tokenizer(out.parent / f"{out.name}-tokenizer.json", special or [EOT]))
    return out


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(tmp_path_factory.mktemp("export") / "llama", "llama")


# Hand requests where scoring conventions differ: an empty context, a continuation whose first
# token merges with the context's last ("ret" + "urn"), trailing spaces, an exact split.
REQUESTS = [("", LINES[1]), ("", "def"), ("    ret", "urn a + b"), ("def add(a, b): ", " return"),
            (LINES[0], "\n" + LINES[1]), (LINES[2] + "\n", LINES[3])]


def test_transformers_loads_the_export_with_defaults_and_stops_at_the_end_of_text(llama: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(llama)
    model = AutoModelForCausalLM.from_pretrained(llama)
    config = json.loads((llama / "config.json").read_text())
    generation = json.loads((llama / "generation_config.json").read_text())
    eot = tok.convert_tokens_to_ids(EOT)
    assert (tok.eos_token, tok.bos_token, tok.pad_token) == (EOT, EOT, EOT)
    assert (config["eos_token_id"], config["bos_token_id"], config["pad_token_id"]) == (eot, eot, eot)
    assert generation["eos_token_id"] == eot == model.generation_config.eos_token_id
    assert tok(LINES[0]).input_ids == tok(LINES[0], add_special_tokens=False).input_ids  # nothing prepended
    # A model whose every logit ties picks id 0, the end of text: generate() stops after it.
    with torch.no_grad():
        model.model.norm.weight.zero_()
    prompt = tok(LINES[0], return_tensors="pt")
    made = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert made.shape[1] == prompt.input_ids.shape[1] + 1 and int(made[0, -1]) == eot


def test_hflm_with_defaults_gives_the_project_adapters_numbers(llama: Path) -> None:
    from lm_eval.models.huggingface import HFLM

    hf = HFLM(pretrained=str(llama), device="cpu", batch_size=4)  # lm-eval's default device is cuda
    ours = ProjectLM.from_export(llama, batch_size=4)
    assert ours.prefix_token_id == hf.prefix_token_id == hf.tokenizer.convert_tokens_to_ids(EOT)
    reqs = [Req(c, x) for c, x in REQUESTS]
    for (a, greedy_a), (b, greedy_b), req in zip(ours.loglikelihood(reqs), hf.loglikelihood(reqs), reqs, strict=True):
        assert a == pytest.approx(b, abs=1e-5) and greedy_a == greedy_b, req.args
    rolling = [Req(LINES[0]), Req("\n".join(LINES * 8))]  # the second is longer than 64 tokens: windows
    for a, b in zip(ours.loglikelihood_rolling(rolling), hf.loglikelihood_rolling(rolling), strict=True):
        assert a == pytest.approx(b, abs=1e-4)


def test_a_plug_in_transformers_cannot_load_is_scored_by_lm_eval_through_the_adapters_name(tmp_path: Path) -> None:
    from lm_eval.api.registry import get_model

    model_dir = export(tmp_path / "nano", "nanogpt", special=["<pad>", EOT])  # end of text is id 1 here
    note = json.loads((model_dir / "export.json").read_text())["export"]
    assert "models.load_exported" in note["how"] and LM_NAME in note["how"]
    lm = get_model(LM_NAME).create_from_arg_string(f"pretrained={model_dir}", {"batch_size": 2, "device": None})
    assert isinstance(lm, ProjectLM) and lm.prefix_token_id == 1 and lm.eot_token_id == 1
    (score, _), = lm.loglikelihood([Req("", LINES[1])])
    (text,) = lm.loglikelihood_rolling([Req(LINES[1])])
    assert text == pytest.approx(score, abs=1e-5)  # both condition the first token on the tokenizer's prefix
    ids = lm.tok_encode(LINES[1])
    with torch.no_grad():
        logp = torch.log_softmax(lm.model(input_ids=torch.tensor([[1, *ids]])).logits.float(), -1)[0]
    assert score == pytest.approx(sum(float(logp[i, t]) for i, t in enumerate(ids)), abs=1e-5)
