"""The tokenizer files of an export (models/_export.py): special tokens read from the tokenizer
itself, written as transformers expects, and read back as the ids config.json states."""

from __future__ import annotations

import json
from pathlib import Path

from models._export import special_token_ids, special_tokens, write_tokenizer


def _tokenizer(*special: str) -> dict:
    return {"version": "1.0", "added_tokens": [{"id": i, "content": t, "special": True} for i, t in enumerate(special)],
            "model": {"type": "BPE", "vocab": {}, "merges": []}}


def test_special_tokens_come_from_the_tokenizer_by_their_usual_names() -> None:
    eot = "<|endoftext|>"
    assert special_tokens(_tokenizer(eot)) == {"bos": eot, "eos": eot, "pad": eot}  # GPT-2's convention
    assert special_tokens(_tokenizer("<unk>", "<s>", "</s>")) == {"bos": "<s>", "eos": "</s>", "pad": "</s>"}
    assert special_tokens(_tokenizer("<pad>", eot)) == {"bos": eot, "eos": eot, "pad": "<pad>"}
    assert special_tokens(_tokenizer("<|sep|>")) == {"bos": "<|sep|>", "eos": "<|sep|>", "pad": "<|sep|>"}
    assert special_tokens(_tokenizer()) == {"bos": None, "eos": None, "pad": None}


def test_tokenizer_files_are_written_and_read_back_as_ids(tmp_path: Path) -> None:
    source = tmp_path / "tokenizer.json"
    source.write_text(json.dumps(_tokenizer("<pad>", "<|endoftext|>")))
    out = tmp_path / "model"
    out.mkdir()
    ids = write_tokenizer(source, out, max_length=128)
    assert ids == {"bos_token_id": 1, "eos_token_id": 1, "pad_token_id": 0}
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["model_max_length"] == 128
    assert (config["eos_token"], config["pad_token"], config["add_bos_token"]) == ("<|endoftext|>", "<pad>", False)
    assert json.loads((out / "special_tokens_map.json").read_text())["bos_token"] == "<|endoftext|>"
    assert (out / "tokenizer.json").read_bytes() == source.read_bytes()
    assert special_token_ids(out) == ids
    assert special_token_ids(tmp_path / "nothing") == {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
