"""What every exported model directory (RUN/model/) holds besides the weights, whatever its
architecture: the tokenizer as transformers loads it and the special tokens it states.

A helper, not a plug-in (its name starts with `_`). Torch-free.

- `tokenizer.json` (the run's tokenizer, unchanged), `tokenizer_config.json` and
  `special_tokens_map.json`: `AutoTokenizer.from_pretrained(dir)` and lm-eval's
  `HFLM(pretrained=dir)` load it with no extra arguments.
- The special tokens are read from the tokenizer itself (`special_tokens`): end of text is its
  `<|endoftext|>` (what `pipeline data` trains into every tokenizer, id 0) or another usual
  name; beginning of text and padding fall back to end of text (GPT-2's convention). The
  architecture's config (config.json, generation_config.json) states the same ids
  (`special_token_ids`), so `generate()` stops at the real end of text.
- `write_export` writes these files, then lets the architecture write what loading needs
  (`Architecture.export`, which finds the tokenizer files already there), then export.json
  (`write_export_info`; the trainer rewrites it with the note its check of the files gives:
  a note saying transformers loads the export is verified where the export is written,
  `trainer.hf_checkpoint.verify_export`, and becomes `loadable: false` with the reason when not).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from models import Architecture, ExportNote

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "<|im_end|>")
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "<|bos|>")
PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]", "<|padding|>")
ROLES = ("bos", "eos", "pad")


def special_tokens(tokenizer_json: dict[str, Any]) -> dict[str, str | None]:
    """bos/eos/pad token text of a tokenizer (the parsed tokenizer.json), chosen among its special
    tokens by their usual names: eos the first of `EOS_NAMES` present (else the only special
    token), bos and pad their own names or else eos. None where the tokenizer has none."""
    special = [t["content"] for t in tokenizer_json.get("added_tokens", []) if t.get("special")]

    def first(names: tuple[str, ...]) -> str | None:
        return next((n for n in names if n in special), None)

    eos = first(EOS_NAMES) or (special[0] if len(special) == 1 else None)
    return {"bos": first(BOS_NAMES) or eos, "eos": eos, "pad": first(PAD_NAMES) or eos}


def _token_ids(tokenizer_json: dict[str, Any], tokens: dict[str, str | None]) -> dict[str, int | None]:
    ids = {t["content"]: int(t["id"]) for t in tokenizer_json.get("added_tokens", [])}
    return {f"{role}_token_id": ids.get(text) if text else None for role, text in tokens.items()}


def tokenizer_special_ids(tokenizer_json: dict[str, Any]) -> dict[str, int | None]:
    """`bos_token_id`, `eos_token_id`, `pad_token_id` of a parsed tokenizer.json (`special_tokens`)."""
    return _token_ids(tokenizer_json, special_tokens(tokenizer_json))


def write_tokenizer(tokenizer_file: Path, out_dir: Path, max_length: int) -> dict[str, int | None]:
    """Copy `tokenizer_file` into `out_dir` with the tokenizer_config.json and
    special_tokens_map.json transformers reads; returns the special-token ids."""
    out_dir = Path(out_dir)
    shutil.copy2(tokenizer_file, out_dir / "tokenizer.json")
    parsed = json.loads(Path(tokenizer_file).read_text(encoding="utf-8"))
    tokens = special_tokens(parsed)
    named = {f"{role}_token": text for role, text in tokens.items() if text}
    # PreTrainedTokenizerFast loads tokenizer.json as it is (no model-specific rebuild); nothing
    # is prepended: the model was trained on documents without a BOS.
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
              "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False} | named
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(named, indent=2, sort_keys=True) + "\n")
    return _token_ids(parsed, tokens)


def special_token_ids(directory: str | Path) -> dict[str, int | None]:
    """`bos_token_id`, `eos_token_id`, `pad_token_id` of the tokenizer in `directory` (its
    tokenizer_config.json where there is one); all None without a tokenizer.json."""
    directory = Path(directory)
    if not (directory / "tokenizer.json").is_file():
        return {f"{role}_token_id": None for role in ROLES}
    parsed = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    config_file = directory / "tokenizer_config.json"
    if not config_file.is_file():
        return tokenizer_special_ids(parsed)
    config = json.loads(config_file.read_text(encoding="utf-8"))
    return _token_ids(parsed, {role: config.get(f"{role}_token") for role in ROLES})


def write_export(arch: Architecture, model: torch.nn.Module, out_dir: Path, tokenizer_file: Path) -> ExportNote:
    """Everything of an export but the weights (`model.safetensors`, written by the caller):
    tokenizer files, the architecture's own files, then export.json. Returns the export note
    (the architecture's; the trainer then checks it against the files, `write_export_info`)."""
    write_tokenizer(tokenizer_file, out_dir, arch.max_position_embeddings)
    note = arch.export(model, Path(out_dir))
    write_export_info(arch, note, Path(out_dir))
    return note


def write_export_info(arch: Architecture, note: ExportNote, out_dir: Path, verified: str | None = None) -> None:
    """export.json: the architecture's fields and the export note, with what checked it (`verified`:
    the trainer loads every export it writes as its config.json says, trainer/hf_checkpoint.py)."""
    from models import EXPORT_FILE

    export = note.model_dump() | ({"verified": verified} if verified else {})
    info = {"model": arch.model_dump(mode="json"), "export": export}
    (Path(out_dir) / EXPORT_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
