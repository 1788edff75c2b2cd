"""The run's export, RUN/model/: what the registry registers and `eval.tasks` score.

model.safetensors from the model parts (one process, DDP: the whole model is on every rank) or,
for a sharded layout (FSDP, TP, pipeline stages), streamed from its final checkpoint tensor by
tensor (trainer/checkpoint/sharded.py), so no process ever holds the full model; then the
tokenizer files, the architecture's own files (models/_export.py) and export.json, checked on
the written files (trainer/hf_checkpoint.py `verify_export`) before the directory is renamed
into place.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors.torch import save_file
from transformers.utils import logging as hf_logging

from models._export import write_export, write_export_info
from trainer.checkpoint.sharded import export_safetensors
from trainer.hf_checkpoint import verify_export

if TYPE_CHECKING:
    from trainer.model_parts import ModelParts
def export_model(arch: Any, parts: ModelParts, out: Path, tokenizer_path: Path,
                 checkpoint: Path | None = None) -> tuple[Any, str]:
    """RUN/model/ (`out`): model.safetensors, the tokenizer files transformers loads, the
    architecture's own files (config.json, ...) and export.json, for the registry
    (models/_export.py); written beside it, checked, then renamed into place. `checkpoint`: a
    sharded layout's final checkpoint, streamed tensor by tensor (no process ever holds the full
    model); without one, the parts' `owner` is the whole model. Returns (the export note as
    checked, what checked it)."""
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    tied = set(arch.tied_weight_names) if arch.tie_word_embeddings else set()
    tmp.mkdir(parents=True)
    if checkpoint is not None:
        export_safetensors(checkpoint, tmp / "model.safetensors", skip=tied)
    else:
        state = {k: v.detach().contiguous().cpu() for k, v in parts.owner.state_dict().items() if k not in tied}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    # Tokenizer files transformers reads, then what the architecture needs to load (a
    # transformers config.json with the tokenizer's special ids, ...), then export.json.
    note = write_export(arch, parts.owner, tmp, tokenizer_path)
    # Checked where it is written: a note saying transformers loads it is tried on these files
    # (the class config.json names, no missing or unexpected keys, the same logits), else
    # `loadable: false` with the reason, which result.json and the report carry.
    checked = verify_export(arch, tmp, note)
    write_export_info(arch, checked[0], tmp, verified=checked[1])
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    return checked
