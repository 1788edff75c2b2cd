"""Downstream evaluation through the lm-eval `LM` adapter (trainer/lm_eval_scoring.py), offline.

Both kinds of architecture are scored from an exported directory, as the trainer does on
rank 0: a plain-PyTorch one (nanogpt) and a transformers one (llama). Local task YAMLs with
`dataset_path: json` and a few generated examples; no hub is reached.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lm_eval")

from models import EXPORT_FILE, architectures  # noqa: E402
from tests.infra.lm_eval_tasks import LINES, TASK, choice_task  # noqa: E402
from trainer.lm_eval_scoring import evaluate_export, make_lm  # noqa: E402
from validation.eval_tasks import EvalSpec  # noqa: E402

GEN_TASK = """\
task: tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: tiny_gen.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{prompt}}"
doc_to_target: "{{target}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 6
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def _tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(LINES * 4, trainer)
    tok.save(str(path))


def _export(out: Path, model_type: str) -> Path:
    """An exported directory as the trainer writes it (model.safetensors, export.json, tokenizer)."""
    from safetensors.torch import save_file

    cls = architectures()[model_type]
    fields = {"model_type": model_type, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "vocab_size": 320,
              "max_position_embeddings": 64, "intermediate_size": 64, "tie_word_embeddings": False}
    if model_type in ("llama", "llama_qknorm"):
        fields["num_kv_heads"] = 2
    if model_type == "llama_qknorm":
        fields |= {"qk_norm": True, "attn_gate": True}
    arch = cls.model_validate(fields)
    torch.manual_seed(0)
    model = arch.build()
    out.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    note = arch.export(model, out)
    (out / EXPORT_FILE).write_text(json.dumps({"model": arch.model_dump(mode="json"), "export": note.model_dump()}))
    _tokenizer(out / "tokenizer.json")
    return out


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    choice_task(tmp_path / "data" / "tasks")
    return tmp_path


@pytest.mark.parametrize("model_type", ["nanogpt", "llama", "llama_qknorm"])
def test_every_architecture_scores_a_task_and_the_same_export_gives_the_same_numbers(repo: Path, model_type: str):
    model_dir = _export(repo / "model", model_type)
    spec = EvalSpec.model_validate({"tasks": [{"path": "data/tasks/tiny_choice.yaml", "limit": 10}]})
    first, summary = evaluate_export(model_dir, spec, repo, repo / "out1")
    again, _ = evaluate_export(model_dir, spec, repo, repo / "out2")
    assert "error" not in summary["tasks"]["tiny_choice"], summary
    assert first == again  # deterministic: bitwise the same metrics
    assert first["eval/task/tiny_choice/n"] == 10
    assert 0.0 <= first["eval/task/tiny_choice/acc"] <= 1.0
    assert math.isfinite(first["eval/task/tiny_choice/acc_stderr"])
    assert {"eval/task/tiny_choice/acc_norm", "eval/task/tiny_choice/acc_norm_stderr"} <= set(first)
    samples = (repo / "out1" / "samples_tiny_choice.jsonl").read_text().splitlines()
    assert len(samples) == 10 and (repo / "out1" / "samples_tiny_choice.jsonl").read_bytes() == (
        repo / "out2" / "samples_tiny_choice.jsonl").read_bytes()
    assert json.loads(samples[0])["acc"] in (0.0, 1.0)
    saved = json.loads((repo / "out1" / "results.json").read_text())
    assert saved["metrics"] == first and saved["strategy"] == "rank 0, exported model"


def test_loglikelihood_in_a_batch_equals_the_request_alone_and_the_model_itself(repo: Path):
    from tokenizers import Tokenizer

    from models import load_exported

    model_dir = _export(repo / "model", "nanogpt")
    model, tok = load_exported(model_dir), Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    lm = make_lm(model, tok, max_length=64, batch_size=4)

    class Req:
        def __init__(self, *args: object):
            self.args = args

    reqs = [Req(LINES[i], "\n" + LINES[i + 1]) for i in range(6)]
    batched = lm.loglikelihood(reqs)
    alone = [lm.loglikelihood([r])[0] for r in reqs]
    for (a, ga), (b, gb) in zip(batched, alone, strict=True):
        assert a == pytest.approx(b, abs=1e-5) and ga == gb
    ctx = tok.encode(LINES[0], add_special_tokens=False).ids
    whole = tok.encode(LINES[0] + "\n" + LINES[1], add_special_tokens=False).ids
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([whole])).logits.float(), -1)[0]
    direct = sum(float(logp[i - 1, whole[i]]) for i in range(len(ctx), len(whole)))
    assert batched[0][0] == pytest.approx(direct, abs=1e-5)


def test_greedy_generation_task_runs_and_repeats(repo: Path):
    root = repo / "data" / "tasks"
    with open(root / "tiny_gen.jsonl", "w") as fh:
        for i in range(4):
            fh.write(json.dumps({"prompt": LINES[i], "target": LINES[i + 1]}) + "\n")
    (root / "tiny_gen.yaml").write_text(GEN_TASK)
    model_dir = _export(repo / "model", "llama")
    spec = EvalSpec.model_validate({"tasks": [{"path": "data/tasks/tiny_gen.yaml", "limit": 4}],
                                    "max_gen_tokens": 6})
    first, summary = evaluate_export(model_dir, spec, repo, repo / "o1")
    again, _ = evaluate_export(model_dir, spec, repo, repo / "o2")
    assert "error" not in summary["tasks"]["tiny_gen"], summary
    assert first == again and first["eval/task/tiny_gen/n"] == 4
    assert (repo / "o1" / "samples_tiny_gen.jsonl").read_bytes() == (repo / "o2" / "samples_tiny_gen.jsonl").read_bytes()


def test_a_task_that_errors_mid_run_is_recorded_and_the_others_still_score(repo: Path):
    root = repo / "data" / "tasks"
    (root / "utils.py").write_text("def process_docs(dataset):\n    raise RuntimeError('broken hook')\n")
    choice_task(root, "broken", extra="process_docs: !function utils.process_docs\n")
    (root / "missing.yaml").write_text(TASK.format(name="missing", extra=""))
    model_dir = _export(repo / "model", "nanogpt")
    spec = EvalSpec.model_validate({"tasks": [{"path": "data/tasks/broken.yaml", "limit": 4},
                                              {"path": "data/tasks/missing.yaml", "limit": 4},
                                              {"path": "data/tasks/tiny_choice.yaml", "limit": 4}]})
    metrics, summary = evaluate_export(model_dir, spec, repo, repo / "out")
    assert "broken hook" in summary["tasks"]["broken"]["error"]
    assert "data file missing.jsonl does not exist" in summary["tasks"]["missing"]["error"]
    assert metrics["eval/task/tiny_choice/n"] == 4
    assert not any(k.startswith(("eval/task/broken/", "eval/task/missing/")) for k in metrics)


def test_time_budget_stops_the_evaluation(repo: Path):
    model_dir = _export(repo / "model", "nanogpt")
    spec = EvalSpec.model_validate({"tasks": [{"path": "data/tasks/tiny_choice.yaml", "limit": 4}],
                                    "time_budget_s": 1e-9})
    metrics, summary = evaluate_export(model_dir, spec, repo, repo / "out")
    assert metrics == {} and "time_budget_s" in summary["tasks"]["tiny_choice"]["error"]
