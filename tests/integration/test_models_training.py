"""The shipped plug-ins train for real under the sharded layouts (issue 23, "done when"):
llama_qknorm (QK-norm + gated attention, a transformers subclass) and nanogpt (plain
PyTorch), with AdamW and with Muon, under FSDP2 (2 CPU ranks) and tensor parallelism (2),
SIGKILL of rank 0 between checkpoints, then a rerun that resumes bitwise; a Muon checkpoint
written by 2 ranks resumes on 1 process (DCP reshards its state). The exported directory
loads to the same logits, or says why it cannot.

Each case is one test of 3 two-rank launches of a tiny model (10 steps) whose runs every
check of the case reads: one test, not one per check, so the launches run once even where
the checks would land on different xdist workers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.infra.trainer_runs import data_dir, run_trainer, step_losses, train_here  # noqa: F401 - fixture

STEPS = 10
COMMON: dict[str, Any] = {"max_steps": STEPS, "micro_batch_size": 4, "eval_interval": 1000, "checkpoint_interval": 3,
                          "keep_last": 4, "grad_clip": 0.0, "warmup_steps": 2}
QKNORM = {"model_type": "llama_qknorm", "hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
          "intermediate_size": 64, "vocab_size": 384, "max_position_embeddings": 64, "tie_word_embeddings": False,
          "qk_norm": True, "attn_gate": True}
NANOGPT = {"model_type": "nanogpt", "hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64,
           "vocab_size": 384, "max_position_embeddings": 64, "tie_word_embeddings": False}
MUON = {"name": "muon", "lr": 0.02}
FSDP = {"dp": 2, "fsdp": True}
TP = {"dp": 1, "tp": 2}

# Each plug-in under one sharded layout, both with Muon (whose update gathers whole matrices:
# the layout-specific optimizer path) under FSDP2 and under TP. What the two cases dropped in
# issue 27 covered is covered elsewhere: AdamW under FSDP2 with kill -9 and a bitwise resume
# (tests/integration/test_launch_multinode_fsdp.py, static and Slurm, llama: AdamW does not
# depend on the architecture), TP resumed on one process (tests/integration/test_trainer_parallel.py); llama_qknorm's TP plan trained on 2 ranks (the gated copy's 2-process smoke,
# tests/integration/test_models_new_file_flow.py).
CASES = {
    "qknorm-fsdp-muon": (QKNORM, FSDP, MUON),
    "nanogpt-tp-muon": (NANOGPT, TP, MUON),
}


def _ok(code: int, run_dir: Path) -> None:
    logs = sorted(run_dir.glob("stdout-*.log"))
    text = logs[-1].read_text()[-4000:] if logs else (run_dir / "logs" / "rank0.log").read_text()[-4000:]
    assert code == 0, text


def _train(case: str) -> dict[str, Any]:
    model, parallel, optimizer = CASES[case]
    train = COMMON | ({"optimizer": optimizer} if optimizer else {})
    # TP ranks read the same rows: micro 4 on dp 1; FSDP dp 2: micro 2 per rank, the same global batch.
    if parallel is FSDP:
        train = train | {"micro_batch_size": 2}
    return {"model": model, "parallel": parallel, **train}


def _killed_and_resumed(case: str, tmp: Path, data_dir: Path) -> dict[str, Any]:  # noqa: F811
    """The case's three two-rank launches: an uninterrupted reference, a run SIGKILLed at step 7
    (after the step-6 checkpoint, before step 9's) and its rerun in the same directory."""
    code, ref = run_trainer(tmp, data_dir, "reference", ranks=2, **_train(case))
    _ok(code, ref)
    code, run_dir = run_trainer(tmp, data_dir, "killed", ranks=2, env={"TRAINER_FAULT_SIGKILL_AT_STEP": "7"},
                                **_train(case))
    assert code != 0 and not (run_dir / "result.json").exists()
    killed_at = max(step_losses(run_dir))
    code, _ = run_trainer(tmp, data_dir, "killed", ranks=2, **_train(case))
    _ok(code, run_dir)
    return {"case": case, "tmp": tmp, "reference": ref, "resumed": run_dir, "killed_at": killed_at}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sharded_case_resumes_bitwise_counts_its_parameters_and_exports_its_weights(
        case: str, tmp_path: Path, data_dir: Path) -> None:  # noqa: F811
    """One test per case, so that its three launches run once whichever worker gets it; each
    check below was its own test before and reads the same runs:

    - SIGKILL then rerun resumes bitwise (the rerun's losses equal the reference's);
    - the plan's parameter count is the trained model's;
    - the exported model has the trained weights;
    - qknorm-fsdp-muon: Muon state written by two ranks resumes on one process;
    - nanogpt-tp-muon: tensor parallelism matches one process.
    """
    runs = _killed_and_resumed(case, tmp_path, data_dir)
    _sigkill_then_rerun_resumes_bitwise(runs)
    _the_plans_parameter_count_is_the_trained_models(runs)
    _exported_model_has_the_trained_weights(runs)
    if case == "qknorm-fsdp-muon":  # one resharding case: Muon under FSDP
        _muon_state_written_by_two_ranks_resumes_on_one_process(runs, data_dir)
    if CASES[case][1] is TP:
        _tensor_parallel_matches_one_process(runs, data_dir)


def _sigkill_then_rerun_resumes_bitwise(killed_and_resumed: dict[str, Any]) -> None:
    ref, run_dir = killed_and_resumed["reference"], killed_and_resumed["resumed"]
    assert killed_and_resumed["killed_at"] == 7
    result = json.loads((run_dir / "result.json").read_text())
    assert result["resumed_from"].endswith("step_000006")
    assert result["layout"]["sharded"] and result["layout"]["params_on_rank0"] < result["n_params"]
    model, _, optimizer = CASES[killed_and_resumed["case"]]
    assert result["export"]["architecture"] == model["model_type"]
    assert result["export"]["optimizer"] == (optimizer or {"name": "adamw"})["name"]
    want, got = step_losses(ref), step_losses(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step, loss in want.items():
        assert got[step] == loss, f"{killed_and_resumed['case']} step {step}: {got[step]!r} != {loss!r}"


def _the_plans_parameter_count_is_the_trained_models(killed_and_resumed: dict[str, Any]) -> None:
    from validation.spec import model_spec

    model, _, _ = CASES[killed_and_resumed["case"]]
    result = json.loads((killed_and_resumed["reference"] / "result.json").read_text())
    assert result["n_params"] == model_spec(model).parameter_count()


def _exported_model_has_the_trained_weights(killed_and_resumed: dict[str, Any]) -> None:
    """The export is streamed from the sharded checkpoint; `models.load_exported` rebuilds the
    architecture from export.json and its logits equal a one-process resume of that checkpoint."""
    import torch

    from models import load_exported

    ref = killed_and_resumed["reference"]
    exported = load_exported(ref / "model")
    info = json.loads((ref / "model" / "export.json").read_text())
    assert info["model"]["model_type"] == CASES[killed_and_resumed["case"]][0]["model_type"]
    ids = torch.arange(24).unsqueeze(0) % 384
    with torch.no_grad():
        logits = exported(input_ids=ids, position_ids=torch.arange(24).unsqueeze(0), use_cache=False).logits
    assert torch.isfinite(logits).all() and logits.shape == (1, 24, 384)
    # The same weights as the final checkpoint's shards (a full, independent read of them).
    from trainer.checkpoint.sharded import export_safetensors

    full = ref / "full.safetensors"
    export_safetensors(ref / "checkpoints" / f"step_{STEPS:06d}", full)
    from safetensors.torch import load_file

    saved = load_file(str(full))
    for name, value in exported.state_dict().items():
        if name in saved:
            assert torch.equal(value, saved[name]), name


def _muon_state_written_by_two_ranks_resumes_on_one_process(
        killed_and_resumed: dict[str, Any], data_dir: Path) -> None:  # noqa: F811
    ref = killed_and_resumed["reference"]
    run_dir = killed_and_resumed["tmp"] / "two-to-one"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(ref / "checkpoints" / "step_000006", run_dir / "checkpoints" / "step_000006")
    train = _train("qknorm-fsdp-muon")
    train.pop("parallel")
    model = train.pop("model")
    code, _ = train_here(killed_and_resumed["tmp"], data_dir, "two-to-one", run_dir=run_dir, model=model, **train)
    _ok(code, run_dir)
    got, want = step_losses(run_dir), step_losses(ref)
    assert sorted(got) == list(range(7, STEPS + 1))
    for step in got:
        assert got[step] == pytest.approx(want[step], abs=2e-5), step


def _tensor_parallel_matches_one_process(killed_and_resumed: dict[str, Any], data_dir: Path) -> None:  # noqa: F811
    """TP=2 splits q/k/v (and the gate) by head, QK-norm's scales stay whole with their gradient
    summed over the TP group: the losses equal a one-process run within float noise."""
    case = killed_and_resumed["case"]
    train = _train(case)
    train.pop("parallel")
    model = train.pop("model")
    code, single = train_here(killed_and_resumed["tmp"], data_dir, "single", model=model, **train)
    _ok(code, single)
    want, got = step_losses(single), step_losses(killed_and_resumed["reference"])
    assert sorted(got) == sorted(want)
    # Muon's Newton-Schulz runs in bf16 (torch's own), which turns float-noise differences of
    # the sharded gradients into ~2e-5 relative after 10 steps; AdamW stays within 1e-4 absolute.
    tolerance = {"rel": 1e-4} if CASES[case][2] else {"abs": 1e-4}
    for step in want:
        assert got[step] == pytest.approx(want[step], **tolerance), (case, step)


def test_qknorm_export_is_never_a_silently_different_model(tmp_path: Path, data_dir: Path) -> None:  # noqa: F811
    """Reproduced on the old main: config.json said plain `llama`, from_pretrained dropped
    gate_proj and gave other logits. Now: plain transformers refuses the directory; with the
    architecture registered it loads to exactly the trained model's logits."""
    import torch

    code, run_dir = train_here(tmp_path, data_dir, "export", model=QKNORM, **(COMMON | {"max_steps": 3}))
    _ok(code, run_dir)
    out = run_dir / "model"
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama_qknorm"
    probe = ("from transformers import AutoModelForCausalLM\n"
             f"AutoModelForCausalLM.from_pretrained({str(out)!r})\n")
    refused = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "llama_qknorm" in refused.stderr
    from transformers import AutoModelForCausalLM

    from models import load_exported
    from models.llama_qknorm import transformers_classes

    transformers_classes()
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    ours = load_exported(out)
    ids = torch.arange(20).unsqueeze(0) % 384
    with torch.no_grad():
        a = hf(input_ids=ids, use_cache=False).logits
        b = ours(input_ids=ids, use_cache=False).logits
    assert torch.equal(a, b)
    assert any(name.endswith("self_attn.gate_proj.weight") for name, _ in hf.named_parameters())
