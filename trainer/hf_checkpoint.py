"""`model.init_from` of a local Hugging Face checkpoint directory: `config.json` checked against
the spec's model (the architecture's `init_from_problems`, plain JSON), then the weights by their
Hugging Face names, one tensor at a time, from `model.safetensors` or from the shards that
`model.safetensors.index.json` lists. The project's own exports (RUN/model/) are such
directories too. A tied output weight may be absent; any other missing tensor, or a checkpoint
tensor the model has no place for, is refused."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from validation.errors import TrainingError

if TYPE_CHECKING:
    import torch

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
# Buffers older checkpoints saved next to the weights (rotary frequencies, GPT-2's causal mask):
# recomputed from the config, never weights.
_BUFFER_SUFFIXES = ("rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")


class CheckpointTensors:
    """The tensors of one checkpoint directory by name, each file opened once, lazily."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        index = self.directory / INDEX
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
            if not isinstance(weight_map, dict):
                raise TrainingError(f"{index}: no weight_map")
            self.files = {name: self.directory / file for name, file in weight_map.items()}
        elif (self.directory / SINGLE).is_file():
            from safetensors import safe_open

            with safe_open(str(self.directory / SINGLE), framework="pt") as fh:
                self.files = dict.fromkeys(fh.keys(), self.directory / SINGLE)
        else:
            raise TrainingError(f"{self.directory}: neither {SINGLE} nor {INDEX}")
        self._stack = ExitStack()
        self._open: dict[Path, Any] = {}

    def __enter__(self) -> CheckpointTensors:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        path = self.files[name]
        if path not in self._open:
            if not path.is_file():
                raise TrainingError(f"{self.directory / INDEX} lists {path.name}, which does not exist")
            self._open[path] = self._stack.enter_context(safe_open(str(path), framework="pt"))
        tensor: torch.Tensor = self._open[path].get_tensor(name)
        return tensor


def checkpoint_name(name: str, keys: set[str] | dict[str, Any], prefix: str) -> str | None:
    """The checkpoint's name for model parameter `name`: the same, or without the base model's
    prefix (`transformer.h.0...` is `h.0...` in checkpoints saved from the bare GPT-2 model)."""
    if name in keys:
        return name
    if prefix and name.startswith(prefix + "."):
        short = name[len(prefix) + 1:]
        return short if short in keys else None
    return None


def check_config(directory: Path, arch: Any) -> None:
    """Refuse a config.json that describes another model than the spec (one line, the field)."""
    problems = arch.init_from_problems(directory) if hasattr(arch, "init_from_problems") else []
    if problems:
        field, why = problems[0]
        raise TrainingError(f"{Path(directory) / 'config.json'}: model.{field}: {why}")


def load_checkpoint(model: torch.nn.Module, directory: Path, arch: Any, copy: Any) -> None:
    """Every parameter of `model` from the checkpoint by its Hugging Face name, written with
    `copy(param, full_tensor)` (the caller slices to its shard)."""
    import torch

    check_config(directory, arch)
    tied = set(arch.tied_weight_names) if arch.tie_word_embeddings else set()
    prefix = str(getattr(model, "base_model_prefix", "") or "")
    buffers = {name for name, _ in model.named_buffers()}
    with CheckpointTensors(directory) as tensors, torch.no_grad():
        used: set[str] = set()
        missing = []
        for name, param in model.named_parameters():  # a tied weight is listed once
            key = checkpoint_name(name, tensors.files, prefix)
            if key is None:
                if name not in tied:
                    missing.append(name)
                continue
            full = tensors.get(key)
            if tuple(full.shape) != tuple(param.shape):
                raise TrainingError(f"{directory}: {key} has shape {tuple(full.shape)}, the model's "
                                    f"{name} {tuple(param.shape)}")
            copy(param, full)
            used.add(key)
        unexpected = sorted(k for k in set(tensors.files) - used
                            if not k.endswith(_BUFFER_SUFFIXES) and k not in tied
                            and k not in buffers and f"{prefix}.{k}" not in buffers)
        if missing or unexpected:
            raise TrainingError(f"{directory}: the checkpoint does not match the spec's model: missing {missing[:3]}"
                                f"{' ...' if len(missing) > 3 else ''}, unexpected {unexpected[:3]}"
                                f"{' ...' if len(unexpected) > 3 else ''}")
