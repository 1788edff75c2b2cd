"""The experiment spec: one frozen, typed `ExperimentSpec` per `experiments/<name>.yaml`.

Each section is its own model and documents its fields where they are declared; the
JSON Schema in `experiments/schema.json` is generated from these models
(`pipeline schema`), so editor completion and these docstrings never disagree.

Cross-field rules that need several sections (tp divides heads, layouts match the
resources, the hypothesis metric exists...) live in `validation.rules`, which returns
every problem at once with the location of the field to change.

This module must stay light: `pipeline validate` imports it and must not import torch.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
from collections.abc import Iterator
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from models import (
    Architecture,
    OptimizerConfig,
    PluginError,
    architectures,
    broken_architectures,
    broken_optimizers,
    optimizer_configs,
)
from validation.eval_tasks import TASK_METRIC_PATTERN, EvalSpec

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{2,63}$"
SOURCE_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
# Metrics the trainer produces; `<source>` is a data source name.
METRIC_PATTERN = (
    r"^(eval/(loss|bpb)|eval/[a-z0-9][a-z0-9_-]{0,31}/(loss|bpb)|train/loss|"
    r"perf/tokens_per_s|perf/mfu|perf/peak_mem_gb|" + TASK_METRIC_PATTERN + r")$"
)
EVAL_ROWS_PER_BATCH = 16
"""Held-out rows in one `train.eval_batches` unit, per source: fixed, so the eval set does not
depend on `micro_batch_size` (the trainer's evaluation and the plan's pricing read it)."""
CHAMPION = "champion"
"""The model registry alias of the promoted model; also the `hypothesis.baseline` that compares against it."""
ALPHA_LIMIT = 0.1
"""Largest `hypothesis.alpha` without an `alpha_override` (reports.render shows both)."""
PLACEHOLDER_WORDS = {"todo", "tbd", "fixme", "xxx", "placeholder", "hypothesis", "lorem", "ipsum", "n/a", "test"}


class Section(BaseModel):
    """Base for every section: frozen, unknown keys forbidden, docstrings become descriptions."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


# --------------------------------------------------------------------------- hypothesis


class Hypothesis(Section):
    """What this experiment is expected to show, stated before it runs."""

    statement: Annotated[str, Field(min_length=20, max_length=2000)]
    """A real sentence: what changes, what should happen to the metric and why."""
    metric: Annotated[str, Field(pattern=METRIC_PATTERN)]
    """A metric the trainer produces: `eval/loss`, `eval/bpb`, `eval/<source>/loss`, `eval/<source>/bpb`,
    `train/loss`, `perf/tokens_per_s`, `perf/mfu`, `perf/peak_mem_gb`, or `eval/task/<task>/<metric>`
    of a task in `eval.tasks` (e.g. `eval/task/demo_next_line/acc`)."""
    direction: Literal["increase", "decrease"]
    """Which way the metric should move relative to the baseline."""
    min_effect: Annotated[float, Field(gt=0.0, le=10.0)]
    """Smallest relative change that counts, e.g. 0.02 for 2 %."""
    baseline: Annotated[str, Field(pattern=rf"^([a-z0-9][a-z0-9_-]{{2,63}}|{CHAMPION})$")]
    """The experiment to compare against (its name), or `champion` for the promoted model."""
    seeds: Annotated[int, Field(ge=1, le=16)] = 1
    """Number of seeds; candidate and baseline run on the same seeds (paired). One seed cannot
    decide the hypothesis (the verdict needs two paired seeds, three or more to have power);
    the plan says so."""
    alpha_override: Annotated[str, Field(min_length=10, max_length=500)] | None = None
    """Why `alpha` may exceed 0.1 (ALPHA_LIMIT); shown in the PR comment next to the verdict."""
    alpha: Annotated[float, Field(gt=0.0, le=0.5)] = 0.05
    """Significance level of the one-sided paired test behind the verdict: the chance of
    calling the hypothesis supported when its effect is only min_effect. At most 0.1 unless
    `alpha_override` says why."""
    pilot: bool = False
    """A pilot is exploratory: it sizes the study and decides nothing. The confirmatory run of
    the same claim (configuration without the seed, and baseline) sets it false; the plan then
    picks seeds no run of the claim used (docs/verdicts.md, "Preregistration")."""

    @field_validator("alpha")
    @classmethod
    def _alpha_limit(cls, value: float, info: Any) -> float:
        if value > ALPHA_LIMIT and not info.data.get("alpha_override"):
            raise ValueError(f"{value:g} is above {ALPHA_LIMIT:g}: a verdict at that level is wrong too often; "
                             "lower it, or state why in hypothesis.alpha_override")
        return value

    @model_validator(mode="after")
    def _reachable_margin(self) -> Hypothesis:
        # A decrease of 100 % or more cannot happen (the verdict's margin is -log(1 - min_effect)).
        if self.direction == "decrease" and self.min_effect >= 1:
            raise ValueError(f"min_effect {self.min_effect:g} for a decrease must be below 1 "
                             "(1 would mean the metric falls to zero)")
        return self

    @field_validator("statement")
    @classmethod
    def _real_sentence(cls, value: str) -> str:
        words = [w.strip(".,;:!?()").lower() for w in value.split()]
        if len(words) < 5:
            raise ValueError("must be a real sentence of at least 5 words")
        if set(words) <= PLACEHOLDER_WORDS | {"a", "the", "is", "to", "be", "will", "here", "goes"}:
            raise ValueError("looks like a placeholder; state what should change and why")
        return value


# --------------------------------------------------------------------------- model


FOREIGN = "foreign"
"""The union tag of a plug-in this checkout does not have (see `foreign_plugins_allowed`)."""
_ALLOW_FOREIGN: contextvars.ContextVar[bool] = contextvars.ContextVar("allow_foreign_plugins", default=False)


@contextlib.contextmanager
def foreign_plugins_allowed() -> Iterator[None]:
    """Within this block an architecture or optimizer that is not a file of *this* checkout
    validates as a stand-in (its own fields unchecked). Only the trusted re-validation of a
    pull request uses it: that job runs the default branch's code and never imports the PR's
    Python, so a `model_type` the PR adds in `models/<name>.py` is unknown to it; the PR's
    own check (unprivileged, running that file) validated those fields."""
    token = _ALLOW_FOREIGN.set(True)
    try:
        yield
    finally:
        _ALLOW_FOREIGN.reset(token)


def foreign_plugins_active() -> bool:
    """Whether this is the trusted re-validation (`foreign_plugins_allowed`), which sees a PR's
    experiments/ as data and nothing else of it."""
    return _ALLOW_FOREIGN.get()


class ForeignArchitecture(Architecture):
    """A stand-in for an architecture file this checkout does not have. The common fields are
    checked; its own are kept unchecked; its counts are a generic dense-decoder estimate
    (attention 4 h^2 and an MLP 8 h^2 per layer, untied embedding and head): what the trusted
    job needs for a budget tier, labelled as such."""

    model_config = ConfigDict(extra="allow", frozen=True)
    model_type: str

    def block_parameters(self) -> int:
        return self.num_layers * 12 * self.hidden_size * self.hidden_size

    def parameter_count(self) -> int:
        return 2 * self.vocab_size * self.hidden_size + self.block_parameters()

    def matmul_parameters(self) -> int:
        return self.vocab_size * self.hidden_size + self.block_parameters()

    def activation_bytes_per_layer(self, seq_len: int, micro_batch: int, element_bytes: float) -> float:
        return 34 * seq_len * micro_batch * self.hidden_size * element_bytes // 2  # Korthikanti, per element


class ForeignOptimizer(OptimizerConfig):
    """A stand-in for an optimizer file this checkout does not have (AdamW's 8 bytes of state)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str

    def state_bytes_per_parameter(self, role: Any, shape: tuple[int, ...] | None = None) -> float:
        return 8.0


PLUGIN_BROKEN = "plugin_broken"
"""The pydantic error type of a `model_type` / optimizer `name` whose file does not load
(`validation.error_locations` reports it at that file's line)."""


def _broken_member(error: PluginError) -> Any:
    """A union member that fails with the plug-in's own error: only the experiments that select
    a broken file fail, the others validate."""

    def fail(value: Any) -> Any:
        raise PydanticCustomError(PLUGIN_BROKEN, "{error}", {"error": str(error)})

    return Annotated[Any, BeforeValidator(fail)]


def _union(classes: dict[str, type[BaseModel]], key: str, foreign: type[BaseModel],
           broken: dict[str, PluginError] | None = None) -> Any:
    """A union of plug-in config classes selected by `key`; a name that is not a file here is
    an error, except inside `foreign_plugins_allowed()` (then the stand-in `foreign`); a name
    whose file is broken fails with that file's error."""
    broken = broken or {}

    def select(value: Any) -> str | None:
        name = value.get(key) if isinstance(value, dict) else getattr(value, key, None)
        if isinstance(value, foreign):
            return FOREIGN
        if isinstance(name, str) and name not in classes and name not in broken and _ALLOW_FOREIGN.get():
            return FOREIGN
        return name if isinstance(name, str) else None

    members = [Annotated[c, Tag(name)] for name, c in classes.items()] + [Annotated[foreign, Tag(FOREIGN)]]
    members += [Annotated[_broken_member(error), Tag(name)] for name, error in broken.items()]
    return Annotated[Union[tuple(members)], Discriminator(select)]  # noqa: UP007 - built at run time


ARCHITECTURES: dict[str, type[Architecture]] = architectures()
"""model_type -> config class, one per file under models/ (`models.architectures`)."""
OPTIMIZERS: dict[str, type[OptimizerConfig]] = optimizer_configs()
"""optimizer name -> config class, one per file under models/optimizers/."""

ModelSpec = Architecture
"""The type every `spec.model` has: an architecture's `Config` (see models/__init__.py)."""
BROKEN_ARCHITECTURES: dict[str, PluginError] = broken_architectures()
"""model_type -> why its file under models/ does not load (fails only the experiments selecting it)."""
BROKEN_OPTIMIZERS: dict[str, PluginError] = broken_optimizers()
"""optimizer name -> why its file under models/optimizers/ does not load."""
ModelUnion: Any = _union(ARCHITECTURES, "model_type", ForeignArchitecture, BROKEN_ARCHITECTURES)  # type: ignore[arg-type]
OptimizerUnion: Any = _union(OPTIMIZERS, "name", ForeignOptimizer, BROKEN_OPTIMIZERS)  # type: ignore[arg-type]


def model_spec(data: dict[str, Any]) -> Architecture:
    """Validate a `model` section on its own (tests, tools)."""
    spec: Architecture = TypeAdapter(ModelUnion).validate_python(data)
    return spec


# --------------------------------------------------------------------------- data


class DataSource(Section):
    """One source of documents, sampled by its mixture weight."""

    name: Annotated[str, Field(pattern=SOURCE_NAME_PATTERN)]
    """Short name used in metrics (`eval/<name>/loss`) and reports."""
    path: Annotated[str, Field(min_length=1, max_length=512)]
    """Glob relative to the repository (e.g. `data/demo/code.jsonl`); must stay inside a data root."""
    format: Literal["auto", "jsonl", "text", "parquet"] = "auto"
    """File format; `auto` picks by extension (`.jsonl`/`.json`, `.parquet`, anything else is text)."""
    text_field: Annotated[str, Field(min_length=1, max_length=64)] = "text"
    """Field holding the document text in JSON Lines and Parquet files."""
    weight: Annotated[float, Field(ge=0.0, le=1.0)]
    """Share of training rows drawn from this source; weights sum to 1."""


class TokenizerSpec(Section):
    """How text becomes tokens; part of the data version."""

    kind: Literal["bpe", "local"] = "bpe"
    """`bpe`: train a byte-level BPE on the prepared text; `local`: load from `path`."""
    vocab_size: Annotated[int, Field(ge=256, le=1048576)] = 4096
    """Vocabulary size of the trained BPE (must not exceed `model.vocab_size`)."""
    path: Annotated[str, Field(max_length=512)] | None = None
    """Directory with a `tokenizer.json` when `kind: local`; inside a data root."""


class DataChecks(Section):
    """Thresholds for the great-expectations checks; defaults are deliberately lenient."""

    min_documents: Annotated[int, Field(ge=1, le=10**12)] = 50
    """Minimum documents per source after cleaning and de-duplication."""
    min_tokens: Annotated[int, Field(ge=1, le=10**15)] = 10_000
    """Minimum tokens per source."""
    max_empty_rate: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    """Maximum share of documents dropped as empty or too short."""
    max_duplicate_rate: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    """Maximum share of exact duplicates."""
    max_doc_tokens_p50: Annotated[int, Field(ge=1, le=10**9)] = 1_000_000
    """Upper bound on the median document length in tokens."""
    max_js_divergence: Annotated[float, Field(ge=0.0, le=1.0)] = 0.08
    """Maximum Jensen-Shannon divergence (base 2) of a source's token distribution vs the baseline's."""
    max_length_shift: Annotated[float, Field(ge=0.0, le=100.0)] = 0.5
    """Maximum relative shift of a source's median document length vs the baseline's."""
    max_mixture_error: Annotated[float, Field(ge=0.0, le=1.0)] = 0.05
    """Maximum absolute difference between realised and requested mixture weight."""


class DataSpec(Section):
    """Sources, their mixture, tokenization and packing."""

    sources: Annotated[list[DataSource], Field(min_length=1, max_length=64)]
    """Document sources with mixture weights."""
    seq_len: Annotated[int, Field(ge=16, le=1048576)] = 256
    """Tokens per packed training row (documents are concatenated, boundaries kept)."""
    tokenizer: TokenizerSpec = TokenizerSpec()
    """Tokenizer to train or load."""
    min_doc_chars: Annotated[int, Field(ge=0, le=100000)] = 16
    """Documents shorter than this after cleaning are dropped (and counted)."""
    eval_fraction: Annotated[float, Field(gt=0.0, le=0.5)] = 0.05
    """Share of each source's documents held out for evaluation (chosen by document hash)."""
    checks: DataChecks = DataChecks()
    """Distribution-check thresholds."""
    task_bytes: Annotated[int, Field(ge=1024, le=1 << 40)] = 64 << 20
    """Input bytes per preparation task (a file, or a byte range of a JSON Lines file). Tasks are
    decided by the input and this alone, never by the number of workers; each writes its own token
    shards, so it is part of the data version."""
    near_dedup: bool = False
    """Also drop near duplicates: MinHash LSH over word 5-grams (16 bands of 8 rows, so pairs with a
    Jaccard similarity above about 0.7 are found), across all shards; the first in file order stays."""

    @model_validator(mode="after")
    def _unique_sources(self) -> DataSpec:
        names = [s.name for s in self.sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"source names must be unique; repeated: {', '.join(dupes)}")
        return self

    def weights(self) -> dict[str, float]:
        return {s.name: s.weight for s in self.sources}


# --------------------------------------------------------------------------- train


class TrainSpec(Section):
    """Optimisation, precision, checkpoints and evaluation."""

    lr: Annotated[float, Field(gt=0.0, le=1.0)] = 3e-3
    """Peak learning rate (of the AdamW groups under `optimizer: {name: muon}`)."""
    min_lr_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1
    """Final learning rate as a fraction of `lr` (cosine and linear schedules)."""
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """Decay after warmup."""
    warmup_steps: Annotated[int, Field(ge=0, le=10**7)] = 20
    """Linear warmup steps."""
    max_steps: Annotated[int, Field(ge=1, le=10**7)] | None = None
    """Optimizer steps; give this or `token_budget`."""
    token_budget: Annotated[int, Field(ge=1, le=10**14)] | None = None
    """Training tokens; converted to steps with the global batch."""
    micro_batch_size: Annotated[int, Field(ge=1, le=4096)] = 8
    """Rows per forward pass per process."""
    grad_accum_steps: Annotated[int, Field(ge=1, le=4096)] = 1
    """Micro-batches accumulated per optimizer step."""
    global_batch_size: Annotated[int, Field(ge=1, le=10**6)] | None = None
    """Rows per optimizer step; when given it must equal micro_batch_size x grad_accum_steps x dp."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Compute precision through accelerate (bf16 also works on CPUs with avx512_bf16)."""
    weight_decay: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1
    """Decoupled weight decay on matrices (norm weights and biases excluded)."""
    optimizer: OptimizerUnion = OPTIMIZERS["adamw"]()  # type: ignore[call-arg]  # its Literal name has a default
    """The optimizer and its own fields, selected by `name` (a file under models/optimizers/):
    `adamw` (default), `muon` (hidden matrices; AdamW on the rest), `adafactor`, `sgd`."""
    grad_clip: Annotated[float, Field(ge=0.0, le=1000.0)] = 1.0
    """Global gradient-norm clip (0 disables)."""
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 1234
    """Base seed; with `hypothesis.seeds: n` the runs use seed, seed+1, ..."""
    deterministic: bool = True
    """Deterministic algorithms and seeded RNGs on every rank (bitwise-exact resume on CPU)."""
    compile: bool = False
    """`torch.compile` (inductor) each decoder block, in every layout (one process, DDP, FSDP, TP: after TP and activation checkpointing, before FSDP, torchtitan's order); the first step compiles (about a minute on a CPU, which needs a C++ compiler). Effect: `bench/bench_compile.py`, `bench/bench_trainer.py --compile`."""
    activation_checkpointing: Literal["none", "selective", "full"] = "none"
    """Recompute decoder blocks' activations in the backward pass (same numbers, less memory, more compute): `full` every block (about one more forward), `selective` every 2nd block (torchtitan's layer-level selective checkpointing), `none`. `true`/`false` mean `full`/`none`."""
    log_interval: Annotated[int, Field(ge=1, le=10**6)] = 10
    """Steps between metric logs."""
    eval_interval: Annotated[int, Field(ge=1, le=10**7)] = 100
    """Steps between evaluations on the held-out split."""
    eval_batches: Annotated[int, Field(ge=1, le=10**5)] = 8
    """Units of 16 held-out rows per source per evaluation (a fixed eval set, independent of micro_batch_size)."""
    checkpoint_interval: Annotated[int, Field(ge=1, le=10**7)] = 100
    """Steps between checkpoints."""
    keep_last: Annotated[int, Field(ge=1, le=1000)] = 2
    """Checkpoints kept besides the best one."""
    async_checkpoint: bool = False
    """Snapshot to memory and write checkpoints in the background."""
    early_stopping_patience: Annotated[int, Field(ge=0, le=10**5)] = 0
    """Evaluations without improvement before stopping (0 disables)."""
    min_micro_batch_size: Annotated[int, Field(ge=1, le=4096)] = 1
    """Floor for the out-of-memory fallback that halves the micro batch."""
    max_restarts: Annotated[int, Field(ge=0, le=100)] = 3
    """Automatic resumes after a crash before the run is failed."""

    @field_validator("activation_checkpointing", mode="before")
    @classmethod
    def _checkpointing_from_bool(cls, value: Any) -> Any:
        """The boolean of earlier specs: `true` is `full`, `false` is `none`."""
        if isinstance(value, bool):
            return "full" if value else "none"
        return value

    @model_validator(mode="after")
    def _steps_or_budget(self) -> TrainSpec:
        if (self.max_steps is None) == (self.token_budget is None):
            raise ValueError("give exactly one of max_steps or token_budget")
        if self.min_micro_batch_size > self.micro_batch_size:
            raise ValueError("min_micro_batch_size must not exceed micro_batch_size")
        return self


# --------------------------------------------------------------------------- parallel


class ParallelLayout(Section):
    """An explicit parallel layout; dp x tp x pp must equal the number of processes."""

    dp: Annotated[int, Field(ge=1, le=65536)] = 1
    """Data-parallel replicas."""
    tp: Annotated[int, Field(ge=1, le=512)] = 1
    """Tensor-parallel degree; must divide the attention heads."""
    pp: Annotated[int, Field(ge=1, le=512)] = 1
    """Pipeline-parallel stages; must divide the layers (or give `pp_split`)."""
    pp_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = "1f1b"
    """Pipeline schedule; micro-batches are `train.grad_accum_steps` (interleaved: two stages per rank)."""
    pp_split: list[Annotated[int, Field(ge=1)]] | None = None
    """Layers of each stage, first to last (an uneven split); sums to the layers, one entry per stage."""
    fsdp: bool = False
    """Shard parameters, gradients and optimizer states across the data-parallel group (ZeRO-3)."""
    reduce_dtype: Literal["fp32", "compute"] = "fp32"
    """Sharded layouts with bf16/fp16 `train.precision`: reduce gradients in fp32, or in the compute dtype."""


# --------------------------------------------------------------------------- resources


GPU_MEMORY_GIB: dict[str, float] = {
    "h100": 79.0,
    "h200": 139.5,
    "b200": 178.0,
    "a100": 39.5,  # the 40 GB model; the 80 GB one: set resource.gpu_memory_gb: 79
    "l40s": 44.0,
    "l4": 22.0,
    "a10g": 21.5,
    "v100": 15.5,  # the 16 GB model; the 32 GB one: set resource.gpu_memory_gb: 31.5
    "t4": 14.5,
}
"""`resource.gpu_memory_gb` when a spec with GPUs does not give it, by `gpu_type`: the memory CUDA
reports as the device's total (`torch.cuda.get_device_properties(i).total_memory`, e.g. 139.8 GiB
for an H200, 79.1 GiB for an 80 GB H100), rounded down to 0.5 GiB; the smaller model where a type
comes in two sizes. A type not listed is refused without an explicit `gpu_memory_gb`."""
CPU_PROCESS_MEMORY_GIB = 16.0
"""`resource.gpu_memory_gb` per CPU process (`gpus_per_node: 0`) when not given."""


class ResourceSpec(Section):
    """Where and how the run executes, and what it may cost."""

    nodes: Annotated[int, Field(ge=1, le=4096)] = 1
    """Machines."""
    gpus_per_node: Annotated[int, Field(ge=0, le=64)] = 0
    """Accelerators per machine; 0 trains on CPU processes."""
    cpu_processes: Annotated[int, Field(ge=1, le=256)] = 1
    """Processes per node when `gpus_per_node` is 0 (gloo)."""
    gpu_type: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$")] = "cpu"
    """Accelerator type; also a self-hosted runner label (e.g. `h100`)."""
    gpu_memory_gb: Annotated[float, Field(gt=0.0, le=4096.0)] = CPU_PROCESS_MEMORY_GIB
    """Memory per accelerator (per process on CPU), GiB, used by the memory check; when not given: by
    `gpu_type` (h100 79, h200 139.5, b200 178, a100 39.5, l40s 44, l4 22, a10g 21.5, v100 15.5, t4 14.5;
    another type must give it), 16 per CPU process."""
    peak_tflops: Annotated[float, Field(gt=0.0, le=100000.0)] | None = None
    """Dense peak per device for MFU and time estimates; defaults by `gpu_type`."""
    assumed_mfu: Annotated[float, Field(gt=0.0, le=1.0)] = 0.35
    """Model FLOPs utilisation assumed by the GPU-hours estimate."""
    launcher: Literal["local", "slurm", "static"] = "local"
    """`local`: accelerate on this host; `slurm`: sbatch + srun; `static`: fixed rendezvous endpoint."""
    partition: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] | None = None
    """Slurm partition (the cluster's default when omitted)."""
    rendezvous: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,253}:[0-9]{1,5}$")] | None = None
    """`host:port` of node 0 for the static launcher."""
    time_limit_minutes: Annotated[int, Field(ge=1, le=60 * 24 * 30)] = 60
    """Wall-clock limit of the training job."""
    max_gpu_hours: Annotated[float, Field(gt=0.0, le=1_000_000.0)] = 8.0
    """Budget; a plan estimated above it is refused."""

    @model_validator(mode="before")
    @classmethod
    def _memory_from_gpu_type(cls, data: Any) -> Any:
        """Fill `gpu_memory_gb` from `GPU_MEMORY_GIB` when a spec with GPUs leaves it out."""
        if not isinstance(data, dict) or "gpu_memory_gb" in data:
            return data
        gpus, gpu_type = data.get("gpus_per_node", 0), data.get("gpu_type", "cpu")
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus <= 0 or not isinstance(gpu_type, str) \
                or gpu_type == "cpu":
            return data  # CPU processes (or a field that fails its own check): the default
        if gpu_type not in GPU_MEMORY_GIB:
            raise PydanticCustomError(
                "gpu_memory_unknown", "gpu_memory_gb is not given and gpu_type '{gpu_type}' has no known memory size "
                "(known: {known}): set resource.gpu_memory_gb (GiB per device)",
                {"gpu_type": gpu_type, "known": ", ".join(sorted(GPU_MEMORY_GIB))})
        return {**data, "gpu_memory_gb": GPU_MEMORY_GIB[gpu_type]}

    @property
    def world_size(self) -> int:
        per_node = self.gpus_per_node if self.gpus_per_node else self.cpu_processes
        return self.nodes * per_node


# --------------------------------------------------------------------------- alerts


class AlertsSpec(Section):
    """Anomaly thresholds; the defaults suit most runs."""

    loss_rise_steps: Annotated[int, Field(ge=1, le=10**6)] = 50
    """Alert (P1) when the smoothed loss rises for this many consecutive steps."""
    grad_norm_factor: Annotated[float, Field(gt=1.0, le=1e6)] = 10.0
    """Alert (P1) when the grad norm exceeds this multiple of its running mean."""
    throughput_drop: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.5
    """Alert (P2) when tokens/s falls below this fraction of its running median."""
    stall_seconds: Annotated[int, Field(ge=10, le=10**6)] = 900
    """Alert (P0) when no step completes for this long."""
    spike_policy: Literal["alert", "stop", "rollback"] = "alert"
    """On a loss or grad-norm spike: only alert, stop the run, or restore the last good checkpoint."""
    rollback_skip_batches: Annotated[int, Field(ge=0, le=10**6)] = 10
    """Batches skipped after a rollback (the PaLM recipe)."""
    max_rollbacks: Annotated[int, Field(ge=0, le=100)] = 3
    """Rollbacks before the run is stopped."""


# --------------------------------------------------------------------------- sweep


class SweepSpec(Section):
    """A small search over a few fields; the winner becomes the candidate."""

    method: Literal["grid", "random"] = "grid"
    """Grid takes every combination; random samples `max_trials` of them."""
    parameters: Annotated[dict[str, Annotated[list[Any], Field(min_length=1, max_length=16)]], Field(min_length=1, max_length=4)]
    """Dotted field path (e.g. `train.lr`) to the values to try."""
    max_trials: Annotated[int, Field(ge=1, le=32)] = 8
    """Upper bound on trials."""
    metric: Annotated[str, Field(pattern=METRIC_PATTERN)] | None = None
    """Selection metric (defaults to the hypothesis metric)."""
    mode: Literal["min", "max"] | None = None
    """Lower or higher is better (defaults from the hypothesis direction); ties go to the cheaper trial."""
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    """Seed of the random sampler."""
    parallel: Annotated[int, Field(ge=1, le=32)] = 1
    """Trials trained at once, each its own job on the experiment's launcher."""
    selection_seeds: Annotated[int, Field(ge=1, le=4)] = 1
    """Seeds each trial trains on to pick the winner. They are never hypothesis seeds: the winner
    is trained again on `hypothesis.seeds` fresh seeds and judged on those only."""
    prune: bool = True
    """Stop trials early by successive halving (Optuna) on the selection metric at each eval."""
    reduction_factor: Annotated[int, Field(ge=2, le=8)] = 2
    """Successive halving keeps about 1 / reduction_factor of the trials at each rung."""

    @field_validator("parameters")
    @classmethod
    def _known_paths(cls, value: dict[str, list[Any]]) -> dict[str, list[Any]]:
        allowed_sections = {"train", "model", "data"}
        for path in value:
            head = path.split(".", 1)[0]
            if head not in allowed_sections or "." not in path:
                raise ValueError(f"sweep parameter '{path}' must be a dotted path under train, model or data")
        return value


# --------------------------------------------------------------------------- top level


class ExperimentSpec(Section):
    """One experiment: a hypothesis and everything needed to test it."""

    schema_ref: Annotated[str | None, Field(alias="$schema", max_length=256)] = None
    """Path or URL of `schema.json` for editor completion; ignored by the pipeline."""
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    """Experiment name; must equal the file name without `.yaml`."""
    owner: Annotated[str, Field(pattern=r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})$")]
    """GitHub login of the person responsible."""
    extends: Annotated[str, Field(max_length=256)] | None = None
    """A base file (relative to this one) deep-merged under this one; chains allowed up to depth 5."""
    description: Annotated[str, Field(max_length=4000)] = ""
    """Free text for the PR comment."""
    hypothesis: Hypothesis
    """The claim this experiment tests."""
    model: ModelUnion
    """The network: `model_type` names a file under models/ whose fields follow."""
    data: DataSpec
    """The data mixture."""
    train: TrainSpec
    """Optimisation."""
    parallel: Literal["auto"] | ParallelLayout = "auto"
    """`auto` (the planner picks from model size and memory) or an explicit layout."""
    resource: ResourceSpec = ResourceSpec()
    """Execution resources and budget."""
    alerts: AlertsSpec = AlertsSpec()
    """Anomaly thresholds."""
    sweep: SweepSpec | None = None
    """Optional search over a few fields."""
    eval: EvalSpec | None = None
    """Downstream lm-evaluation-harness tasks scored on the final model (validation/eval_tasks.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, populate_by_name=True)

    # Fields that do not change what is trained (excluded from the spec hash).
    COSMETIC_FIELDS: ClassVar[tuple[str, ...]] = ("schema_ref", "description", "owner", "extends", "name")

    def resolved_dict(self) -> dict[str, Any]:
        """The resolved spec as plain JSON data (what the trainer reads)."""
        return self.model_dump(mode="json", by_alias=False, exclude={"schema_ref"})

    def training_dict(self) -> dict[str, Any]:
        """What determines the trained model: no cosmetic fields, no hypothesis text."""
        data = self.model_dump(mode="json", exclude=set(self.COSMETIC_FIELDS))
        data.pop("hypothesis", None)
        if data.get("sweep") is None:
            # A sweep spec keeps its `sweep` section: what it trains is the search, so it never
            # hashes like its baseline (its trials and the confirmed winner have none and hash
            # as the plain configurations they are).
            data.pop("sweep", None)
        if data.get("eval") is None:
            data.pop("eval", None)  # no tasks: the same identity as before `eval` existed
        data.get("train", {}).pop("max_restarts", None)
        train = data.get("train", {})
        if train.get("activation_checkpointing") in ("none", "full"):
            # Hash as the boolean these two were before `selective` existed (same identity).
            train["activation_checkpointing"] = train["activation_checkpointing"] == "full"
        return data

    def spec_hash(self) -> str:
        """sha256 (first 16 hex) of the canonical JSON of `training_dict()`."""
        canonical = json.dumps(self.training_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def global_batch(self, dp: int) -> int:
        return self.train.micro_batch_size * self.train.grad_accum_steps * dp

    def total_steps(self, dp: int) -> int:
        if self.train.max_steps is not None:
            return self.train.max_steps
        assert self.train.token_budget is not None
        per_step = self.global_batch(dp) * self.data.seq_len
        return max(1, -(-self.train.token_budget // per_step))

    def parallel_layout(self) -> ParallelLayout:
        """The explicit layout, or plain data parallelism over every process for `auto`."""
        if isinstance(self.parallel, ParallelLayout):
            return self.parallel
        return ParallelLayout(dp=self.resource.world_size)
