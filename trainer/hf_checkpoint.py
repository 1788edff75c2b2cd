"""`model.init_from` of a local Hugging Face checkpoint directory: `config.json` checked against
the spec's model (the architecture's `init_from_problems`, plain JSON), then the weights by their
Hugging Face names, one tensor at a time, from `model.safetensors` or from the shards that
`model.safetensors.index.json` lists. The project's own exports (RUN/model/) are such
directories too. A tied output weight may be absent; any other missing tensor, or a checkpoint
tensor the model has no place for, is refused. A run's export (trainer/export.py) is checked
here (`verify_export`)."""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from basics.errors import TrainingError

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


# --------------------------------------------------------------------------- exports, checked where written

EXPORT_ATOL = 1e-4
"""Largest |logit| difference (fp32) allowed between an export as transformers loads it and the
model it was written from. Measured: 0.0 for every shipped transformers architecture (same
kernels, same weights); a weight transformers leaves at its initial value, or packed documents
it does not separate (`use_cache: true`), move them by 1e-3 to 1."""
EXPORT_CHECK_MAX_PARAMETERS = 2_000_000_000
"""Above this the trainer does not hold the exported model twice in host memory (its own rebuild
and transformers' load, fp32: 16 GB at the limit): the check runs on a tiny model of the same
configuration instead (the same export code, the same class, the same weight names), and says so."""


def write_weights(model: torch.nn.Module, arch: Any, directory: Path) -> None:
    """`directory/model.safetensors` from a whole (unsharded) model, as the trainer exports it: every
    state_dict() tensor but a tied output weight."""
    from safetensors.torch import save_file

    tied = set(arch.tied_weight_names) if arch.tie_word_embeddings else set()
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if k not in tied}
    save_file(state, str(Path(directory) / SINGLE), metadata={"format": "pt"})


@dataclass(frozen=True)
class ExportCheck:
    """What loading an export with transformers showed: the class, and the problem (None: none)."""

    loader: str
    problem: str | None


def _logit_rows(arch: Any) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(what, input_ids, position_ids): one plain row and, when it fits, one packed row of three
    documents (positions restarting at 0)."""
    import torch

    seq = min(32, arch.max_position_embeddings)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, arch.vocab_size, (1, seq), generator=gen)
    rows = [("plain", ids, torch.arange(seq).unsqueeze(0))]
    if seq == 32:
        rows.append(("packed", ids, torch.cat([torch.arange(n) for n in (5, 9, 18)]).unsqueeze(0)))
    return rows


def export_problem(arch: Any, directory: Path, reference: torch.nn.Module, atol: float = EXPORT_ATOL) -> ExportCheck:
    """Load the export in `directory` as the ecosystem does (offline, local files only): the
    class its config.json names (the causal-LM class of its `model_type`, as AutoModelForCausalLM
    picks it, after the architecture's `register()`; else the one `architectures` names), then
    compare. The problem, if any: transformers
    refuses the config, keys missing (left at their initial values) or unexpected (ignored), or
    logits more than `atol` from `reference`'s (the model the export was written from, fp32) on
    a plain or a packed row, called with the config's defaults (its `use_cache` included)."""
    import torch
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    from transformers.utils import logging as hf_logging

    register = getattr(arch, "register", None)
    if callable(register):
        register()
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        return ExportCheck("", "it has no config.json")
    hf_logging.disable_progress_bar()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        try:
            config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - transformers refusing the directory is the finding
            return ExportCheck("", f"transformers refuses its config.json ({type(exc).__name__}: "
                                   f"{(str(exc).strip().splitlines() or [''])[0][:200]})")
        # What AutoModelForCausalLM (and lm-eval's HFLM) load: the class of the config's model_type;
        # else the one its `architectures` names.
        cls: Any = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
        if isinstance(cls, (tuple, list)):
            cls = next((c for c in cls if c is not None), None)
        if cls is None:
            cls = next((c for c in (getattr(transformers, n, None) for n in config.architectures or [])
                        if isinstance(c, type)), None)
        if cls is None:
            return ExportCheck("", f"transformers has no causal-LM class for its model_type {config.model_type!r}")
        loader = f"{cls.__name__} (model_type {config.model_type})"
        try:
            loaded, info = cls.from_pretrained(str(directory), local_files_only=True, output_loading_info=True,
                                               dtype=torch.float32)
        except Exception as exc:  # noqa: BLE001
            return ExportCheck(loader, f"{cls.__name__}.from_pretrained raised {type(exc).__name__}: "
                                       f"{(str(exc).strip().splitlines() or [''])[0][:200]}")
    finally:
        hf_logging.set_verbosity(verbosity)
    missing, unexpected = sorted(info.get("missing_keys") or []), sorted(info.get("unexpected_keys") or [])
    mismatched = [str(m[0]) if isinstance(m, (tuple, list)) else str(m) for m in info.get("mismatched_keys") or []]
    if missing or unexpected or mismatched:
        parts = [f"{len(keys)} {what} {keys[:3]}{' ...' if len(keys) > 3 else ''}{why}"
                 for keys, what, why in ((missing, "missing keys", " (left at their initial values)"),
                                         (unexpected, "unexpected keys", " (ignored)"),
                                         (mismatched, "keys of another shape", ""))
                 if keys]
        return ExportCheck(loader, f"config.json names {loader}, which loads model.safetensors with "
                                   + " and ".join(parts) + ": a different model")
    loaded.eval()
    reference.eval()
    use_cache = bool(getattr(config, "use_cache", False))
    with torch.no_grad():
        for what, ids, pos in _logit_rows(arch):
            want = reference(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
            got = loaded(input_ids=ids, position_ids=pos).logits.float()
            diff = float((want - got).abs().max()) if want.shape == got.shape else float("inf")
            if not diff <= atol:
                cache_note = (" (its config.json says use_cache: true, and transformers then ignores the documents "
                              "that position_ids separate: write use_cache: false)") if what == "packed" and use_cache else ""
                return ExportCheck(loader, f"{loader} loads it, but its logits differ from the model's by {diff:.3g} "
                                           f"on a {what} row (tolerance {atol:g}){cache_note}")
    return ExportCheck(loader, None)


def _rebuilt(arch: Any, directory: Path) -> torch.nn.Module:
    """The architecture's own model from the export's `model.safetensors` (fp32, CPU, eval): built
    with its parameters on the meta device, then given the file's tensors (no random init of a
    model loaded twice), strictly (a tied output weight may be absent, and is re-tied)."""
    from accelerate import init_empty_weights
    from safetensors.torch import load_file

    with init_empty_weights(include_buffers=False):
        model = arch.build()
    missing, unexpected = model.load_state_dict(load_file(str(directory / SINGLE)), strict=False, assign=True)
    tied = set(arch.tied_weight_names) if arch.tie_word_embeddings else set()
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise TrainingError(f"{directory / SINGLE}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if arch.tie_word_embeddings and hasattr(model, "tie_weights"):
        model.tie_weights()
    return model.float().eval()


def verify_export(arch: Any, directory: Path, note: Any) -> tuple[Any, str]:
    """The note to record for the export just written to `directory` (weights and the
    architecture's files, before export.json), and what was checked. A note that says
    transformers loads it is checked (`export_problem`): against the model rebuilt from these
    very files (`models.load_weights`), or, above `EXPORT_CHECK_MAX_PARAMETERS`, on a tiny model
    of the same configuration; a problem turns it into `loadable: false` with the reason."""
    from models import ExportNote

    if not note.loadable:
        return note, "not checked: the architecture says transformers does not load it"
    try:
        if arch.parameter_count() <= EXPORT_CHECK_MAX_PARAMETERS:
            found, checked = export_problem(arch, directory, _rebuilt(arch, Path(directory))), "the export"
        else:
            import tempfile

            import torch

            small = type(arch).model_validate({**arch.model_dump(), **arch.smoke_overrides(256, 32)})
            torch.manual_seed(0)
            model = small.build().float().eval()  # its own random init: any weights show a mismatch
            with tempfile.TemporaryDirectory(prefix="export-check-") as tmp:
                write_weights(model, small, Path(tmp))
                small.export(model, Path(tmp))
                found = export_problem(small, Path(tmp), model)
            checked = (f"a tiny model of this configuration (this one has {arch.parameter_count():,} parameters, more "
                       f"than the {EXPORT_CHECK_MAX_PARAMETERS:,} loaded twice here)")
    except Exception as exc:  # noqa: BLE001 - a check that cannot run does not vouch for the export
        text = (str(exc).strip().splitlines() or [""])[0][:200]
        found, checked = ExportCheck("", f"the check could not run ({type(exc).__name__}: {text})"), "the export"
    if found.problem:
        how = f"transformers does not load it as the trained model: {found.problem}; models.load_exported(dir) rebuilds it"
        return ExportNote(loadable=False, how=how), f"failed on {checked}"
    return note, (f"verified on {checked}: {found.loader} loads it with no missing or unexpected keys, logits within "
                  f"{EXPORT_ATOL:g} on a plain and a packed row")

