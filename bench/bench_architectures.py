"""Plan vs measured, per shipped architecture: parameters, FLOPs per token, activation memory.

For every architecture under models/ at one bench size (hidden 256, 4 layers, 8 heads,
vocab 4096, seq 256, micro-batch 4) this measures, in one run:
  - parameters of the model built on the meta device vs `parameter_count()` (what the plan uses);
  - training FLOPs per token counted by torch's FlopCounterMode on fake tensors (with the guard
    against ops without a formula) vs `flops_per_token()`;
  - bytes each block saves for backward (real CPU forward, fp32 and bf16 autocast) vs
    `activation_bytes_per_layer()`, the plan's activation term (goal: within +-25 %).
Writes bench/results/architectures.json and appends a table to bench/RESULTS.md.

    .venv/bin/python bench/bench_architectures.py
"""

from __future__ import annotations

import platform
import time
from typing import Any

import torch
from scaffold import append_results_md, cpu_model, utc_stamp, write_results_json

import models
from trainer.measure import count_training_flops, parameter_count_on_meta, saved_activation_bytes

SEQ, MICRO = 256, 4
SIZE = {"hidden_size": 256, "num_layers": 4, "num_heads": 8, "vocab_size": 4096, "max_position_embeddings": 512}
EXTRA: dict[str, dict[str, Any]] = {
    "llama": {"num_kv_heads": 4}, "qwen2": {"num_kv_heads": 4}, "mistral": {"num_kv_heads": 4},
    "llama_qknorm": {"num_kv_heads": 4, "qk_norm": True, "attn_gate": True}, "gpt2": {}, "nanogpt": {},
}


def machine() -> dict[str, Any]:
    return {"cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version()}


def measure(model_type: str) -> dict[str, Any]:
    config = models.architectures()[model_type]
    arch = config.model_validate({"model_type": model_type, **SIZE, **EXTRA.get(model_type, {})})
    t0 = time.perf_counter()
    row: dict[str, Any] = {"architecture": model_type, "plan_parameters": arch.parameter_count(),
                           "built_parameters": parameter_count_on_meta(arch),
                           "plan_flops_per_token": arch.flops_per_token(SEQ),
                           "counted_flops_per_token": count_training_flops(arch, SEQ, batch=1)}
    from validation.plan import ACTIVATION_ELEMENT_BYTES

    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        element = ACTIVATION_ELEMENT_BYTES[name]
        saved = saved_activation_bytes(arch, SEQ, MICRO, dtype=dtype).mean
        row[f"plan_activation_mib_{name}"] = round(arch.activation_bytes_per_layer(SEQ, MICRO, element) / 2**20, 2)
        row[f"saved_activation_mib_{name}"] = round(saved / 2**20, 2)
        row[f"activation_ratio_{name}"] = round(arch.activation_bytes_per_layer(SEQ, MICRO, element) / saved, 3)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def main() -> None:
    rows = [measure(name) for name in sorted(models.architectures())]
    out = {"when": utc_stamp(), "machine": machine(), "size": SIZE | {"seq_len": SEQ, "micro_batch": MICRO},
           "rows": rows}
    write_results_json("architectures", out, indent=2)
    lines = [f"\n## Architectures: plan vs measured (bench/bench_architectures.py) — {out['when']}\n",
             f"Machine: {out['machine']['cpu']}, {out['machine']['threads']} threads, torch {out['machine']['torch']}. "
             f"Size: hidden 256, 4 layers, 8 heads, vocab 4096, seq {SEQ}, micro-batch {MICRO}. Parameters on the meta "
             "device; FLOPs by FlopCounterMode on fake tensors (forward + backward, per token); activations: bytes "
             "one block saves for backward (real CPU forward, distinct storages), per block.\n",
             "| architecture | params plan | params built | FLOPs/token plan | FLOPs/token counted | act. fp32 plan / saved MiB | ratio | act. bf16 plan / saved MiB | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['architecture']} | {r['plan_parameters']:,} | {r['built_parameters']:,} | "
                     f"{r['plan_flops_per_token']:,.0f} | {r['counted_flops_per_token']:,.0f} | "
                     f"{r['plan_activation_mib_fp32']} / {r['saved_activation_mib_fp32']} | {r['activation_ratio_fp32']} | "
                     f"{r['plan_activation_mib_bf16']} / {r['saved_activation_mib_bf16']} | {r['activation_ratio_bf16']} |")
    append_results_md("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
