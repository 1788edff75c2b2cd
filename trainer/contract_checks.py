"""The contract checks that build the model (`pipeline contract`, the PR check, the tests).

For an architecture, on tiny configurations of it (its own `smoke_overrides`, plus the
switches that change the counts): the model built on the meta device has the declared
parameters; torch's FLOP counter on fake tensors counts the declared FLOPs; every
tensor-parallel plan entry names a module of every block, and the forward runs with rank 0's
share of every split (one process, tp=2), so a projection the plan forgets fails naming the
module; and a packed row (three
documents back to back, `position_ids` restarting at 0) gives each document the logits it
gets alone, so no token attends across a document boundary. For an optimizer: its
`state_dict()` round trip resumes bitwise (a copy of the model and optimizer loaded
from the state dicts takes the same next steps), or the step and the tensor that differ.

Each failure is a `validation.contract.ContractFailure`: the plug-in file, the line of the
method, the method, what to change. Nothing here raises for a plug-in's own bug.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from validation.contract import ContractFailure

PACKED_DOCUMENTS = (5, 9, 18)
"""Lengths of the documents packed into the test row (32 tokens)."""
PACKED_ATOL = 1e-4
"""fp32 logits of a document packed vs alone agree to ~1e-6; attention across documents moves them by O(1)."""
ROUND_TRIP_STEPS = (3, 6)
"""The optimizer check saves after step 3 and compares steps 4..6."""


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


class _Checks:
    """Collects the failures of one plug-in file; a check that raises is a failure of its method."""

    def __init__(self, config: type, file: str):
        self.config, self.file = config, file
        self.failures: list[ContractFailure] = []

    def fail(self, method: str, message: str) -> None:
        if any(f.method == method for f in self.failures):
            return  # one line per method: the first configuration that shows the problem
        self.failures.append(ContractFailure(self.file, method_line(self.config, method.split("(")[0], self.file),
                                             method, message))

    def run(self, method: str, check: Callable[[], None]) -> None:
        try:
            check()
        except Exception as exc:  # noqa: BLE001 - a plug-in's bug is a failure line, not a traceback
            self.fail(method, f"raised {_first_line(exc)}")


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


ARCHITECTURE_CHECKS = ("parameters", "flops", "tp", "packed")


def check_architecture(config: type, file: str, only: tuple[str, ...] = ARCHITECTURE_CHECKS) -> list[ContractFailure]:
    """The model-building checks of architecture `config` (a `models.Architecture` subclass):
    `only` names which (meta parameter count, FLOPs, TP names, packed rows)."""
    checks = _Checks(config, file)
    try:
        archs = variants(config)
    except Exception as exc:  # noqa: BLE001
        checks.fail("smoke_overrides()", f"no tiny configuration validates: {_first_line(exc)}")
        return checks.failures
    runs = {"parameters": ("parameter_count()", _parameters), "flops": ("flops_per_token()", _flops),
            "tp": ("tp_plan", _tp_names), "packed": ("build()", _packed_rows)}
    for arch in archs:
        for name in only:
            method, check = runs[name]
            checks.run(method, lambda arch=arch, check=check: check(checks, arch))
    return checks.failures


def _switches(arch: Any, base: Any) -> str:
    """The fields where a variant differs from the first tiny config (`tie_word_embeddings=False`)."""
    diff = {k: v for k, v in arch.model_dump().items() if base.get(k) != v}
    return (" with " + ", ".join(f"{k}={v}" for k, v in diff.items())) if diff else ""


def _parameters(checks: _Checks, arch: Any) -> None:
    from trainer.measure import parameter_count_on_meta

    where = _switches(arch, tiny(checks.config).model_dump())
    built, declared = parameter_count_on_meta(arch), arch.parameter_count()
    if built != declared:
        checks.fail("parameter_count()", f"declares {declared:,} parameters, the model built on the meta device has "
                                         f"{built:,}{where}")
    elif arch.embedding_parameters() + arch.block_parameters() != declared:
        checks.fail("block_parameters()", f"blocks {arch.block_parameters():,} + the rest "
                                          f"{arch.embedding_parameters():,} != parameter_count() {declared:,}{where}")


def _flops(checks: _Checks, arch: Any) -> None:
    from trainer.measure import count_training_flops

    where = _switches(arch, tiny(checks.config).model_dump())
    for seq_len in (16, 32):
        counted, declared = count_training_flops(arch, seq_len, batch=2), arch.flops_per_token(seq_len)
        if abs(counted - declared) > 1e-9 * max(1.0, declared):
            checks.fail("flops_per_token()", f"declares {declared:,.0f} FLOPs per token at seq_len {seq_len}, torch's "
                                             f"counter on fake tensors counts {counted:,.0f}{where}")
            return


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
                                   f"{sorted(n for n in names if n)[:12]}")
            return
    for name, style in plan.items():
        if not hasattr(blocks[0].get_submodule(name), "weight"):
            checks.fail("tp_plan", f"'{name}' ({style}) has no weight: colwise/rowwise split a linear, replicate "
                                   "keeps a weight whole")
            return
    problem = tp_shape_problem(arch, TP_DEGREE)
    if problem:
        checks.fail("tp_plan", problem)


TP_DEGREE = 2
"""The degree the one-process tensor-parallel simulation splits by."""


def tp_shape_problem(arch: Any, tp: int) -> str | None:
    """Run the forward with every block's plan applied to one rank's share (`colwise`: the first
    1/tp of a linear's outputs, `rowwise`: of its inputs, `replicate`: whole), as rank 0 of a
    real tensor-parallel group holds it: a module the plan forgets meets a split neighbour with
    its whole width and the shapes disagree. Returns which module failed, and the linears the
    plan leaves whole, or None (also when `tp` does not divide this configuration)."""
    failed = _tp_shape_failure(arch, tp)
    if failed is None:
        return None
    where, error, whole = failed
    return (f"with tp={tp}, {where} fails: {error}; linears the plan leaves whole: {whole or 'none'} "
            "(a colwise output split by head meets one of full width)")


def _tp_shape_failure(arch: Any, tp: int) -> tuple[str, str, list[str]] | None:
    """(module that failed, the error's first line, linears outside the plan), or None."""
    plan = arch.tensor_parallel_plan()
    if not plan or arch.tp_problem(tp) is not None:
        return None
    model = initialised(arch)
    blocks = arch.blocks(model)
    for block in blocks:
        for name, style in plan.items():
            _shard_like_rank0(block.get_submodule(name), style, tp)
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
        return where, text[0] if text else type(exc).__name__, whole
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


def packed_row(vocab_size: int, lengths: tuple[int, ...] = PACKED_DOCUMENTS, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, position_ids) of one row of `lengths` documents back to back."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (1, sum(lengths)), generator=gen)
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    return ids, pos


def packed_difference(model: torch.nn.Module, vocab_size: int) -> tuple[float, int]:
    """Largest |logit| difference between a packed row and its documents run alone, and the
    (1-based) document where it is largest."""
    ids, pos = packed_row(vocab_size)
    worst, at, lo = 0.0, 0, 0
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0].float()
        for i, n in enumerate(PACKED_DOCUMENTS):
            alone = model(input_ids=ids[:, lo:lo + n], position_ids=pos[:, lo:lo + n],
                          use_cache=False).logits[0].float()
            diff = float((packed[lo:lo + n] - alone).abs().max())
            if diff > worst or diff != diff:
                worst, at = diff, i + 1
            lo += n
    return worst, at


def _packed_rows(checks: _Checks, arch: Any) -> None:
    worst, doc = packed_difference(initialised(arch), arch.vocab_size)
    if not worst <= PACKED_ATOL:
        lo = sum(PACKED_DOCUMENTS[:doc - 1])
        checks.fail("build()", f"forward(position_ids=...): a packed row's logits differ from its documents run alone "
                               f"by up to {worst:.3g} (document {doc} of {len(PACKED_DOCUMENTS)}, tokens {lo}.."
                               f"{lo + PACKED_DOCUMENTS[doc - 1] - 1}{_switches(arch, tiny(checks.config).model_dump())})"
                               ": tokens attend across the document boundary; position_ids restart at 0 for each "
                               "packed document, mask attention with them (see models/nanogpt.py)")


# --------------------------------------------------------------------------- optimizers


def _round_trip_model() -> tuple[Any, torch.nn.Module]:
    import models

    arch = tiny(models.architectures()["nanogpt"])
    return arch, initialised(arch, seed=1).train()


def _batches(vocab: int, steps: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (2, 16), generator=gen) for _ in range(steps)]


def check_optimizer(config: type, file: str) -> list[ContractFailure]:
    """Build the optimizer over a tiny model, step it, and check that a copy resumed from the
    model's and the optimizer's `state_dict()` after step 3 takes steps 4..6 bitwise alike."""
    checks = _Checks(config, file)
    checks.run("build()", lambda: _round_trip(checks))
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


__all__ = ["ARCHITECTURE_CHECKS", "check_architecture", "check_optimizer", "initialised", "packed_difference", "packed_row", "tiny",
           "variants"]


def tp_plan_hint(model: Any) -> str:
    """For a failure before the first step under tensor parallelism: the module the plan of
    `model`'s file forgets, from `tp_shape_problem` on a tiny model of the same configuration
    (its `smoke_overrides`, the experiment's switches kept); "" when the plan runs there."""
    try:
        small = type(model).model_validate({**model.model_dump(), **model.smoke_overrides(256, 32)})
        failed = _tp_shape_failure(small, TP_DEGREE)
    except Exception:  # noqa: BLE001 - a hint, never a second failure
        return ""
    if failed is None:
        return ""
    where, _, whole = failed
    return (f"tp_plan of models/{model.model_type}.py: split by it, {where} meets a tensor of the wrong width; "
            f"linears the plan leaves whole: {whole or 'none'}")
