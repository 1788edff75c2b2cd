"""The contract checks that build the model (`pipeline contract`, the PR check, the tests).

For an architecture, on tiny configurations of it (its own `smoke_overrides`, plus the
switches that change the counts), each check the promise a hypothesis rests on:

- **counts**: the model built on the meta device has the declared parameters; torch's FLOP
  counter on fake tensors counts the declared FLOPs;
- **tensor parallelism**: every plan entry names a module of every block, and the forward runs
  with rank 0's share of every split (one process, tp=2), so a projection the plan forgets
  fails naming the module, and a reshape to the global head count fails at its own line;
- **determinism**: the eval forward gives the same logits twice (checked first: dropout left on
  in eval is named as such, never as a document-boundary leak);
- **causality**, in one process and on rank 0's tensor-parallel share: changing the tokens after
  position t changes no logit at or before t; a failure names the first position that sees the
  future and the module where the difference first appears;
- **packed rows**: three documents back to back (`position_ids` restarting at 0) give each
  document the logits it gets alone; the failure blames the document boundary only when the
  difference starts at one. An architecture whose routing legitimately depends on the other
  tokens (a capacity-limited mixture of experts) declares it (`batch_dependence`, a class
  attribute: why) and gives `batch_independent_fields()` (field values under which it does not,
  e.g. a capacity that drops nothing): its packed rows are compared under those, causality and
  the rest under its own configuration;
- **state round trip**: a few training steps, `state_dict()`, a fresh model loaded from it gives
  the same forward and takes the same next step; a failure names the parameter created inside
  forward, the parameter with no gradient (never trained), or the buffer not saved;
- **export**: when `export_note()` says transformers loads the export, the tiny model's export
  is loaded by the class its config.json names (`trainer.hf_checkpoint.export_problem`, what
  the trainer checks where it writes an export): no missing or unexpected keys, logits equal
  within `EXPORT_ATOL` on a plain and a packed row.

For an optimizer: its `state_dict()` round trip resumes bitwise (a copy of the model and
optimizer loaded from the state dicts takes the same next steps), or the step and the tensor
that differ.

Each failure is a `validation.contract.ContractFailure`: one line with the file, the line (of
the culprit where it can be found: the `view` with a global head count, the line that creates a
parameter in forward, the `register_buffer` of an unsaved buffer, the `forward` of the module
where a leak or randomness appears; else the method's), the method, what to change. Nothing
here raises for a plug-in's own bug.
"""

from __future__ import annotations

import copy
import inspect
import math
import re
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch

from validation.contract import ContractFailure

PACKED_DOCUMENTS = (5, 9, 18)
"""Lengths of the documents packed into the test row (32 tokens)."""
PACKED_ATOL = 1e-4
"""fp32 logits of a document packed vs alone agree to ~1e-6; attention across documents moves them by O(1)."""
CAUSAL_SEQ = 32
"""Tokens of the causality check's row; every cut 0..30 is checked."""
CAUSAL_ATOL = 1e-5
"""fp32 logits at or before a cut: identical (0.0) in every shipped file; a token that sees a later one
moves them by >= 1e-2 at the tiny models' initialisation (measured: 0.011-0.077 for a mask without its
causal part)."""
STATE_STEPS = 2
"""Training steps (SGD) before the state round trip saves."""
STATE_LR = 0.05
ROUND_TRIP_STEPS = (3, 6)
"""The optimizer check saves after step 3 and compares steps 4..6."""
TP_DEGREE = 2
"""The degree the one-process tensor-parallel simulation splits by."""


def method_line(config: type, method: str, file: str) -> int:
    """Line of `method` in `file` when the plug-in defines it there, else of its `Config` class."""
    target = Path(file).resolve()
    for obj in (getattr(config, method, None), config):
        try:
            src = inspect.getsourcefile(obj)  # type: ignore[arg-type]
            if src is not None and Path(src).resolve() == target:
                return inspect.getsourcelines(obj)[1]  # type: ignore[arg-type]
        except (OSError, TypeError):
            continue
    return 1


def tiny(config: type, **extra: Any) -> Any:
    """A tiny configuration of architecture `config`: its own smoke shrink (vocab 256, seq 32)."""
    model_type = config.model_fields["model_type"].default
    probe = config.model_validate({"model_type": model_type, "hidden_size": 64, "num_layers": 2, "num_heads": 4,
                                   "vocab_size": 256})
    return config.model_validate({"model_type": model_type, **probe.smoke_overrides(256, 32), **extra})


def variants(config: type) -> list[Any]:
    """Tiny configurations covering the switches that change the parameter count or the FLOPs."""
    out = [tiny(config), tiny(config, tie_word_embeddings=False)]
    fields = config.model_fields
    if "attn_implementation" in fields:
        out.append(tiny(config, attn_implementation="eager"))
    for switch in ("attn_gate", "bias", "attention_bias", "mlp_bias"):
        if switch in fields and isinstance(fields[switch].default, bool):
            out.append(tiny(config, **{switch: not fields[switch].default}))
    if "qk_norm" in fields and "attn_gate" in fields:
        out.append(tiny(config, qk_norm=False, attn_gate=True))
    return out


def batch_dependence(arch: Any) -> str:
    """Why `arch`'s tokens depend on other tokens than their document's earlier ones (its
    `batch_dependence` class attribute: capacity-limited routing, ...), or ""."""
    return str(getattr(arch, "batch_dependence", "") or "")


@cache
def _absolute(filename: str) -> str:
    try:
        return str(Path(filename).resolve())
    except (OSError, RuntimeError):
        return filename


def _same_file(filename: str, file: str) -> bool:
    """Whether two names are one file (a relative name is resolved against the working directory
    each time; absolute ones, what code objects carry, are cached)."""
    def resolved(name: str) -> str:
        return _absolute(name) if Path(name).is_absolute() else str(Path(name).resolve())

    return resolved(filename) == resolved(file)


def _short_name(qualname: str) -> str:
    """`modules.<locals>.Attention.forward.<locals>.<genexpr>` -> `Attention.forward`."""
    parts = [p for p in qualname.split(".") if not p.startswith("<")]
    return ".".join(parts[-2:]) or qualname


class _Checks:
    """Collects the failures of one plug-in file; a check that raises is a failure of its method."""

    def __init__(self, config: type, file: str):
        self.config, self.file = config, file
        self.failures: list[ContractFailure] = []
        self.keys: set[str] = set()
        self.deterministic: dict[str, bool] = {}

    def fail(self, method: str, message: str, key: str | None = None, line: int | None = None) -> None:
        """One line per check (`key`, default the method): the first configuration that shows the
        problem. `line`: the culprit's line in the plug-in's file (default: the method's)."""
        key = key or method
        if key in self.keys:
            return
        self.keys.add(key)
        if line is None:
            line = method_line(self.config, method.split("(")[0], self.file)
        self.failures.append(ContractFailure(self.file, line, method, message))

    def failed(self, key: str) -> bool:
        return key in self.keys

    def run(self, key: str, method: str, check: Callable[[], None]) -> None:
        try:
            check()
        except Exception as exc:  # noqa: BLE001 - a plug-in's bug is a failure line, not a traceback
            site = _plugin_frame(exc, self.file)
            if site is not None:
                line, name = site
                self.fail(name, f"raised {_first_line(exc)}", key=key, line=line)
            else:
                self.fail(method, f"raised {_first_line(exc)}", key=key)

    def module_site(self, module: torch.nn.Module) -> tuple[str, int | None]:
        """(method, line) of `module`'s forward when the plug-in's file defines it, else build()'s."""
        code = getattr(type(module).forward, "__code__", None)
        if code is not None and _same_file(code.co_filename, self.file):
            return _short_name(code.co_qualname), code.co_firstlineno
        return "build()", None


def _plugin_frame(exc: BaseException, file: str) -> tuple[int, str] | None:
    """(line, function) of the innermost frame of `exc`'s traceback in the plug-in's `file`."""
    found = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if _same_file(frame.f_code.co_filename, file):
            found = (lineno, _short_name(frame.f_code.co_qualname))
    return found


def _first_line(exc: BaseException) -> str:
    """`Type: first line` (a pydantic error: its first field and message)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            return f"{type(exc).__name__}: {'.'.join(map(str, first['loc']))}: {first['msg']}"
        except (TypeError, IndexError, KeyError):
            pass
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


ARCHITECTURE_CHECKS = ("parameters", "flops", "tp", "determinism", "causal", "packed", "state", "export")


def check_architecture(config: type, file: str, only: tuple[str, ...] = ARCHITECTURE_CHECKS) -> list[ContractFailure]:
    """The model-building checks of architecture `config` (a `models.Architecture` subclass):
    `only` names which (meta parameter count, FLOPs, TP names and shapes, determinism in eval,
    causality, packed rows, state round trip, export)."""
    checks = _Checks(config, file)
    try:
        archs = variants(config)
    except Exception as exc:  # noqa: BLE001
        checks.fail("smoke_overrides()", f"no tiny configuration validates: {_first_line(exc)}")
        return checks.failures
    runs: dict[str, tuple[str, Callable[[_Checks, Any], None]]] = {
        "parameters": ("parameter_count()", _parameters), "flops": ("flops_per_token()", _flops),
        "tp": ("tp_plan", _tp_names), "determinism": ("build()", _determinism), "causal": ("build()", _causality),
        "packed": ("build()", _packed_rows), "state": ("build()", _state_round_trip), "export": ("export()", _export)}
    with _one_thread():
        for arch in archs:
            for name in only:
                if checks.failed(name):
                    continue  # one line per check: the first configuration that shows the problem
                method, check = runs[name]
                checks.run(name, method, lambda arch=arch, check=check: check(checks, arch))
    return checks.failures


@contextmanager
def _one_thread() -> Iterator[None]:
    """Tiny models' ops are too small to split: one thread (on a busy 2-core runner every parallel
    region waits for a free core; trainer/measure.py measured 23.6 s -> 2.0 s for models/moe.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _switches(arch: Any, base: Any) -> str:
    """The fields where a variant differs from the first tiny config (`tie_word_embeddings=False`)."""
    diff = {k: v for k, v in arch.model_dump().items() if base.get(k) != v}
    return (" with " + ", ".join(f"{k}={v}" for k, v in diff.items())) if diff else ""


def _where(checks: _Checks, arch: Any) -> str:
    return _switches(arch, tiny(checks.config).model_dump())


# --------------------------------------------------------------------------- counts


def _parameters(checks: _Checks, arch: Any) -> None:
    from trainer.measure import parameter_count_on_meta

    where = _where(checks, arch)
    built, declared = parameter_count_on_meta(arch), arch.parameter_count()
    if built != declared:
        checks.fail("parameter_count()", f"declares {declared:,} parameters, the model built on the meta device has "
                                         f"{built:,}{where}", key="parameters")
    elif arch.embedding_parameters() + arch.block_parameters() != declared:
        checks.fail("block_parameters()", f"blocks {arch.block_parameters():,} + the rest "
                                          f"{arch.embedding_parameters():,} != parameter_count() {declared:,}{where}",
                    key="parameters")


def _flops(checks: _Checks, arch: Any) -> None:
    from trainer.measure import count_training_flops

    where = _where(checks, arch)
    for seq_len in (16, 32):
        counted, declared = count_training_flops(arch, seq_len, batch=2), arch.flops_per_token(seq_len)
        if abs(counted - declared) > 1e-9 * max(1.0, declared):
            checks.fail("flops_per_token()", f"declares {declared:,.0f} FLOPs per token at seq_len {seq_len}, torch's "
                                             f"counter on fake tensors counts {counted:,.0f}{where}", key="flops")
            return


# --------------------------------------------------------------------------- tensor parallelism


def _tp_names(checks: _Checks, arch: Any) -> None:
    plan = arch.tensor_parallel_plan()
    if not plan:
        return
    with torch.device("meta"):
        model = arch.build()
    blocks = arch.blocks(model)
    for i, block in enumerate(blocks):
        names = {name for name, _ in block.named_modules()}
        missing = sorted(set(plan) - names)
        if missing:
            checks.fail("tp_plan", f"{missing} not a module of block {i} ({type(block).__name__}); its modules: "
                                   f"{sorted(n for n in names if n)[:12]}", key="tp")
            return
    for name, style in plan.items():
        if not hasattr(blocks[0].get_submodule(name), "weight"):
            checks.fail("tp_plan", f"'{name}' ({style}) has no weight: colwise/rowwise split a linear, replicate "
                                   "keeps a weight whole", key="tp")
            return
    failed = _tp_shape_failure(arch, TP_DEGREE, checks.file)
    if failed is None:
        return
    if failed.heads is not None:
        line, function, message = failed.heads
        checks.fail(function, message, key="tp", line=line)
    else:
        checks.fail("tp_plan", failed.describe(TP_DEGREE), key="tp")


@dataclass(frozen=True)
class _TPFailure:
    """The forward on rank 0's share failed: in which module, with what, which linears the plan
    leaves whole, and (a reshape to the global head count) the culprit's line in the plug-in."""

    where: str
    error: str
    whole: list[str]
    heads: tuple[int, str, str] | None = None
    """(line, function, message) when the error is a `view`/`reshape` asking for every head."""

    def describe(self, tp: int) -> str:
        return (f"with tp={tp}, {self.where} fails: {self.error}; linears the plan leaves whole: "
                f"{self.whole or 'none'} (a colwise output split by head meets one of full width)")


def tp_shape_problem(arch: Any, tp: int) -> str | None:
    """Run the forward with every block's plan applied to one rank's share (`colwise`: the first
    1/tp of a linear's outputs, `rowwise`: of its inputs, `replicate`: whole), as rank 0 of a
    real tensor-parallel group holds it: a module the plan forgets meets a split neighbour with
    its whole width and the shapes disagree. Returns which module failed, and the linears the
    plan leaves whole, or None (also when `tp` does not divide this configuration)."""
    failed = _tp_shape_failure(arch, tp)
    if failed is None:
        return None
    return failed.heads[2] if failed.heads is not None else failed.describe(tp)


def rank0_share(arch: Any, tp: int, seed: int = 0) -> torch.nn.Module | None:
    """The model as rank 0 of a `tp`-way tensor-parallel group holds it, on one process: every
    block's plan applied to `initialised(arch)` (None: no plan, or `tp` does not divide it)."""
    plan = arch.tensor_parallel_plan()
    if not plan or arch.tp_problem(tp) is not None:
        return None
    model = initialised(arch, seed)
    for block in arch.blocks(model):
        for name, style in plan.items():
            _shard_like_rank0(block.get_submodule(name), style, tp)
    return model


_VIEW_ERROR = re.compile(r"shape '\[([-\d, ]+)\]' is invalid for input of size (\d+)")


def _global_heads(arch: Any, tp: int, exc: BaseException, file: str | None) -> tuple[int, str, str] | None:
    """(line, function, message) when `exc` is a reshape in the plug-in's file asking for the
    global head count on rank 0's share: the elements it wants are tp x what the share has."""
    match = _VIEW_ERROR.search(str(exc))
    if match is None:
        return None
    dims, size = [int(d) for d in match.group(1).split(",")], int(match.group(2))
    heads = {arch.num_heads, arch.kv_heads}
    wanted = math.prod(d for d in dims if d != -1)
    if -1 in dims or wanted != size * tp or not heads & set(dims):
        return None
    frames = [(frame, lineno) for frame, lineno in traceback.walk_tb(exc.__traceback__)
              if file is not None and _same_file(frame.f_code.co_filename, file)]
    if not frames:
        return None
    frame, lineno = frames[-1]
    count = next(d for d in dims if d in heads)
    text = (inspect.getframeinfo(frame).code_context or [""])[0].strip() if frame.f_lineno == lineno else ""
    source = f" (`{text}`)" if text else ""
    message = (f"with tp={tp} rank 0 holds {count // tp} of the {count} heads, but this reshape{source} asks for all "
               f"{count}: shape {dims} for {size} elements; the head count is the global one: reshape with -1 heads "
               "(`view(b, s, -1, head_dim)`), so a rank with num_heads / tp heads works unchanged")
    return lineno, _short_name(frame.f_code.co_qualname), message


def _tp_shape_failure(arch: Any, tp: int, file: str | None = None) -> _TPFailure | None:
    """What fails when the forward runs on rank 0's share, or None. `file`: the plug-in's file,
    where a reshape to the global head count is found."""
    model = rank0_share(arch, tp)
    if model is None:
        return None
    plan = arch.tensor_parallel_plan()
    blocks = arch.blocks(model)
    active: list[str] = []
    handles = []

    def enter(name: str) -> Callable[..., None]:
        return lambda *_: active.append(name)  # type: ignore[func-returns-value]

    def leave(*_: Any) -> None:
        active.pop()

    for name, module in blocks[0].named_modules():
        handles += [module.register_forward_pre_hook(enter(name)), module.register_forward_hook(leave)]
    ids, pos = packed_row(arch.vocab_size, (16,))
    try:
        with torch.no_grad():
            model(input_ids=ids, position_ids=pos, use_cache=False)
    except RuntimeError as exc:
        where = type(blocks[0]).__name__ + (f".{active[-1]}" if active and active[-1] else "")
        whole = sorted(n for n, m in blocks[0].named_modules() if isinstance(m, torch.nn.Linear) and n not in plan)
        text = str(exc).strip().splitlines()
        return _TPFailure(where, text[0] if text else type(exc).__name__, whole, _global_heads(arch, tp, exc, file))
    finally:
        for h in handles:
            h.remove()
    return None


def _shard_like_rank0(module: torch.nn.Module, style: str, tp: int) -> None:
    """Keep rank 0's share of `module`'s weight (and bias) for a `colwise` / `rowwise` split."""
    if style not in ("colwise", "rowwise"):
        return
    weight = module.weight  # type: ignore[union-attr]
    dim = 0 if style == "colwise" else 1
    keep = weight.shape[dim] // tp
    module.weight = torch.nn.Parameter(weight.narrow(dim, 0, keep).clone())  # type: ignore[union-attr]
    bias = getattr(module, "bias", None)
    if style == "colwise" and isinstance(bias, torch.Tensor):
        module.bias = torch.nn.Parameter(bias[:keep].clone())  # type: ignore[union-attr]
    for attr, value in (("out_features", keep), ("in_features", keep)):
        if hasattr(module, attr) and (attr == "out_features") == (style == "colwise"):
            setattr(module, attr, value)


def initialised(arch: Any, seed: int = 0) -> torch.nn.Module:
    """`arch.build()` on the CPU with every parameter from `init_parameter` (what the trainer does)."""
    torch.manual_seed(seed)
    model = arch.build()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            try:
                value = arch.init_parameter(model, name, p.shape, gen)
            except NotImplementedError:
                return model.float().eval()
            p.copy_(value.to(p.dtype))
    return model.float().eval()


# --------------------------------------------------------------------------- module outputs


def _first_tensor(out: Any) -> torch.Tensor | None:
    """The tensor a module's output stands for: itself, `.logits`, or the first tensor of a
    tuple, list or mapping (transformers' attention returns (output, weights))."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
    return next((v for v in values if isinstance(v, torch.Tensor)), None)


@dataclass
class _Call:
    """One module call of a recorded forward: its first tensor input and its output's tensor."""

    name: str
    module: torch.nn.Module
    given: torch.Tensor | None = None
    out: torch.Tensor | None = None


@contextmanager
def _recorded(model: torch.nn.Module) -> Iterator[list[_Call]]:
    """Every module call (in the order the forward finishes them) with its input and output
    tensors, detached copies."""
    calls: list[_Call] = []
    running: list[_Call] = []

    def enter(name: str) -> Callable[..., None]:
        def record(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            given = _first_tensor(tuple(args) + tuple(kwargs.values()))
            running.append(_Call(name, module, None if given is None else given.detach().clone()))
        return record

    def leave(_module: torch.nn.Module, _args: Any, out: Any) -> None:
        call = running.pop()
        t = _first_tensor(out)
        call.out = None if t is None else t.detach().clone()
        calls.append(call)

    handles = []
    for name, module in model.named_modules():
        handles += [module.register_forward_pre_hook(enter(name), with_kwargs=True),
                    module.register_forward_hook(leave)]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def _prefix(t: torch.Tensor, seq: int, upto: int) -> torch.Tensor | None:
    """Positions 0..upto of a [batch, seq, ...] (or, batch 1, [seq, ...]) tensor; None otherwise."""
    if t.dim() >= 2 and t.shape[1] == seq:
        return t[:, :upto + 1]
    if t.dim() >= 1 and t.shape[0] == seq:
        return t[:upto + 1]
    return None


def _differs(a: torch.Tensor | None, b: torch.Tensor | None, atol: float, seq: int | None = None,
             upto: int | None = None) -> bool:
    """Whether two recorded tensors differ (at positions 0..`upto` only, when given); tensors
    without that position axis, or absent, do not count."""
    if a is None or b is None:
        return False
    if upto is not None and seq is not None:
        a, b = _prefix(a, seq, upto), _prefix(b, seq, upto)
        if a is None or b is None:
            return False
    if a.shape != b.shape:
        return True
    if not a.is_floating_point():
        return not torch.equal(a, b)
    return bool(((a.float() - b.float()).abs() > atol).any()) or not torch.equal(a.isnan(), b.isnan())


def _first_divergence(a: list[_Call], b: list[_Call], model: torch.nn.Module, atol: float,
                      seq: int | None = None, upto: int | None = None) -> tuple[str, torch.nn.Module] | None:
    """The module whose own code makes two recorded runs differ (at positions 0..`upto` only, when
    given): the first module (in finishing order) whose output differs, or, when its input
    already differed, the module that called it (the difference was made between its children)."""
    for x, y in zip(a, b, strict=False):
        if x.name != y.name:
            return x.name, x.module
        if not _differs(x.out, y.out, atol, seq, upto):
            continue
        if x.name and _differs(x.given, y.given, atol, seq, upto):
            parent = x.name.rpartition(".")[0]
            owner = model.get_submodule(parent) if parent else model
            if parent and isinstance(owner, (torch.nn.ModuleList, torch.nn.ModuleDict)):  # a container calls nothing
                parent = parent.rpartition(".")[0]
                owner = model.get_submodule(parent) if parent else model
            return parent, owner
        return x.name, x.module
    return None


def _module_name(name: str, module: torch.nn.Module) -> str:
    return f"'{name}' ({type(module).__name__})" if name else f"the model's own forward ({type(module).__name__})"


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


# --------------------------------------------------------------------------- determinism


def _is_deterministic(checks: _Checks, arch: Any) -> bool:
    """Whether `arch`'s eval forward gives the same logits twice (failing the `determinism` check
    once, naming the first module whose output differs, when it does not)."""
    key = arch.model_dump_json()
    if key in checks.deterministic:
        return checks.deterministic[key]
    model = initialised(arch)
    ids, pos = packed_row(arch.vocab_size)

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=ids, position_ids=pos, use_cache=False).logits.float()

    a, b = forward(), forward()
    same = torch.equal(a, b)
    checks.deterministic[key] = same
    if not same:
        with _recorded(model) as first:
            forward()
        with _recorded(model) as second:
            forward()
        culprit = _first_divergence(first, second, model, 0.0)
        name, module = culprit if culprit is not None else ("", model)
        method, line = checks.module_site(module)
        diff = float((a - b).abs().max())
        checks.fail(method, f"forward is not deterministic in eval mode: the same input twice gives logits up to "
                            f"{diff:.3g} apart, first in module {_module_name(name, module)}{_where(checks, arch)}: "
                            "dropout or another random op runs in eval mode (F.dropout's `training` defaults to True: "
                            "pass training=self.training, or use nn.Dropout); evaluation, causality and packed rows "
                            "are judged on a deterministic eval forward", key="determinism", line=line)
    return same


def _determinism(checks: _Checks, arch: Any) -> None:
    _is_deterministic(checks, arch)


# --------------------------------------------------------------------------- causality


def _perturbed_rows(vocab: int, seq: int, seed: int = 0) -> torch.Tensor:
    """[seq, seq] token ids: row 0 a random row, row c + 1 the same up to position c and other
    tokens after it (every one changed)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (seq,), generator=gen)
    rows = [ids]
    for cut in range(seq - 1):
        row = ids.clone()
        shift = torch.randint(1, vocab, (seq - cut - 1,), generator=gen)
        row[cut + 1:] = (ids[cut + 1:] + shift) % vocab
        rows.append(row)
    return torch.stack(rows)


@dataclass(frozen=True)
class _Leak:
    position: int
    """The first position whose logits change when later tokens change."""
    cut: int
    """The tokens after this position were changed."""
    diff: float
    module: str
    """The module where the difference first appears."""
    culprit: torch.nn.Module | None


def first_leak(model: torch.nn.Module, vocab: int, seq: int = CAUSAL_SEQ, per_row: bool = False) -> _Leak | None:
    """Changing the tokens after position t, for every t, changes no logit at or before t; else the
    first position that sees the future, and the module where the difference first appears.
    `per_row`: one row per forward (an architecture whose rows depend on each other)."""
    rows = _perturbed_rows(vocab, seq)
    pos = torch.arange(seq).expand(rows.shape[0], seq)
    with torch.no_grad():
        if per_row:
            logits = torch.cat([model(input_ids=rows[i:i + 1], position_ids=pos[:1], use_cache=False).logits.float()
                                for i in range(rows.shape[0])])
        else:
            logits = model(input_ids=rows, position_ids=pos, use_cache=False).logits.float()
    base = logits[0]
    found: tuple[int, int, float] | None = None
    for cut in range(seq - 1):
        moved = (logits[cut + 1, :cut + 1] - base[:cut + 1]).abs().amax(dim=-1)  # per position 0..cut
        bad = (moved > CAUSAL_ATOL) | moved.isnan()
        if bool(bad.any()):
            position = int(bad.nonzero()[0, 0])
            if found is None or position < found[0]:
                found = (position, cut, float(moved[position]))
    if found is None:
        return None
    position, cut, diff = found
    with torch.no_grad(), _recorded(model) as first:
        model(input_ids=rows[:1], position_ids=pos[:1], use_cache=False)
    with torch.no_grad(), _recorded(model) as second:
        model(input_ids=rows[cut + 1:cut + 2], position_ids=pos[:1], use_cache=False)
    culprit = _first_divergence(first, second, model, CAUSAL_ATOL, seq, cut)
    name, module = culprit if culprit is not None else ("", None)
    return _Leak(position, cut, diff, _module_name(name, module) if module is not None else "the logits", module)


def _causality(checks: _Checks, arch: Any) -> None:
    if not _is_deterministic(checks, arch):
        return
    per_row = bool(batch_dependence(arch))
    layouts: list[tuple[str, Callable[[], torch.nn.Module | None]]] = [
        ("", lambda: initialised(arch)), (f" on rank 0's share of tp={TP_DEGREE}", lambda: rank0_share(arch, TP_DEGREE))]
    for layout, build in layouts:
        try:
            model = build()
            if model is None:
                continue
            leak = first_leak(model, arch.vocab_size, min(CAUSAL_SEQ, arch.max_position_embeddings), per_row)
        except RuntimeError:
            if layout:
                continue  # a share that does not run is the tp check's failure
            raise
        if leak is None:
            continue
        method, line = checks.module_site(leak.culprit) if leak.culprit is not None else ("build()", None)
        checks.fail(method, f"causality: position {leak.position} sees the future: changing the tokens after "
                            f"position {leak.cut} changes its logits by {leak.diff:.3g}{layout}{_where(checks, arch)}; "
                            f"the difference first appears in module {leak.module}: a token's logits may depend on "
                            "itself and the earlier tokens of its document only (attention: a causal mask within each "
                            "document; a router: no ranking or capacity over later tokens), or the model learns to "
                            "copy the next token and every loss it reports is too low",
                    key="causal", line=line)
        return


# --------------------------------------------------------------------------- packed rows


def packed_row(vocab_size: int, lengths: tuple[int, ...] = PACKED_DOCUMENTS, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, position_ids) of one row of `lengths` documents back to back."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (1, sum(lengths)), generator=gen)
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    return ids, pos


@dataclass(frozen=True)
class PackedComparison:
    """A packed row's logits against its documents run alone."""

    worst: float
    """Largest |logit| difference."""
    document: int
    """(1-based) document where it is largest."""
    first_token: int | None
    """The first token (index in the row) whose logits differ by more than `PACKED_ATOL`."""
    first_document: int
    """(1-based) document of `first_token`."""

    @property
    def at_boundary(self) -> bool:
        """The difference starts at the first token of a document that follows another one."""
        return self.first_token is not None and self.first_document > 1 and \
            self.first_token == sum(PACKED_DOCUMENTS[:self.first_document - 1])


def packed_comparison(model: torch.nn.Module, vocab_size: int) -> PackedComparison:
    ids, pos = packed_row(vocab_size)
    worst, at, lo = 0.0, 0, 0
    first: tuple[int, int] | None = None
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0].float()
        for i, n in enumerate(PACKED_DOCUMENTS):
            alone = model(input_ids=ids[:, lo:lo + n], position_ids=pos[:, lo:lo + n],
                          use_cache=False).logits[0].float()
            per_token = (packed[lo:lo + n] - alone).abs().amax(dim=-1)
            diff = float(per_token.max())
            if diff > worst or diff != diff:
                worst, at = diff, i + 1
            bad = (per_token > PACKED_ATOL) | per_token.isnan()
            if first is None and bool(bad.any()):
                first = (lo + int(bad.nonzero()[0, 0]), i + 1)
            lo += n
    return PackedComparison(worst, at, first[0] if first else None, first[1] if first else 0)


def packed_difference(model: torch.nn.Module, vocab_size: int) -> tuple[float, int]:
    """Largest |logit| difference between a packed row and its documents run alone, and the
    (1-based) document where it is largest."""
    found = packed_comparison(model, vocab_size)
    return found.worst, found.document


def _packed_rows(checks: _Checks, arch: Any) -> None:
    if not _is_deterministic(checks, arch):
        return
    dependence, under = batch_dependence(arch), ""
    if dependence:
        fields = getattr(arch, "batch_independent_fields", None)
        overrides = fields() if callable(fields) else {}
        if not overrides:
            checks.fail("batch_independent_fields()", f"declares batch_dependence ({dependence}) but no "
                                                      "batch_independent_fields(): the field values under which a "
                                                      "token depends on its document only (e.g. a capacity that drops "
                                                      "nothing), which packed rows are checked with", key="packed")
            return
        arch = type(arch).model_validate({**arch.model_dump(), **overrides})
        under = " under batch_independent_fields() " + ", ".join(f"{k}={v}" for k, v in overrides.items())
    found = packed_comparison(initialised(arch), arch.vocab_size)
    if found.worst <= PACKED_ATOL:
        return
    doc = found.document
    lo = sum(PACKED_DOCUMENTS[:doc - 1])
    head = (f"forward(position_ids=...): a packed row's logits differ from its documents run alone by up to "
            f"{found.worst:.3g} (document {doc} of {len(PACKED_DOCUMENTS)}, tokens {lo}..{lo + PACKED_DOCUMENTS[doc - 1] - 1}"
            f"{_where(checks, arch)}{under})")
    if found.at_boundary or found.first_token is None:
        checks.fail("build()", f"{head}: tokens attend across the document boundary (the difference starts at token "
                               f"{found.first_token}, the first of document {found.first_document}); position_ids "
                               "restart at 0 for each packed document, mask attention with them (see models/nanogpt.py)",
                    key="packed")
        return
    start = sum(PACKED_DOCUMENTS[:found.first_document - 1])
    checks.fail("build()", f"{head}: the difference starts at token {found.first_token}, inside document "
                           f"{found.first_document} (its token {found.first_token - start}), not at a document boundary: "
                           "a token's output depends on other tokens of the row than its document's earlier ones"
                           + (" even under the fields declared batch-independent" if dependence else
                              " (routing with a capacity, statistics over the batch, ...); an architecture that means "
                              "it declares `batch_dependence` (why) and `batch_independent_fields()` (see "
                              "models/moe_capacity.py)"), key="packed")


# --------------------------------------------------------------------------- state round trip


@contextmanager
def _creation_sites(file: str) -> Iterator[dict[tuple[int, str], tuple[int, str]]]:
    """Where the plug-in's `file` registers each parameter and buffer while the block runs:
    (id(module), name) -> (line, function) of the innermost frame in `file`."""
    sites: dict[tuple[int, str], tuple[int, str]] = {}
    module_class = torch.nn.Module
    register_parameter, register_buffer = module_class.register_parameter, module_class.register_buffer

    def site() -> tuple[int, str] | None:
        frame: Any = sys._getframe(2)
        while frame is not None:
            if _same_file(frame.f_code.co_filename, file):
                return frame.f_lineno, _short_name(frame.f_code.co_qualname)
            frame = frame.f_back
        return None

    def on_parameter(self: torch.nn.Module, name: str, param: Any) -> None:
        found = site()
        if found is not None:
            sites.setdefault((id(self), name), found)
        register_parameter(self, name, param)

    def on_buffer(self: torch.nn.Module, name: str, tensor: Any, persistent: bool = True) -> None:
        found = site()
        if found is not None:
            sites.setdefault((id(self), name), found)
        register_buffer(self, name, tensor, persistent)

    module_class.register_parameter = on_parameter  # type: ignore[method-assign]
    module_class.register_buffer = on_buffer  # type: ignore[method-assign]
    try:
        yield sites
    finally:
        module_class.register_parameter = register_parameter  # type: ignore[method-assign]
        module_class.register_buffer = register_buffer  # type: ignore[method-assign]


def _site(checks: _Checks, model: torch.nn.Module, name: str,
          sites: dict[tuple[int, str], tuple[int, str]]) -> tuple[str, int | None]:
    """(method, line) where the plug-in's file created parameter or buffer `name` of `model`."""
    owner, _, leaf = name.rpartition(".")
    try:
        module = model.get_submodule(owner) if owner else model
    except AttributeError:
        return "build()", None
    found = sites.get((id(module), leaf))
    return (found[1], found[0]) if found is not None else ("build()", None)


def _batches(vocab: int, steps: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (2, 16), generator=gen) for _ in range(steps)]


def _loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(ids.shape[1]).expand(ids.shape)
    loss: torch.Tensor = model(input_ids=ids, position_ids=pos, labels=ids, use_cache=False).loss
    return loss


def _state_round_trip(checks: _Checks, arch: Any) -> None:
    """A few SGD steps, `state_dict()`, a fresh model (other seed) loaded from it: the same eval
    forward and the same next step, or the parameter or buffer that is not saved or not trained."""
    if not _is_deterministic(checks, arch):
        return
    where = _where(checks, arch)
    with _creation_sites(checks.file) as built_at:
        model = initialised(arch).train()
    at_build = dict(model.named_parameters())
    optimizer = torch.optim.SGD(list(at_build.values()), lr=STATE_LR)
    batches = _batches(arch.vocab_size, STATE_STEPS + 1)
    for step in range(STATE_STEPS):
        with _creation_sites(checks.file) as created_at, _seeded(step):
            loss = _loss(model, batches[step])
        created = [n for n, _ in model.named_parameters() if n not in at_build]
        if created:
            method, line = _site(checks, model, created[0], created_at)
            checks.fail(method, f"parameter '{created[0]}' is created inside forward{where}: the model build() returns "
                                "does not have it, so the optimizer (built before the first step) never updates it "
                                "(it stays at its initial value) and a checkpoint has it only after a first forward; "
                                "create it in __init__", key="state", line=line)
            return
        loss.backward()
        if step == 0:
            idle = [n for n, p in at_build.items() if p.requires_grad and p.grad is None]
            if idle:
                method, line = _site(checks, model, idle[0], built_at)
                more = f" ({len(idle)} such parameters: {idle[:4]})" if len(idle) > 1 else ""
                checks.fail(method, f"parameter '{idle[0]}' has no gradient after a training step{where}{more}: the "
                                    "loss does not depend on it (unused in forward, or used under no_grad / detach()), "
                                    "so it is never trained; use it, or do not create it", key="state", line=line)
                return
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    saved = copy.deepcopy(model.state_dict())
    fresh = initialised(arch, seed=1)
    missing, unexpected = fresh.load_state_dict(saved, strict=False)
    if missing or unexpected:
        checks.fail("build()", f"the state_dict() of a trained model does not load into a fresh one{where}: missing "
                               f"{list(missing)[:3]}, unexpected {list(unexpected)[:3]}", key="state")
        return
    ids, pos = packed_row(arch.vocab_size)
    model.eval(), fresh.eval()
    with torch.no_grad(), _seeded(0):
        before = model(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
    with torch.no_grad(), _seeded(0):
        after = fresh(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
    if not torch.equal(before, after):
        diff = float((before - after).abs().max())
        _unsaved(checks, model, fresh, built_at, f"a fresh model loaded from the state_dict() after {STATE_STEPS} "
                                                 f"training steps gives other logits (max |diff| {diff:.3g}){where}")
        return
    model.train(), fresh.train()
    for m in (model, fresh):
        with _seeded(STATE_STEPS):
            loss = _loss(m, batches[STATE_STEPS])
        loss.backward()
        torch.optim.SGD(m.parameters(), lr=STATE_LR).step()
    resumed = dict(fresh.named_parameters())
    for name, p in model.named_parameters():
        if not torch.equal(p.detach(), resumed[name].detach()):
            diff = float((p.detach() - resumed[name].detach()).abs().max())
            _unsaved(checks, model, fresh, built_at, f"resumed from its state_dict() after {STATE_STEPS} training steps, "
                                                     f"the next step updates '{name}' differently (max |diff| "
                                                     f"{diff:.3g}){where}")
            return


def _unsaved(checks: _Checks, model: torch.nn.Module, fresh: torch.nn.Module,
             built_at: dict[tuple[int, str], tuple[int, str]], what: str) -> None:
    """Fail the state round trip naming what a checkpoint lost: a buffer that differs, else the
    tensor attributes that do, else state outside the model."""
    saved = set(model.state_dict())
    theirs = dict(fresh.named_buffers())
    for name, buffer in model.named_buffers():
        other = theirs.get(name)
        if other is not None and torch.equal(buffer, other):
            continue
        method, line = _site(checks, model, name, built_at)
        kind = ("registered with persistent=False, so not in state_dict()" if name not in saved
                else "in state_dict() but not restored by load_state_dict()")
        checks.fail(method, f"buffer '{name}' ({kind}) holds state that training changed: {what}; every resume "
                            "starts it again from its initial value: register it with persistent=True (the default) "
                            "so that checkpoints keep it", key="state", line=line)
        return
    modules = dict(fresh.named_modules())
    changed = []
    for owner, module in model.named_modules():
        for attr, value in vars(module).items():
            other = getattr(modules.get(owner), attr, None)
            if isinstance(value, torch.Tensor) and not (isinstance(other, torch.Tensor) and torch.equal(value, other)):
                changed.append(f"{owner}.{attr}".lstrip("."))
    kept = f"in tensor attributes that differ, {changed[:4]}," if changed else "outside the model's parameters and buffers"
    checks.fail("build()", f"{what}, though every parameter and buffer was restored: state kept {kept} is lost on "
                           "every resume; keep it in a buffer (persistent) or recompute it", key="state")


# --------------------------------------------------------------------------- export


def _export(checks: _Checks, arch: Any) -> None:
    """When `export_note()` says transformers loads the export: the tiny model's export, written
    as the trainer writes it, is loaded by the class its config.json names with no missing or
    unexpected keys and the same logits (`trainer.hf_checkpoint.export_problem`)."""
    if not arch.export_note().loadable or not _is_deterministic(checks, arch):
        return
    from trainer.hf_checkpoint import export_problem, write_weights

    model = initialised(arch)
    with tempfile.TemporaryDirectory(prefix="contract-export-") as tmp:
        write_weights(model, arch, Path(tmp))
        arch.export(model, Path(tmp))
        found = export_problem(arch, Path(tmp), model)
    if found.problem:
        checks.fail("export()", f"export_note() says transformers loads the export (loadable: true), but on the tiny "
                                f"model{_where(checks, arch)}: {found.problem}; write the config.json of a class with "
                                "these weight names (a transformers variant registers its own model_type, see "
                                "models/llama_qknorm.py), or say loadable=False in export_note()", key="export")



# --------------------------------------------------------------------------- optimizers


def _round_trip_model() -> tuple[Any, torch.nn.Module]:
    import models

    arch = tiny(models.architectures()["nanogpt"])
    return arch, initialised(arch, seed=1).train()


def check_optimizer(config: type, file: str) -> list[ContractFailure]:
    """Build the optimizer over a tiny model, step it, and check that a copy resumed from the
    model's and the optimizer's `state_dict()` after step 3 takes steps 4..6 bitwise alike."""
    checks = _Checks(config, file)
    checks.run("build()", "build()", lambda: _round_trip(checks))
    return checks.failures


def _round_trip(checks: _Checks) -> None:
    from validation.spec import TrainSpec

    optimizer_config = checks.config()
    train = TrainSpec.model_validate({"optimizer": optimizer_config, "lr": 1e-2, "max_steps": ROUND_TRIP_STEPS[1]})
    arch, model = _round_trip_model()
    save_at, last = ROUND_TRIP_STEPS
    batches = _batches(arch.vocab_size, last)

    def build(m: torch.nn.Module) -> torch.optim.Optimizer:
        return optimizer_config.build([(n, p, arch.param_role(n, p)) for n, p in m.named_parameters()], train)

    def step(m: torch.nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        m(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    opt = build(model)
    saved: tuple[dict[str, Any], dict[str, Any]] | None = None
    after: dict[int, dict[str, torch.Tensor]] = {}
    for s in range(1, last + 1):
        step(model, opt, batches[s - 1])
        if s == save_at:
            saved = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
        if s > save_at:
            after[s] = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert saved is not None
    _, fresh = _round_trip_model()
    fresh.load_state_dict(saved[0])
    resumed = build(fresh)
    resumed.load_state_dict(saved[1])
    for s in range(save_at + 1, last + 1):
        step(fresh, resumed, batches[s - 1])
        for name, p in fresh.named_parameters():
            want = after[s][name]
            if not torch.equal(p.detach(), want):
                diff = float((p.detach() - want).abs().max())
                checks.fail("build()", f"state_dict() round trip: resumed after step {save_at}, step {s} updates "
                                       f"'{name}' differently (max |diff| {diff:.3g}): state kept outside the "
                                       "optimizer's state_dict() (or not restored by load_state_dict()) is lost "
                                       "on every resume")
                return


__all__ = ["ARCHITECTURE_CHECKS", "PackedComparison", "batch_dependence", "check_architecture", "check_optimizer",
           "first_leak", "initialised", "packed_comparison", "packed_difference", "packed_row", "rank0_share", "tiny",
           "tp_plan_hint", "tp_shape_problem", "variants"]


def tp_plan_hint(model: Any) -> str:
    """For a failure before the first step under tensor parallelism: the module the plan of
    `model`'s file forgets (or the line that reshapes to the global head count), from the forward
    on rank 0's share of a tiny model of the same configuration (its `smoke_overrides`, the
    experiment's switches kept); "" when the plan runs there."""
    file = f"models/{model.model_type}.py"
    try:
        small = type(model).model_validate({**model.model_dump(), **model.smoke_overrides(256, 32)})
        source = inspect.getsourcefile(type(model))
        failed = _tp_shape_failure(small, TP_DEGREE, source)
    except Exception:  # noqa: BLE001 - a hint, never a second failure
        return ""
    if failed is None:
        return ""
    if failed.heads is not None:
        line, function, _ = failed.heads
        return (f"{file}:{line} ({function}) reshapes to the global head count; under tp each rank holds "
                "num_heads / tp heads: reshape with -1 heads")
    return (f"tp_plan of {file}: split by it, {failed.where} meets a tensor of the wrong width; "
            f"linears the plan leaves whole: {failed.whole or 'none'}")
