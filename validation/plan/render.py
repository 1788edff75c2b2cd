"""Rendering: the plan as a terminal table or a markdown section for the PR comment."""

from __future__ import annotations

from typing import TYPE_CHECKING

from validation.plan.common import _fmt_gb, format_bytes, format_count, format_duration

if TYPE_CHECKING:
    from validation.plan.assemble import Plan
    from validation.plan.layout import ParallelPlan

def _plan_rows(plan: Plan) -> list[tuple[str, str]]:
    p, m, c, r = plan.parallel, plan.memory, plan.compute, plan.resource
    if p.on_gpu:
        devices = f"{r.nodes} node(s) x {r.gpus_per_node} {r.gpu_type} ({_fmt_gb(r.gpu_memory_gb)} each)"
    else:
        devices = f"{r.nodes} node(s) x {r.cpu_processes} CPU process(es) ({_fmt_gb(r.gpu_memory_gb)} each)"
    time_note = "within" if c.fits_time_limit else "EXCEEDS"
    if plan.tier.required_approvals is None:
        approvals = "no approval can start it"
    else:
        approvals = f"{plan.tier.required_approvals} approval(s)"
    fits = "fits" if m.fits else "DOES NOT FIT"
    return [
        ("layout", f"{p.describe()} ({p.chosen_by})"),
        ("why", _why_layout(p)),
        ("world size", f"{p.world_size} = {devices}"),
        ("parameters", f"{format_count(plan.parameters)} total ({plan.parameters:,}), "
                       f"{format_count(plan.active_parameters or plan.parameters)} active per token"),
        ("batch", f"{c.global_batch} rows x {c.seq_len} tokens per step = micro batch {p.micro_batch_size} x "
                  f"{p.grad_accum_steps} accumulated x dp {p.dp} (the spec's, whatever the layout)"),
        ("checkpointing", _checkpointing(plan)),
        (
            "params/device",
            format_count(m.parameters_per_device)
            + (f" (split {m.sharding_degree} ways)" if m.sharding_degree > 1 else " (not split)"),
        ),
        ("weights", f"{format_bytes(m.weights_bytes)} ({m.state_bytes.weights} B/param)"),
        ("gradients", f"{format_bytes(m.gradients_bytes)} ({m.state_bytes.gradients} B/param)"),
        ("optimizer", f"{format_bytes(m.optimizer_bytes)} ({m.state_bytes.optimizer:g} B/param, "
                      f"{m.state_bytes.optimizer_name})"),
        ("activations", format_bytes(m.activations_bytes)),
        *([("autocast copies", f"{format_bytes(m.autocast_copy_bytes)} (16-bit copy of each matmul weight, "
                               "forward to backward)")] if m.autocast_copy_bytes else []),
        ("logits", format_bytes(m.logits_bytes)),
        ("ddp/fsdp", f"{format_bytes(m.wrapper_bytes)} ({_wrapper_what(plan.parallel)})"),
        ("overhead", format_bytes(m.overhead_bytes)),
        (
            "memory/device",
            f"{format_bytes(m.total_bytes)} of {format_bytes(m.capacity_bytes)} "
            f"({m.headroom_pct:.0f}% free, {fits}; peak in the {_PEAK_PHASE[m.peak_phase]}: not every line above "
            "is alive at once)",
        ),
        (
            "tokens",
            f"{format_count(c.tokens)} ({c.steps:,} steps x {c.global_batch} rows x {c.seq_len} tokens)",
        ),
        (
            "FLOPs",
            f"{c.total_flops:.3g} per run (6NT {c.model_flops:.3g} with N = {format_count(c.matmul_parameters)} "
            f"active matmul parameters + attention {c.attention_flops:.3g})",
        ),
        ("peak", f"{c.peak_tflops_per_device:g} TFLOPS/device ({c.peak_source}) at MFU {c.assumed_mfu:g} "
                 f"({c.mfu_source}; of active FLOPs)"),
        *([("runs", f"{plan.cost.describe()}; baseline: {plan.cost.baseline_note}")] if plan.cost else []),
        ("GPU-hours", _gpu_hours(plan)),
        (
            "wall time",
            f"{format_duration(c.wall_seconds)} ({time_note} the {r.time_limit_minutes} min limit)"
            + (f"; pipeline bubble x{c.pipeline_bubble:.3g} ({1 - 1 / c.pipeline_bubble:.0%} of each step idle)"
               if c.pipeline_bubble > 1 else ""),
        ),
        ("tier", f"{plan.tier.name}: {approvals} -- {plan.tier.reason}"),
        ("verdict", _seeds_note(plan.seeds)),
        *([("downstream", plan.downstream)] if plan.downstream else []),
    ]


_PEAK_PHASE = {"loss": "loss's backward", "last_block": "last block's backward (every activation still saved)",
               "backward": "blocks' backward", "optimizer": "optimizer step"}


def _checkpointing(plan: Plan) -> str:
    p, m = plan.parallel, plan.memory
    if p.activation_checkpointing == "none":
        return "none"
    per_stage = m.checkpointed_layers
    return (f"{p.activation_checkpointing}: {per_stage} block(s) per stage keep only their input and "
            "recompute in the backward pass")


def _gpu_hours(plan: Plan) -> str:
    c, r = plan.compute, plan.resource
    if not c.on_gpu:
        return "0 (CPU)"
    total = plan.cost.gpu_hours if plan.cost is not None else c.gpu_hours
    return f"{total:.2f} for every run ({c.gpu_hours:.2f} per run; budget {r.max_gpu_hours:g})"


def _seeds_note(seeds: int) -> str:
    """What `hypothesis.seeds` paired seeds can decide (reports.verdict: a paired t-test needs 2)."""
    if seeds == 1:
        return ("1 seed: cannot decide the hypothesis (the verdict will be inconclusive; "
                "it needs 2 paired seeds, 3 or more for power)")
    if seeds == 2:
        return "2 paired seeds: a test, with little power (3 or more advised)"
    return f"{seeds} paired seeds"


def _why_layout(p: ParallelPlan) -> str:
    """One line: why this layout (the cheaper ones tried first and what they needed)."""
    if p.chosen_by == "explicit":
        return "set in the spec (parallel:); verified to fit"
    if not p.rejected:
        if p.dp == 1 and p.tp == 1 and p.pp == 1:
            return "one process: nothing to split"
        return "fits replicated: plain data parallelism is the cheapest layout"
    tried = "; ".join(p.rejected)
    capacity = format_bytes(p.memory.capacity_bytes)
    return f"the first layout that fits {capacity} per device; cheaper ones need more ({tried})"


def _wrapper_what(p: ParallelPlan) -> str:
    if p.dp == 1:
        return "one replica: nothing to synchronise"
    if p.fsdp:
        return "largest group unsharded + next layer prefetched"
    return "DDP gradient buckets"


def render_plan_text(plan: Plan, *, title: str | None = None, warnings: bool = True) -> str:
    """A compact two-column table for the terminal. `pipeline plan` prints it below the decision
    (`validation.plan.decision`) under its own `title`, the warnings already said above it."""
    rows = _plan_rows(plan)
    width = max(len(k) for k, _ in rows)
    lines = [title or f"plan: {plan.experiment} (spec {plan.spec_hash})"]
    lines += [f"  {key.ljust(width)}  {value}" for key, value in rows]
    if warnings:
        lines += [f"  warning: {w}" for w in plan.warnings]
    return "\n".join(lines) + "\n"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def render_plan_markdown(plan: Plan) -> str:
    """The plan as a markdown section for the sticky PR comment."""
    lines = [f"#### Plan: `{plan.experiment}`", "", "| | |", "|---|---|"]
    lines += [f"| {key} | {_md_escape(value)} |" for key, value in _plan_rows(plan)]
    if plan.warnings:
        lines.append("")
        lines += [f"- :warning: {w}" for w in plan.warnings]
    return "\n".join(lines) + "\n"
