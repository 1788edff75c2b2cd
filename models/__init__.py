"""Architectures and optimizers as plug-ins: one file each, one small typed contract.

A new architecture is one file `models/<name>.py` (a package `models/<name>/` when it grows)
that defines `Config`, a subclass of `Architecture` whose `model_type` is `Literal["<name>"]`.
A new optimizer is one file `models/optimizers/<name>.py` defining `Config`, a subclass of
`OptimizerConfig` whose `name` is `Literal["<name>"]`. Nothing else in the repository is
edited: `validation/` builds the spec's `model` and `train.optimizer` unions from what it
finds here, `trainer/` asks the file how to build, shard, initialise and export the model.
Files whose name starts with `_` are helpers, not plug-ins. A file that does not load is kept
aside (`broken_architectures()`, `broken_optimizers()`): only the experiments that select it
fail, with its file:line. `pipeline contract FILES` checks files against this contract
(validation/contract.py, trainer/contract_checks.py). See docs/architectures.md.

Files: this module is the contract (`Architecture`, `OptimizerConfig`) and the discovery of
plug-ins. Helpers: `_hf` (the shared half of the architectures built with transformers: build
from config, blocks, HF initialisation, export), `_llama_family` (the Llama-shaped decoders
llama, qwen2, mistral and llama_qknorm share), `_export` (what every export holds besides the
weights: tokenizer files transformers loads, their special-token ids, export.json), `_attention`
(causal attention inside each packed document in O(seq_len) memory, which every architecture's
blocks run: flash over variable-length documents on a GPU, a custom op elsewhere). Architectures: `gpt2`, `llama`, `qwen2`,
`mistral` (stock transformers models), `llama_qknorm` (Llama with QK-norm and a gated
attention output), `nanogpt` (plain PyTorch, no transformers), `moe` (a dropless mixture of
experts, plain PyTorch), `moe_capacity` (a capacity-limited one: its routing depends on the row,
declared as `batch_dependence`, see trainer/contract_checks.py). Optimizers: `optimizers/`.

The contract, in two halves (torchtitan's TrainSpec and levanter's registered LmConfig):

torch-free (read by `pipeline validate` and `plan`, which must not import torch, so the
module's top level imports pydantic and the standard library only; torch and transformers
are imported inside the methods of the second half):
  - the config fields: a pydantic section with a docstring per field (`pipeline validate`
    checks them with file:line errors; experiments/schema.json describes only the fields
    every architecture shares, so a new file does not regenerate it);
  - `parameter_count()`: exact, checked against the model built on the meta device;
  - `flops_per_token(seq_len)`: training FLOPs per token (forward + backward, the MFU
    convention: 6 x the parameters that take part in a matmul, plus 12 x layers x attention
    width x seq_len), checked against torch's FLOP counter on fake tensors;
  - `block_parameters()`: parameters inside the decoder blocks (tensor parallelism splits
    those; the rest is embeddings, head and final norm);
  - `activation_bytes_per_layer(seq_len, micro_batch, element_bytes)`: what one block saves
    for the backward pass, for the memory plan (checked against saved tensors measured in
    bench/bench_architectures.py);
  - `tp_plan`: module names inside one block -> "colwise" | "rowwise" | "replicate"
    (data: the trainer applies it, and refuses a name no block has; an empty plan means no
    tensor parallelism; `tensor_parallel_plan()` returns it for one configuration), and
    `tp_problem(tp)`: why a degree does not divide this model, or None;
  - `smoke_overrides(vocab_size, seq_len)`: field values of a tiny model of this kind;
  - `export_note()`: how the exported directory loads (or why it does not).

torch (the execution layer calls these; imports happen inside):
  - `build()`: the causal LM (the trainer calls it under the meta device); its forward takes
    `input_ids`, `position_ids`, `labels` (-100 = not scored; shifted inside, the HF
    convention) and `use_cache`, and returns an object with `.loss` and `.logits`;
  - `blocks(model)`, `input_embeddings(model)`, `output_modules(model)`: the FSDP units
    (each block its own group, the embedding one, final norm + head one) and the
    activation-checkpointing units;
  - `param_role(name, param)`: "hidden" (a 2-D matrix inside a block), "embedding", "head"
    or "scalar" (norm weights and biases): what an optimizer like Muon treats as a hidden
    matrix;
  - `init_parameter(model, name, shape, generator)`: the full initial value of one parameter
    (the trainer slices it to the local shard, so every layout starts identically);
  - `enable_activation_checkpointing(model)`;
  - `step_metrics(model)` (optional, default none): extra metrics logged with each training log
    line, e.g. a mixture of experts' router load (models/moe.py);
  - `export(model, out_dir)`: write config (and whatever else loading needs) next to the
    `model.safetensors` and tokenizer files the trainer wrote (their special-token ids:
    `models._export.special_token_ids(out_dir)`); returns the same note as `export_note()`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    import torch

ParamRole = Literal["hidden", "embedding", "head", "scalar"]
TPStyle = Literal["colwise", "rowwise", "replicate"]

MODELS_DIR = Path(__file__).resolve().parent
OPTIMIZERS_PACKAGE = "optimizers"


class PluginSection(BaseModel):
    """Frozen, unknown keys refused, docstrings become descriptions (like every spec section)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ExportNote(BaseModel):
    """How an exported model directory is loaded: stated in result.json and the report."""

    model_config = ConfigDict(frozen=True)

    loadable: bool
    """True when `how` loads the same model (same logits) from the directory."""
    how: str
    """One sentence: the loader call, or why there is none."""


class Architecture(PluginSection):
    """Base of every architecture's `Config`. The fields here are the ones the framework
    itself reads (tokenizer fit, sequence length, weight loading); a subclass adds its own."""

    model_type: str
    """The architecture: the name of its file under models/ (overridden by a Literal)."""
    hidden_size: Annotated[int, Field(ge=8, le=65536)]
    """Width of the residual stream."""
    num_layers: Annotated[int, Field(ge=1, le=512)]
    """Number of transformer blocks."""
    num_heads: Annotated[int, Field(ge=1, le=1024)]
    """Attention heads; must divide `hidden_size`."""
    vocab_size: Annotated[int, Field(ge=256, le=1048576)]
    """Embedding rows; must be at least the tokenizer's vocabulary."""
    max_position_embeddings: Annotated[int, Field(ge=16, le=1048576)] = 2048
    """Longest sequence the position encoding supports; must be >= `data.seq_len`."""
    tie_word_embeddings: bool = True
    """Share the input embedding and the output projection."""
    init_from: Annotated[str, Field(max_length=512)] | None = None
    """Optional local checkpoint directory (inside a data root) to initialise the weights from."""

    tp_plan: ClassVar[dict[str, TPStyle]] = {}
    """Module names inside one block -> tensor-parallel style; empty: no tensor parallelism."""
    tied_weight_names: ClassVar[tuple[str, ...]] = ("lm_head.weight",)
    """State-dict keys that are the input embedding when `tie_word_embeddings` (not saved twice)."""

    @model_validator(mode="after")
    def _heads_divide_width(self) -> Architecture:
        """`head_dim` is hidden_size / num_heads here; an architecture with its own head size
        overrides this validator by defining a method of the same name."""
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size})")
        return self

    # ------------------------------------------------------------------ torch-free facts

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads the built model has (grouped-query attention overrides this)."""
        return self.num_heads

    def parameter_count(self) -> int:
        raise NotImplementedError(f"{type(self).__module__}: parameter_count() is part of the contract")

    def active_parameter_count(self) -> int:
        """Parameters one token passes through (a mixture of experts: the shared ones plus the
        top-k experts'); equal to `parameter_count()` for a dense model. FLOPs and MFU follow it."""
        return self.parameter_count()

    def parameters_by_role(self) -> dict[ParamRole, int]:
        """Parameter count per `param_role` (torch-free): what the memory plan weighs the
        optimizer's per-role state with. Default for a dense decoder: the input embedding (and
        any learned positions) are the total minus blocks minus head and norms; the head is
        counted only when untied; hidden = the matmul parameters inside the blocks, plus the
        parameters a token does not reach (`parameter_count() - active_parameter_count()`: the
        experts it is not routed to, all matrices). An architecture whose roles differ (extra
        embeddings, expert biases) overrides it."""
        total = self.parameter_count()
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        blocks = self.block_parameters()
        # matmul_parameters counts the head (tied or not: it is a matmul per token) and,
        # for an active-only count, may be below the block total (experts): hidden matrices
        # are the block parameters minus the block's scalars, estimated from the matmul count.
        matmul_in_blocks = self.matmul_parameters() - self.vocab_size * self.hidden_size
        # A token's matmuls miss the experts it is not routed to: they are hidden matrices too.
        inactive = self.parameter_count() - self.active_parameter_count()
        hidden = max(0, min(blocks, matmul_in_blocks + inactive))
        embedding = max(0, total - blocks - head)
        scalar = max(0, total - hidden - embedding - head)
        return {"hidden": hidden, "embedding": embedding, "head": head, "scalar": scalar}

    def embedding_parameters(self) -> int:
        """Parameters outside the blocks: embeddings, head, final norm."""
        return self.parameter_count() - self.block_parameters()

    def block_parameters(self) -> int:
        raise NotImplementedError(f"{type(self).__module__}: block_parameters() is part of the contract")

    def matmul_parameters(self) -> int:
        """Parameters that take part in a matmul per token (default: all but the norm weights
        and biases the block counts report, and an untied input embedding, which is a lookup)."""
        raise NotImplementedError(f"{type(self).__module__}: matmul_parameters() is part of the contract")

    def attention_flops_per_token(self, seq_len: int) -> float:
        """12 x layers x (heads x head_dim) x seq_len, forward + backward (PaLM, App. B)."""
        return 12.0 * self.num_layers * self.num_heads * self.head_dim * seq_len

    def flops_per_token(self, seq_len: int) -> float:
        """6 x matmul parameters + attention: the MFU convention, exact for the matmuls."""
        return 6.0 * self.matmul_parameters() + self.attention_flops_per_token(seq_len)

    def activation_bytes_per_layer(self, seq_len: int, micro_batch: int, element_bytes: float) -> float:
        raise NotImplementedError(f"{type(self).__module__}: activation_bytes_per_layer() is part of the contract")

    def activation_bytes_whole_under_tp(self, seq_len: int, micro_batch: int, element_bytes: float) -> float:
        """Bytes of `activation_bytes_per_layer` that tensor parallelism leaves whole on every TP
        rank beyond the decoder's own norm inputs and residuals, which the planner counts for
        every architecture (validation/plan/memory.py, `ACTIVATION_UNSPLIT_BYTES_BY_TP`): e.g. a
        mixture of experts' routed copies of the tokens. Optional; 0 by default."""
        return 0.0

    def tensor_parallel_plan(self) -> dict[str, TPStyle]:
        """`tp_plan` for this configuration (a variant drops the modules it does not build)."""
        return dict(self.tp_plan)

    def tp_problem(self, tp: int) -> str | None:
        """Why tensor-parallel degree `tp` cannot split this model (None: it can)."""
        if tp == 1:
            return None
        if not self.tensor_parallel_plan():
            return (f"model_type {self.model_type} declares no tensor-parallel plan (models/{self.model_type}.py); "
                    "set tp: 1 (fsdp: true shards the model instead)")
        if self.num_heads % tp:
            return f"tp={tp} must divide model.num_heads ({self.num_heads})"
        if self.kv_heads % tp:
            return f"tp={tp} must divide model.num_kv_heads ({self.kv_heads})"
        return None

    def smoke_overrides(self, vocab_size: int, seq_len: int) -> dict[str, Any]:
        """Field values of a tiny model of this kind (hidden 64, 2 layers, 4 heads)."""
        return {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": vocab_size,
                "max_position_embeddings": max(128, seq_len), "init_from": None}

    def export_note(self) -> ExportNote:
        return ExportNote(loadable=False, how=f"model_type {self.model_type} declares no export")

    # ------------------------------------------------------------------ torch half

    def build(self) -> torch.nn.Module:
        raise NotImplementedError(f"{type(self).__module__}: build() is part of the contract")

    def blocks(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        raise NotImplementedError(f"{type(self).__module__}: blocks() is part of the contract")

    def input_embeddings(self, model: torch.nn.Module) -> torch.nn.Module:
        raise NotImplementedError(f"{type(self).__module__}: input_embeddings() is part of the contract")

    def output_modules(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        raise NotImplementedError(f"{type(self).__module__}: output_modules() is part of the contract")

    def param_role(self, name: str, param: torch.Tensor) -> ParamRole:
        """Default: 2-D tensors inside a block are hidden matrices, other 1-D tensors scalars."""
        if param.dim() < 2:
            return "scalar"
        if "embed" in name or name.endswith("wte.weight") or name.endswith("wpe.weight"):
            return "embedding"
        if name.startswith("lm_head"):
            return "head"
        return "hidden"

    def init_parameter(self, model: torch.nn.Module, name: str, shape: Any, gen: torch.Generator) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__module__}: init_parameter() is part of the contract")

    def enable_activation_checkpointing(self, model: torch.nn.Module) -> None:
        raise NotImplementedError(f"{type(self).__module__}: activation checkpointing is not declared")

    def step_metrics(self, model: torch.nn.Module) -> dict[str, float]:
        """Optional: extra training metrics (name -> value) the trainer logs on each log line, e.g.
        a mixture of experts' router load; what the model gathered since the last call (reading
        may reset it). Called on every rank with the same keys; the trainer logs the mean over
        ranks. Default: none."""
        return {}

    def export(self, model: torch.nn.Module, out_dir: Path) -> ExportNote:
        return self.export_note()


class OptimizerConfig(PluginSection):
    """Base of every optimizer's `Config` (`train.optimizer`), selected by `name`."""

    name: str
    """The optimizer: the name of its file under models/optimizers/ (overridden by a Literal)."""

    def state_bytes_per_parameter(self, role: ParamRole, shape: tuple[int, ...] | None = None) -> float:
        """fp32 optimizer state kept per parameter of `role` (for the memory plan)."""
        raise NotImplementedError(f"{type(self).__module__}: state_bytes_per_parameter() is part of the contract")

    def build(self, named_params: list[tuple[str, torch.Tensor, ParamRole]], train: Any) -> torch.optim.Optimizer:
        """The optimizer over `named_params` (name, parameter, role); `train` is the spec's
        `train` section (lr, weight_decay)."""
        raise NotImplementedError(f"{type(self).__module__}: build() is part of the contract")

    def implementation(self, optimizer: Any) -> str:
        """Which kernel runs (for the run record)."""
        return self.name


# --------------------------------------------------------------------------- discovery


class PluginError(Exception):
    """A file under models/ does not follow the contract: `str()` is `models/x.py:LINE: what`;
    `file` and `line` say where (for annotations), `reason` what is wrong."""

    def __init__(self, file: str, reason: str, line: int | None = None):
        self.file, self.reason, self.line = file, reason, line
        super().__init__(f"{file}{f':{line}' if line else ''}: {reason}")


def _plugin_file(module_name: str) -> str:
    """`models/x.py` (or `models/x/__init__.py` for a package plug-in), relative to the repository."""
    rel = module_name.replace(".", "/")
    return f"{rel}/__init__.py" if (MODELS_DIR.parent / rel).is_dir() else f"{rel}.py"


def _where(module_name: str, exc: BaseException) -> tuple[str, int | None]:
    """The file and line of the failure inside the plug-in's own files (or just its file)."""
    import traceback

    rel = _plugin_file(module_name)
    own = str(MODELS_DIR.parent / module_name.replace(".", "/"))

    def mine(filename: str | None) -> bool:
        return bool(filename) and (filename == own + ".py" or filename.startswith(own + "/"))  # type: ignore[operator, union-attr]

    if isinstance(exc, SyntaxError) and mine(exc.filename):
        return str(Path(str(exc.filename)).resolve().relative_to(MODELS_DIR.parent)), exc.lineno
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if mine(f.filename)]
    if frames:
        return str(Path(frames[-1].filename).resolve().relative_to(MODELS_DIR.parent)), frames[-1].lineno
    return rel, None


PluginKind = Literal["architecture", "optimizer"]


@dataclass(frozen=True)
class PluginPath:
    """A Python file under models/ as the plug-in rule sees it (`plugin_path`)."""

    path: str
    """Relative to the repository: `models/x.py`, `models/x/__init__.py`, `models/optimizers/_groups.py`."""
    folder: str
    """`models` (architectures) or `models/optimizers` (optimizers)."""
    kind: PluginKind | None
    """The folder's kind of plug-in; None for `models/__init__.py`, the contract of both kinds."""
    name: str | None
    """The plug-in whose own file or package this is; None for a file every plug-in of `kind`
    runs (the folder's `__init__.py`, a helper `_x.py`)."""

    @property
    def root(self) -> str:
        """The plug-in's own file or package folder (`models/x.py`, `models/x`); a shared file itself."""
        depth = len(PurePosixPath(self.folder).parts) + 1
        return "/".join(PurePosixPath(self.path).parts[:depth])


def plugin_path(rel: str | Path) -> PluginPath | None:
    """Which files under models/ are plug-ins: the rule's one home (discovery, `pipeline contract`,
    the code version of a run). `rel` is a path relative to the repository:

    - `models/<name>.py`, or a `.py` file of the package `models/<name>/`: architecture `<name>`;
    - the same under `models/optimizers/`: optimizer `<name>`;
    - a name starting with `_` (the folder's `__init__.py`, a helper `_x.py` or `_x/`): shared by
      every plug-in of its folder (`models/__init__.py`: of both kinds);
    - anything else (outside models/, not a `.py` file, a name with a dot, which no import can
      name): None."""
    parts = PurePosixPath(Path(rel).as_posix().removeprefix("./")).parts
    if len(parts) < 2 or parts[0] != MODELS_DIR.name or not parts[-1].endswith(".py"):
        return None
    in_optimizers = len(parts) > 2 and parts[1] == OPTIMIZERS_PACKAGE
    folder = "/".join(parts[:2]) if in_optimizers else parts[0]
    kind: PluginKind = "optimizer" if in_optimizers else "architecture"
    stem = parts[2 if in_optimizers else 1].removesuffix(".py")
    path = "/".join(parts)
    if stem.startswith("_"):
        return PluginPath(path, folder, None if path == f"{MODELS_DIR.name}/__init__.py" else kind, None)
    return None if "." in stem else PluginPath(path, folder, kind, stem)


def plugin_paths(models_dir: Path = MODELS_DIR) -> list[PluginPath]:
    """`plugin_path` over a checkout's models/ (`models_dir`; this package's by default): the
    top-level `.py` files and packages (a folder with an `__init__.py`, named by it) of models/
    and models/optimizers/, architectures first, each folder sorted. Helper packages (`_x/`) are
    not listed (`plugin_path` still counts their files as shared)."""
    out: list[PluginPath] = []
    for folder in (models_dir, models_dir / OPTIMIZERS_PACKAGE):
        for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
            file = entry / "__init__.py" if entry.is_dir() else entry
            found = plugin_path(file.relative_to(models_dir.parent)) if file.is_file() else None
            if found is not None and (entry.is_file() or found.name is not None):
                out.append(found)
    return out


def _load(module_name: str, base: type[PluginSection], key: str, stem: str) -> type[PluginSection]:
    rel = _plugin_file(module_name)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a broken plug-in names itself (file:line), not a traceback deep in pydantic
        file, line = _where(module_name, exc)
        raise PluginError(file, f"cannot import: {type(exc).__name__}: "
                                f"{str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": "), line) from exc
    config = getattr(module, "Config", None)
    if not (isinstance(config, type) and issubclass(config, base)):
        raise PluginError(rel, f"defines no `Config` subclass of {base.__name__}")
    field = config.model_fields.get(key)
    args = getattr(field.annotation, "__args__", ()) if field is not None else ()
    if tuple(args) != (stem,):
        raise PluginError(rel, f"Config.{key} must be Literal['{stem}'] (the file's name)", _line_of(config, key))
    return config


def _line_of(config: type, name: str) -> int | None:
    """The line of `name` in the class body of `config` (None when the source is not there)."""
    import inspect

    try:
        lines, first = inspect.getsourcelines(config)
    except (OSError, TypeError):
        return None
    return next((first + i for i, text in enumerate(lines) if text.lstrip().startswith(f"{name}:")), first)


@cache
def _discover(package: str) -> tuple[dict[str, type[PluginSection]], dict[str, PluginError]]:
    """(name -> Config class, name -> why it is broken) for every plug-in file of `package`
    ("" for architectures, "optimizers"). A broken file is kept aside, so it fails only the
    experiments that select it (`validation.spec` turns it into their error)."""
    base, key = (OptimizerConfig, "name") if package else (Architecture, "model_type")
    kind = "optimizer" if package else "architecture"
    found: dict[str, type[PluginSection]] = {}
    broken: dict[str, PluginError] = {}
    for name in sorted(p.name for p in plugin_paths() if p.kind == kind and p.name is not None):
        try:
            found[name] = _load(f"models.{package + '.' if package else ''}{name}", base, key, name)
        except PluginError as exc:
            broken[name] = exc
    return found, broken


def architectures() -> dict[str, type[Architecture]]:
    """model_type -> Config class, for every architecture file under models/ that imports and
    keeps the naming rule (the others: `broken_architectures()`)."""
    return _discover("")[0]  # type: ignore[return-value]


def optimizer_configs() -> dict[str, type[OptimizerConfig]]:
    """name -> Config class, for every optimizer file under models/optimizers/ that loads."""
    return _discover(OPTIMIZERS_PACKAGE)[0]  # type: ignore[return-value]


def broken_architectures() -> dict[str, PluginError]:
    """model_type -> why models/<model_type>.py cannot be used (it does not import, ...)."""
    return _discover("")[1]


def broken_optimizers() -> dict[str, PluginError]:
    """name -> why models/optimizers/<name>.py cannot be used."""
    return _discover(OPTIMIZERS_PACKAGE)[1]


EXPORT_FILE = "export.json"
"""Written by the trainer into every exported model directory: the architecture's fields and
its `ExportNote`."""


def load_exported(directory: str | Path) -> Any:
    """The model of an exported directory (RUN/model/), whatever its architecture: the
    architecture named in export.json rebuilt from its fields, `model.safetensors` loaded
    strictly (a tied output weight is legitimately absent), in eval mode."""
    import json

    directory = Path(directory)
    info = json.loads((directory / EXPORT_FILE).read_text())
    fields = dict(info["model"])
    arch = architectures()[fields["model_type"]].model_validate(fields)
    model = arch.build()
    load_weights(model, directory, arch)
    model.eval()
    return model


def load_weights(model: Any, directory: str | Path, arch: Architecture) -> None:
    """Load `model.safetensors` of a checkpoint or export directory into `model` (strict; a
    tied output weight is legitimately absent), then re-tie it."""
    from safetensors.torch import load_file

    path = Path(directory) / "model.safetensors"
    missing, unexpected = model.load_state_dict(load_file(str(path)), strict=False)
    tied = set(arch.tied_weight_names) if arch.tie_word_embeddings else set()
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ValueError(f"{path}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if arch.tie_word_embeddings and hasattr(model, "tie_weights"):
        model.tie_weights()


__all__ = ["EXPORT_FILE", "load_exported", "load_weights", "Architecture", "ExportNote", "OptimizerConfig", "ParamRole", "PluginError", "PluginKind", "PluginPath",
           "PluginSection", "TPStyle", "architectures", "broken_architectures", "broken_optimizers", "optimizer_configs",
           "plugin_path", "plugin_paths"]
