"""Memory: bytes one device holds at the peak of a training step, by category.

Counted as the trainer runs it (trainer/parallel.py, trainer/activation_checkpointing.py):

- parameter states: fp32 weights, fp32 gradients and the optimizer's state per parameter role
  (the optimizer file's `state_bytes_per_parameter(role, shape)` weighted by the model's own
  `parameters_by_role()`). Under bf16/fp16 neither accelerate's autocast nor FSDP2's
  `MixedPrecisionPolicy` keeps a 16-bit master split: the fp32 weights are the master copy;
- the compute-precision copies: autocast's cached 16-bit copy of every matmul weight (plain
  and DDP), or FSDP2's unsharded 16-bit group, its 16-bit unsharded gradients and the fp32
  reduce-scatter input (`reduce_dtype: fp32`);
- activations per `train.activation_checkpointing` (`none | selective | full`);
- the logits of the loss, and framework overhead.

`MemoryEstimate.by_category()` gives the same bytes in the categories a memory tracker
reports (`CATEGORIES`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from validation.plan.common import GIB, MIB
from validation.rules import virtual_stages_per_rank
from validation.spec import ExperimentSpec, ParallelLayout


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter kept between steps (ZeRO paper, Rajbhandari et al. 2020, §3.1), as
    the trainer keeps them: fp32 weights and gradients in every precision (see the module doc)."""

    weights: int
    """The fp32 weights (under bf16/fp16 they are also the master copy)."""
    gradients: int
    """One fp32 gradient per weight (autocast and FSDP2's fp32 reduction both leave them fp32)."""
    optimizer: float
    """The optimizer's own state (its file under models/optimizers/ declares it per parameter
    role; AdamW: first and second moments, fp32). A mean over the model's parameters when it
    differs by role (Muon, Adafactor)."""
    optimizer_name: str = "adamw"

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


STATE_BYTES: dict[str, StateBytes] = {
    # AdamW in every precision: 4 (fp32 weights, their own master copy) + 4 (fp32 grads) + 8 (m, v).
    # (Counting bf16 as 2 + 2 + 12 put 2 B/param in the weights and gradients that the trainer
    # keeps in fp32, so DDP's fp32 gradient buckets were counted at half their size.)
    "bf16": StateBytes(weights=4, gradients=4, optimizer=8),
    "fp16": StateBytes(weights=4, gradients=4, optimizer=8),
    "fp32": StateBytes(weights=4, gradients=4, optimizer=8),
}

# Bytes of one element of the compute precision: autocast's weight copies, FSDP2's unsharded
# parameters and gradients (`MixedPrecisionPolicy(param_dtype=...)`). 0: no copy (fp32).
COMPUTE_COPY_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 0}
# fp32 reduce-scatter input FSDP2 builds from the 16-bit unsharded gradients when
# `parallel.reduce_dtype: fp32` (the default) under bf16/fp16.
FP32_REDUCE_BYTES = 4

# Bytes of one saved activation element: the architectures declare their saved tensors in
# elements (models/<model_type>.py, `activation_bytes_per_layer`). Under bf16/fp16 autocast
# (plain, DDP) only the matmul outputs are 16-bit: the residual stream, the norms' upcasts and
# softmax statistics stay fp32. Measured per block over the shipped architectures
# (bench/bench_architectures.py): 0.59-0.75 of the fp32 bytes, i.e. 2.4-3.0 bytes per element;
# the full-scale dry run (bench/bench_plan_calibration.py, per block from the none/selective
# difference) 2.23 (GPT-2 small) and 2.94 (Qwen2-0.5B) under DDP: 2.6 is the middle.
ACTIVATION_ELEMENT_BYTES: dict[str, float] = {"bf16": 2.6, "fp16": 2.6, "fp32": 4}
# Under FSDP2's cast (`MixedPrecisionPolicy(param_dtype=bf16)`) the residual stream and the
# norms' outputs are 16-bit too: the dry run measured 2.09 (GPT-2 small) and 2.48 (Llama-3-8B)
# bytes per element per block; 2.25 keeps both architectures' totals within 10 % (GPT-2 XL
# without checkpointing, 48 blocks, is the bound). 2.75 for every layout put Llama-3-8B's blocks
# 11 % high, GPT-2's 30 %. (One figure per architecture would belong in its models/ file.)
ACTIVATION_ELEMENT_BYTES_FSDP_CAST: dict[str, float] = {"bf16": 2.25, "fp16": 2.25, "fp32": 4}


class ElementBytes(float):
    """What `activation_bytes_per_layer(seq_len, micro_batch, element_bytes)` receives: a float, the
    bytes of one saved element (`ACTIVATION_ELEMENT_BYTES` or `..._FSDP_CAST`), that also says which
    of the two 16-bit regimes it is for: `fsdp_cast` is True when FSDP2 casts the parameters to the
    compute dtype (the residual stream and everything computed from it are 16-bit, a transformers
    mask too, so nothing upcasts a score to fp32), False under autocast (plain, DDP: the residual
    stream and the embeddings stay fp32) and in fp32. A plug-in that treats it as a plain float
    keeps working; one whose tensors differ by regime reads `getattr(element_bytes, "fsdp_cast",
    False)` (models/gpt2.py: eager scores are 2 B under the cast, 6 B under autocast)."""

    fsdp_cast: bool

    def __new__(cls, value: float, fsdp_cast: bool = False) -> ElementBytes:
        out = super().__new__(cls, value)
        out.fsdp_cast = fsdp_cast
        return out


# Saved tensors outside the blocks (the embedding output, the final norm's input and fp32
# internals, the head's input), in bytes per token x hidden: 12 measured on Llama-3-8B (FSDP)
# and 13 on GPT-2 small (DDP, autocast's head copy included).
NON_BLOCK_ACTIVATION_BYTES = 12

# The attention score matrix (softmax, its dropout mask and output) is saved only under
# `attn_implementation: eager`: fused SDPA kernels (flash / memory-efficient) keep a log-sum-exp
# and recompute the scores in the backward pass. The architecture's own
# `activation_bytes_per_layer` counts them (6 B per score in 16-bit, 4 B in fp32).
# Packed documents reach every block as an O(s) description (models/_attention.py): no block
# keeps an s x s mask of its own. Where the kernel still takes a dense mask (micro batch x s^2
# elements in the compute dtype) there is one at a time: a GPU in fp32 (memory-efficient
# attention; flash, which runs bf16/fp16 on a GPU, takes the documents as variable-length
# sequences and builds none) builds it inside each attention call and frees it, counted in the
# backward pass's activations (a block's backward rebuilds it); CPU processes build it once per
# forward and every block and backward reads that one, counted with the saved activations. The
# dry run's fake kernel builds none (it simulates the GPU's flash path): its tracker sees neither.
DENSE_MASK_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}

# The loss upcasts the [s, b, vocab] logits to fp32 and keeps the fp32 log-softmax for the
# backward pass (4 bytes per logit, a saved activation: `LOGIT_SAVED_BYTES_PER_ELEMENT`); its
# backward then holds the log-softmax's gradient and the logits' gradient, both fp32 (8 bytes per
# logit, temporaries: `LOGIT_BYTES_PER_ELEMENT`). The peak of a step without checkpointing is
# there, at the start of the backward pass, with every block's activations still saved. Measured
# by the dry run: the tracker's temporaries are exactly 8 B/logit at that peak, and its
# activations hold the 4 B/logit log-softmax on top of the blocks' (the 8 B/logit the plan
# counted before were the temporaries alone). Not in Korthikanti's per-layer formula, but it
# dominates for small models with large vocabularies.
LOGIT_BYTES_PER_ELEMENT = 8
LOGIT_SAVED_BYTES_PER_ELEMENT = 4

# What the data-parallel wrapper holds besides the states above (checked against measured
# per-rank memory by bench/bench_parallel_memory.py, tests/unit/test_preflight_memory.py):
# - DDP copies every fp32 gradient into its own communication buckets (gradient_as_bucket_view
#   is off, as accelerate leaves it): one more gradient per parameter at the peak.
# - FSDP gathers one group at a time: the group being computed in full (its parameters in the
#   compute dtype, and its unsharded gradients before the reduce-scatter, plus their fp32 copy
#   under `reduce_dtype: fp32`) plus the next layer prefetched. The largest group is usually the
#   embedding or the LM head (their own groups), vocab x hidden.
# - FSDP over several nodes without tp runs hybrid (HSDP, trainer/parallel.py `Topology`):
#   states are sharded over the ranks of one node and replicated across nodes.
DDP_GRADIENT_BUCKET_COPIES = 1
FSDP_PREFETCHED_LAYERS = 1

# Tensor parallelism as the trainer executes it (trainer/parallel.py: Megatron column/row-wise
# linears in the decoder layers only, no sequence parallelism, logits gathered on every rank):
# the embedding and LM head are not split over tp (FSDP still shards them over dp); of the 34
# bytes per s*b*h of Korthikanti et al. 2022 (§4.1, 16-bit), 10 stay replicated (norm inputs,
# residuals, dropout masks) and 24 are split over tp (paper, Table 2, "tensor parallel" row);
# the logits are not split.
# Measured: bench/bench_parallel_memory.py, FSDP+TP 1x2 (the old sequence-parallel assumption
# was 0.66 of the measured peak).
# The replicated part in bytes per s*b*h, as the trainer runs it: in 16-bit the dry run measured
# 18 B on Llama-3-8B at tp 8 (the norms keep their fp32 upcasts: Korthikanti's 10 bytes of
# 16-bit, 5 elements x 2.35 B, put its blocks 12 % low without checkpointing); in fp32 28 B
# (7 elements) on Llama-2-7B and Mistral-7B at tp 8 (the CPU bench's 5 elements, measured at tp 2
# where the split part dominates, put those rows 11-12 % low).
ACTIVATION_UNSPLIT_BYTES_BY_TP: dict[str, int] = {"bf16": 18, "fp16": 18, "fp32": 28}


# Activation checkpointing (`train.activation_checkpointing`, executed by
# trainer/activation_checkpointing.py). A checkpointed block keeps only its input (one
# residual-stream tensor, s x b x hidden) until the backward pass recomputes it; the peak then
# adds one block's full activations (the block being recomputed). `selective` checkpoints every
# `SELECTIVE_EVERY`-th block (torchtitan's layer-level selective checkpointing).
ActivationCheckpointing = Literal["none", "selective", "full"]
SELECTIVE_EVERY = 2
# Bytes of one residual-stream element (a checkpointed block's input): fp32 under autocast
# (plain, DDP) and in fp32 runs; the compute dtype when FSDP2 casts the parameters (sharded).
RESIDUAL_BYTES_AUTOCAST = 4


def checkpointed_blocks(num_blocks: int, mode: str) -> list[int]:
    """Indices of the blocks `mode` recomputes: all (`full`), every 2nd (`selective`), none."""
    if mode == "full":
        return list(range(num_blocks))
    if mode == "selective":
        return [i for i in range(num_blocks) if (i + 1) % SELECTIVE_EVERY == 0]
    return []


# What a device holds besides the tensors torch allocates, per device: the plan's overhead, and
# what the dry run (trainer/dry_run.py) adds for what its memory tracker cannot see. One home,
# so that a plan and its dry run refuse the same layouts.
CUDA_CONTEXT_BYTES = 512 * MIB
"""CUDA context and library handles: ~500 MiB on an H100 (nvidia-smi with an empty torch process)."""
NCCL_BUFFER_BYTES = 512 * MIB
"""NCCL's communicator buffers (NCCL_BUFFSIZE 4 MiB x channels x peers, per process group); only with world > 1."""
KERNEL_WORKSPACE_BYTES = 256 * MIB
"""cuBLAS workspaces (32 MiB per stream and handle on Hopper) and attention kernels' scratch."""
ALLOCATOR_FRAGMENTATION = 0.05
"""Caching allocator's reserve over the allocated peak (expandable segments; 10-15 % without)."""
CPU_PROCESS_BYTES = GIB // 2
"""A CPU process: interpreter, torch and gloo (replaces the GPU constants when gpus_per_node is 0)."""

FRAMEWORK_OVERHEAD_BYTES_GPU = CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES + KERNEL_WORKSPACE_BYTES
"""The plan's overhead per GPU (1.25 GiB), plus `ALLOCATOR_FRAGMENTATION` of its peak. NCCL's
buffers are counted whatever the world size (the dry run counts them with world > 1 only)."""
FRAMEWORK_OVERHEAD_BYTES_CPU = CPU_PROCESS_BYTES
"""The plan's overhead per CPU process."""

# Below this free share a layout "fits" but a warning says fragmentation may still OOM.
LOW_HEADROOM_PCT = 10.0


CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "logits_temporaries", "overhead")
"""The keys of `MemoryEstimate.by_category()`, in the order a memory tracker lists them; the dry
run splits its tracked peak into the same ones (trainer/dry_run.py, `CATEGORY_OF`)."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device holds at the peak of a training step, vs its capacity."""

    parameters_per_device: int
    """Parameters whose states this device keeps (after tp/pp split and FSDP sharding)."""
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    """The saved tensors at the end of the forward pass: the blocks' per layer / tp, times layers
    per stage (checkpointed blocks keep their input only), times micro-batches in flight, and
    those outside the blocks (`NON_BLOCK_ACTIVATION_BYTES`)."""
    logits_bytes: int
    overhead_bytes: int
    capacity_bytes: int
    state_bytes: StateBytes
    """Bytes per parameter behind weights/gradients/optimizer."""
    sharding_degree: int
    """How many ways the parameter states are split on this device (tp x pp x FSDP shard group)."""
    wrapper_parameter_bytes: int = 0
    """FSDP's unsharded group and the prefetched next layer, in the compute dtype."""
    wrapper_gradient_bytes: int = 0
    """DDP's fp32 gradient buckets, or FSDP's unsharded gradients (and their fp32 reduce copy)."""
    autocast_copy_bytes: int = 0
    """Autocast's cached 16-bit copy of each matmul weight, held from forward to backward (plain, DDP)."""
    activation_checkpointing: str = "none"
    checkpointed_layers: int = 0
    """Blocks of one stage that recompute their activations."""
    micro_batch_size: int = 1
    logits_saved_bytes: int = 0
    """The loss's fp32 log-softmax, saved from the forward to the backward pass."""
    recompute_bytes: int = 0
    """What the backward pass holds of activations once the loss is done: one block's, recomputed
    (checkpointing) or still saved (the first block, when almost every gradient exists)."""
    accumulated_gradient_bytes: int = 0
    """Gradients alive through a later micro-batch's forward (grad_accum_steps > 1): plain/DDP's
    fp32 gradients, or FSDP's fp32 shard (reduce-scattered every micro-batch)."""
    output_group_bytes: int = 0
    """FSDP: the output layer's group, still unsharded when the loss runs (the next layer is not
    prefetched before the backward starts)."""
    sharded_wrapper: bool = False
    """FSDP/TP (`wrapper_gradient_bytes` exist in the backward only) or DDP (buckets all along)."""

    @property
    def wrapper_bytes(self) -> int:
        """DDP's gradient buckets, or FSDP's unsharded working set (see `DDP_GRADIENT_BUCKET_COPIES`)."""
        return self.wrapper_parameter_bytes + self.wrapper_gradient_bytes

    def phases(self) -> dict[str, dict[str, int]]:
        """Bytes per category at the four moments a step's peak can be: the loss's
        backward (every saved activation and the logits' fp32 gradients; no gradient yet unless
        accumulated), the last block's backward under FSDP (the same with that block gathered and
        reducing), the blocks' backward (all gradients and the wrapper's unsharded ones, one
        block's activations) and the optimizer step (weights, gradients, states)."""
        buckets = 0 if self.sharded_wrapper else self.wrapper_gradient_bytes
        # FSDP's last block, gathered (and the next prefetched) and reducing its gradients while
        # every other block's activations are still saved: the peak when a block is large next
        # to its activations (a mixture of experts: 1.1 GiB a block in fp32 for MoE 8x2B).
        gathered = self.wrapper_parameter_bytes if self.sharded_wrapper else 0
        reducing = self.wrapper_gradient_bytes if self.sharded_wrapper else 0
        states = {"optimizer_state": self.optimizer_bytes, "overhead": self.overhead_bytes}
        return {
            "loss": {"parameters": self.weights_bytes + self.output_group_bytes,
                     "gradients": self.accumulated_gradient_bytes + buckets, **states,
                     "activations": self.activations_bytes + self.logits_saved_bytes + self.autocast_copy_bytes,
                     "logits_temporaries": self.logits_bytes},
            "last_block": {"parameters": self.weights_bytes + gathered,
                           "gradients": self.accumulated_gradient_bytes + buckets + reducing,
                           **states,
                           "activations": self.activations_bytes + self.autocast_copy_bytes,
                           "logits_temporaries": 0},
            "backward": {"parameters": self.weights_bytes + self.wrapper_parameter_bytes,
                         "gradients": self.gradients_bytes + self.wrapper_gradient_bytes, **states,
                         "activations": self.recompute_bytes, "logits_temporaries": 0},
            "optimizer": {"parameters": self.weights_bytes, "gradients": self.gradients_bytes + buckets,
                          **states, "activations": 0, "logits_temporaries": 0},
        }

    @property
    def peak_phase(self) -> str:
        """The phase whose bytes are the peak (`phases`)."""
        phases = self.phases()
        return max(phases, key=lambda name: sum(phases[name].values()))

    def by_category(self) -> dict[str, int]:
        """The peak split as a memory tracker splits it (`CATEGORIES`), at the phase where it is
        (`peak_phase`): the wrapper's unsharded parameters count as parameters, its buckets and
        unsharded gradients as gradients, autocast's copies and the saved log-softmax as
        activations, the logits' gradients as temporaries. (Summing every category whatever the
        phase put the plan 7-28 % above the dry run's peak on 7-8B models: the gradients do not
        exist yet where the activations peak.)"""
        phase = self.phases()[self.peak_phase]
        return {name: phase[name] for name in CATEGORIES}

    @property
    def total_bytes(self) -> int:
        return sum(self.by_category().values())

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    @property
    def headroom_pct(self) -> float:
        """Free share of the device at the estimated peak; negative when it does not fit."""
        return 100.0 * (self.capacity_bytes - self.total_bytes) / self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(total_bytes=self.total_bytes, fits=self.fits, headroom_pct=round(self.headroom_pct, 2),
                    wrapper_bytes=self.wrapper_bytes, by_category=self.by_category(), peak_phase=self.peak_phase)
        return data


def estimate_memory(
    spec: ExperimentSpec,
    layout: ParallelLayout,
    *,
    micro_batch_size: int | None = None,
    activation_checkpointing: str | None = None,
) -> MemoryEstimate:
    """Peak bytes per device for `layout`; never raises (see `plan_parallel` for checks).

    `micro_batch_size` and `activation_checkpointing` default to the spec's (the layout search
    passes its own). Parameter states (`state_bytes`) are divided by tp (decoder blocks only)
    x pp x the FSDP shard group (dp, or the ranks of one node under HSDP); the wrapper and the
    compute-precision copies are described in the module doc. Activations: the architecture's
    per-block bytes (tp splits all but `ACTIVATION_UNSPLIT_BYTES_BY_TP` per s*b*h), times
    the blocks of one pipeline stage (checkpointed ones keep their input only), times the
    micro-batches the schedule keeps in flight on the first stage (`pipeline_in_flight`).
    Every category is summed: a bound on the peak, not a trace of it.
    """
    micro = spec.train.micro_batch_size if micro_batch_size is None else micro_batch_size
    mode = spec.train.activation_checkpointing if activation_checkpointing is None else activation_checkpointing
    return _memory(spec, layout.dp, layout.tp, layout.pp, layout.fsdp, micro, mode,
                   reduce_dtype=layout.reduce_dtype)


def pipeline_in_flight(pp: int, micro_batches: int, schedule: str = "1f1b") -> float:
    """Micro-batches whose activations the first stage holds at its peak, in units of one
    stage's blocks: GPipe all m (every forward before any backward), 1F1B min(pp, m),
    Interleaved 1F1B (v = `virtual_stages_per_rank`, 2) (1 + (pp - 1) / (v pp)) x min(pp, m)
    (Narayanan et al. 2021). 1 without pipeline stages."""
    if pp <= 1:
        return 1.0
    if schedule == "gpipe":
        return float(micro_batches)
    one_f_one_b = float(min(pp, micro_batches))
    virtual = virtual_stages_per_rank(schedule)
    return one_f_one_b * (1.0 + (pp - 1) / (virtual * pp)) if virtual > 1 else one_f_one_b


def parameter_shapes(spec: ExperimentSpec) -> dict[str, tuple[int, ...]]:
    """A representative shape per parameter role (what shape-dependent optimizer state reads)."""
    model = spec.model
    h, v = model.hidden_size, model.vocab_size
    return {"hidden": (h, h), "embedding": (v, h), "head": (v, h), "scalar": (h,)}


def state_bytes(spec: ExperimentSpec) -> StateBytes:
    """Bytes per parameter of weights, gradients and optimizer state for `spec`'s optimizer: the
    optimizer file's state bytes per role, weighted by the model's own `parameters_by_role()`."""
    model, train = spec.model, spec.train
    base = STATE_BYTES[train.precision]
    roles = model.parameters_by_role()
    total = sum(roles.values()) or 1
    opt = train.optimizer
    shapes = parameter_shapes(spec)
    per_param = sum(count * opt.state_bytes_per_parameter(role, shapes[role])
                    for role, count in roles.items() if count) / total
    return StateBytes(weights=base.weights, gradients=base.gradients, optimizer=round(per_param, 3),
                      optimizer_name=opt.name)


def fsdp_shard_degree(spec: ExperimentSpec, dp: int, tp: int, fsdp: bool) -> int:
    """Ranks one FSDP group shards over, as `trainer.parallel.Topology.from_layout` decides:
    tp > 1 always shards over dp; FSDP alone over several nodes is hybrid (one node per group)."""
    if not (fsdp or tp > 1):
        return 1
    nodes = spec.resource.nodes
    if tp == 1 and nodes > 1 and dp % nodes == 0 and dp > nodes:
        return dp // nodes
    return dp


def _memory(spec: ExperimentSpec, dp: int, tp: int, pp: int, fsdp: bool, micro_batch: int,
            checkpointing: str = "none", *, reduce_dtype: str = "fp32",
            grad_accum: int | None = None) -> MemoryEstimate:
    model, train, resource = spec.model, spec.train, spec.resource
    accum = train.grad_accum_steps if grad_accum is None else grad_accum
    on_gpu = resource.gpus_per_node > 0
    state = state_bytes(spec)
    sharded = (fsdp or tp > 1) and dp * tp * pp > 1
    shard = fsdp_shard_degree(spec, dp, tp, fsdp)
    sharding = tp * pp * shard
    embedding = model.embedding_parameters()
    layers_total = model.block_parameters()
    # tp splits the decoder layers only (see ACTIVATION_UNSPLIT_BYTES_BY_TP); pp and FSDP split everything.
    params_here = -(-(-(-layers_total // tp) + embedding) // (pp * shard))
    copy = COMPUTE_COPY_BYTES[train.precision]

    fsdp_cast = bool(sharded and copy)
    cast = ACTIVATION_ELEMENT_BYTES_FSDP_CAST if fsdp_cast else ACTIVATION_ELEMENT_BYTES
    element = ElementBytes(cast[train.precision], fsdp_cast=fsdp_cast)
    seq, hidden = spec.data.seq_len, model.hidden_size
    # The architecture's own count of what one block saves (models/<model_type>.py).
    per_layer = int(model.activation_bytes_per_layer(seq, micro_batch, element))
    unsplit = ACTIVATION_UNSPLIT_BYTES_BY_TP[train.precision]
    replicated = int(unsplit * seq * micro_batch * hidden
                     + model.activation_bytes_whole_under_tp(seq, micro_batch, element)) if tp > 1 else 0
    per_layer = replicated + -(-(per_layer - replicated) // tp)
    layers_here = model.num_layers // pp
    recomputed = len(checkpointed_blocks(layers_here, checkpointing))
    residual = copy if (sharded and copy) else RESIDUAL_BYTES_AUTOCAST
    block_input = seq * micro_batch * hidden * residual
    kept = (layers_here - recomputed) * per_layer + recomputed * block_input
    in_flight = pipeline_in_flight(pp, accum, spec.parallel.pp_schedule
                                   if isinstance(spec.parallel, ParallelLayout) else "1f1b")
    activations = int(kept * in_flight) + NON_BLOCK_ACTIVATION_BYTES * seq * micro_batch * hidden
    # The dense document mask where the attention kernel takes one (`DENSE_MASK_BYTES`):
    # a CPU process's, shared by the step's blocks; a GPU's in fp32, one call's at a time.
    dense_mask = seq * seq * micro_batch * DENSE_MASK_BYTES[train.precision]
    if not on_gpu:
        activations += dense_mask
    # The backward pass after the loss: one block's activations (recomputed, or the first block's
    # own) and its input; and the dense mask (a CPU process's, still shared; a GPU's in fp32,
    # rebuilt by that block's backward).
    recompute = per_layer + block_input
    if not on_gpu or train.precision == "fp32":
        recompute += dense_mask
    logit_count = seq * micro_batch * model.vocab_size

    wrapper_params = wrapper_grads = autocast = output_group = 0
    accumulated = 0
    if accum > 1:
        # The fp32 gradients of the earlier micro-batches, alive through the last one's forward:
        # all of them under plain/DDP, this rank's shard under FSDP, which reduce-scatters every
        # micro-batch (trainer/step.py, as torchtitan). (Under accelerate's no_sync FSDP2 kept them
        # unsharded in fp32: 0.61 GiB on GPT-2 small with 4 micro-batches, 40 GiB a device for
        # Llama-3-70B on FSDP 8 x TP 8 with 8.)
        accumulated = params_here * state.gradients
    if sharded:
        one_embedding = model.vocab_size * hidden
        layer = -(-(layers_total // model.num_layers) // tp)
        largest = max(one_embedding, layer)
        unsharded = copy or state.weights  # the compute dtype (fp32 runs gather fp32)
        reduce = FP32_REDUCE_BYTES if copy and reduce_dtype == "fp32" else 0
        wrapper_params = largest * unsharded + FSDP_PREFETCHED_LAYERS * layer * unsharded
        output_group = one_embedding * unsharded
        wrapper_grads = largest * (unsharded + reduce)
    else:
        if dp > 1:
            wrapper_grads = DDP_GRADIENT_BUCKET_COPIES * params_here * state.gradients
        if copy:
            # Autocast's copies live as long as the backward needs them: a checkpointed block saves
            # none (its copies are made again when it recomputes), so only the other blocks' and
            # the head's are held (measured: GPT-2 small with full checkpointing holds the head's).
            roles = model.parameters_by_role()
            kept_blocks = model.num_layers - recomputed * pp
            matmul_weights = roles["hidden"] * kept_blocks // model.num_layers + model.vocab_size * hidden
            autocast = -(-matmul_weights // pp) * copy

    estimate = MemoryEstimate(
        parameters_per_device=params_here,
        weights_bytes=params_here * state.weights,
        gradients_bytes=params_here * state.gradients,
        optimizer_bytes=int(params_here * state.optimizer),
        activations_bytes=activations,
        logits_bytes=logit_count * LOGIT_BYTES_PER_ELEMENT,
        logits_saved_bytes=logit_count * LOGIT_SAVED_BYTES_PER_ELEMENT,
        recompute_bytes=recompute,
        accumulated_gradient_bytes=accumulated,
        output_group_bytes=output_group,
        sharded_wrapper=sharded,
        overhead_bytes=0,
        capacity_bytes=int(resource.gpu_memory_gb * GIB),
        state_bytes=state,
        sharding_degree=sharding,
        wrapper_parameter_bytes=wrapper_params,
        wrapper_gradient_bytes=wrapper_grads,
        autocast_copy_bytes=autocast,
        activation_checkpointing=checkpointing,
        checkpointed_layers=recomputed,
        micro_batch_size=micro_batch,
    )
    if not on_gpu:
        return replace(estimate, overhead_bytes=FRAMEWORK_OVERHEAD_BYTES_CPU)
    return replace(estimate, overhead_bytes=FRAMEWORK_OVERHEAD_BYTES_GPU
                   + int(ALLOCATOR_FRAGMENTATION * estimate.total_bytes))
