"""Downstream evaluation with lm-evaluation-harness, over this project's own models.

`ProjectLM` is an lm-eval `TemplateLM` over any architecture under models/: it needs only the
contract every model keeps (forward takes `input_ids` and `position_ids`, returns `.logits`)
and the run's `tokenizer.json`, so a plain-PyTorch model (models/nanogpt.py) is scored exactly
like a transformers one. It implements log-likelihood (multiple choice), rolling log-likelihood
(perplexity tasks) and greedy generation (no sampling, no KV cache: a full forward per token).
Requests are encoded by lm-eval's own code and the prefix token comes from the tokenizer, so
the numbers equal lm-eval's `HFLM` on the same export (docs/downstream.md lists the cases).
Importing this module registers it in lm-eval as `gitops-train` (`pretrained=RUN/model`).

Strategy under FSDP / TP: the evaluation runs **once, on rank 0, from the exported model**
(`RUN/model/`, rebuilt with `models.load_exported`), after export; the other ranks wait at
the final barrier. A sharded model is therefore never scored through collectives, the numbers
do not depend on the layout that trained it, and the same export scored again gives the same
numbers (requests are batched in a fixed order, greedy decoding, seeds fixed).

Bounded: each task scores at most its `limit` examples; the whole evaluation stops after
`eval.time_budget_s` (a task still running then fails with a clear reason). A failing task
never fails the run: its error is recorded in `RUN/downstream/results.json` and the training
result is kept. The per-example records are uploaded as the MLflow run's `downstream/`
artifacts (`upload_samples`, best effort).

Trust: a task YAML may run Python (`!function`); what this module loads is PR code and runs in
the training job only, never in a privileged one.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

if TYPE_CHECKING:
    import torch

    from validation.eval_tasks import EvalSpec, EvalTask

log = logging.getLogger(__name__)
LM_NAME = "gitops-train"
"""`ProjectLM`'s name in lm-eval's model registry (registered when this module is imported)."""
RESULTS_DIR = "downstream"
"""RUN/downstream/: results.json and samples_<task>.jsonl (one line per scored example)."""


NOT_METRICS = frozenset({"alias", "sample_len", "samples"})
"""Keys of an lm-eval result row that are not metrics (`n` is reported from its sample counts)."""


class TaskFailed(RuntimeError):
    """A downstream task could not be scored (bad task, missing data, error mid-run, over budget)."""


class BudgetExceeded(TaskFailed):
    pass


class ProjectLM(TemplateLM):  # type: ignore[misc]
    """lm-eval's `TemplateLM` over `model` (any architecture of models/) and a
    `tokenizers.Tokenizer`: lm-eval's own request encoding (`_encode_pair`, empty contexts
    conditioned on `prefix_token_id`), this module's batched scoring. Registered in lm-eval as
    `gitops-train`: `simple_evaluate(model="gitops-train", model_args="pretrained=RUN/model")`
    loads an export of any architecture with `models.load_exported`."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, max_length: int, batch_size: int = 16,
                 max_gen_tokens: int = 64, deadline: float | None = None,
                 special: dict[str, int | None] | None = None) -> None:
        super().__init__()
        self.model, self.tok = model, tokenizer
        self.max_length, self.batch_size, self.max_gen_tokens = max_length, batch_size, max_gen_tokens
        self.deadline = deadline
        self.device_ = next(model.parameters()).device
        if special is None:
            from models._export import tokenizer_special_ids

            special = tokenizer_special_ids(json.loads(tokenizer.to_str()))
        self.special = special

    @classmethod
    def from_export(cls, directory: str | Path, batch_size: int = 16, max_gen_tokens: int = 64,
                    deadline: float | None = None, device: str | None = None) -> ProjectLM:
        """The LM of an exported directory (RUN/model/), whatever its architecture."""
        from tokenizers import Tokenizer

        from models import EXPORT_FILE, load_exported
        from models._export import special_token_ids

        directory = Path(directory)
        model = load_exported(directory)
        if device:
            model = model.to(device)
        fields = json.loads((directory / EXPORT_FILE).read_text())["model"]
        return cls(model, Tokenizer.from_file(str(directory / "tokenizer.json")),
                   max_length=int(fields.get("max_position_embeddings", 2048)), batch_size=batch_size,
                   max_gen_tokens=max_gen_tokens, deadline=deadline, special=special_token_ids(directory))

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None) -> ProjectLM:
        """`model_args` {"pretrained": DIR} (lm-eval's own name for the model directory)."""
        args = dict(arg_dict) | {k: v for k, v in (additional_config or {}).items() if v is not None}
        batch = args.get("batch_size", 16)
        return cls.from_export(args["pretrained"], batch_size=int(batch) if str(batch).isdigit() else 16,
                               max_gen_tokens=int(args.get("max_gen_toks", 64)), device=args.get("device"))

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict[str, Any] | None = None) -> ProjectLM:
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # -- tokens (lm-eval's HFLM conventions)
    @property
    def eot_token_id(self) -> int | None:
        return self.special.get("eos_token_id")

    @property
    def prefix_token_id(self) -> int | None:
        """What an empty context conditions on: BOS, else end of text (HFLM's rule)."""
        bos = self.special.get("bos_token_id")
        return bos if bos is not None else self.eot_token_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """The tokenizer's own encoding (its post-processor decides what `add_special_tokens`
        adds; the project's tokenizers add nothing), as `HFLM.tok_encode`."""
        if add_special_tokens is None:
            prefix = self.prefix_token_id
            text = self.tok.decode([prefix], skip_special_tokens=False) if prefix is not None else ""
            add_special_tokens = not (text and string.startswith(text))
        return list(self.tok.encode(string, add_special_tokens=add_special_tokens).ids)

    # -- scoring
    def _check_time(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise BudgetExceeded("the downstream evaluation ran past eval.time_budget_s")

    def _logprobs(self, rows: list[list[int]]) -> torch.Tensor:
        """log-softmax of the logits of right-padded rows [batch, len, vocab] (float32)."""
        import torch

        width = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        # One document per row (positions from 0); padding follows the real tokens, so causal
        # attention keeps it out of every scored position.
        pos = torch.arange(width).expand(len(rows), width)
        with torch.no_grad():
            out = self.model(input_ids=ids.to(self.device_), position_ids=pos.to(self.device_), use_cache=False)
        return torch.log_softmax(out.logits.float(), dim=-1).cpu()

    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum log p(continuation | context), greedy) for token pairs, batched longest first.
        An empty continuation scores (0.0, True)."""
        import torch

        rows = []
        for ctx, cont in pairs:
            whole = (ctx + cont)[-(self.max_length + 1):]  # keep the continuation, cut the context's left
            rows.append((whole[:-1], min(len(cont), len(whole) - 1), whole))
        order = sorted((i for i in range(len(rows)) if rows[i][1] > 0), key=lambda i: (-len(rows[i][0]), i))
        results: list[tuple[float, bool]] = [(0.0, True)] * len(rows)
        for start in range(0, len(order), self.batch_size):
            self._check_time()
            chunk = order[start:start + self.batch_size]
            logp = self._logprobs([rows[i][0] for i in chunk])
            for j, i in enumerate(chunk):
                inp, n_cont, whole = rows[i]
                tgt = torch.tensor(whole[-n_cont:], dtype=torch.long)
                span = logp[j, len(inp) - n_cont:len(inp)]
                results[i] = (float(span.gather(1, tgt[:, None]).sum()), bool((span.argmax(-1) == tgt).all()))
        return results

    def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False,
                              **kwargs: Any) -> list[tuple[float, bool]]:
        return self._score([(list(ctx), list(cont)) for _, ctx, cont in requests])

    # -- the LM interface
    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """lm-eval's own (`TemplateLM.loglikelihood`); a tokenizer without any end-of-text
        token has no prefix: an empty context then conditions on the continuation's first token."""
        if self.prefix_token_id is not None:
            return list(super().loglikelihood(requests, disable_tqdm=True))
        pairs = []
        for req in requests:
            context, continuation = req.args
            if context:
                pairs.append(self._encode_pair(context, continuation))
            else:
                cont = self.tok_encode(continuation, add_special_tokens=False)
                pairs.append((cont[:1], cont[1:]))
        return self._score(pairs)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """HFLM's windows: the first token conditioned on `prefix_token_id`."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        out = []
        for req in requests:
            (text,) = req.args
            tokens, prefix = self.tok_encode(text), self.prefix_token_id
            if prefix is None:  # nothing to condition the first token on: it is not scored
                tokens, prefix = tokens[1:], (tokens[0] if tokens else 0)
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=tokens, prefix_token=prefix, max_seq_len=self.max_length, context_len=1)]
            out.append(sum(s for s, _ in self._score([(list(c), list(t)) for c, t in windows])))
        return out

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy, one full forward per token; stops at a stop string or at end of text (HFLM's
        stop sequences include the end-of-text token too)."""
        out = []
        for req in requests:
            context, kwargs = req.args
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            limit = min(int(kwargs.get("max_gen_toks", self.max_gen_tokens)), self.max_gen_tokens)
            start = self.prefix_token_id
            ids = self.tok_encode(context) or ([start] if start is not None else [0])
            made: list[int] = []
            text = ""
            for _ in range(limit):
                self._check_time()
                logp = self._logprobs([(ids + made)[-self.max_length:]])
                token = int(logp[0, -1].argmax())  # greedy: the same text every time
                if token == self.eot_token_id:
                    break
                made.append(token)
                text = self.tok.decode(made)
                if any(u in text for u in until):
                    break
            for u in until:
                text = text.split(u)[0]
            out.append(text)
        return out


register_model(LM_NAME)(ProjectLM)


def make_lm(model: torch.nn.Module, tokenizer: Any, max_length: int, batch_size: int = 16,
            max_gen_tokens: int = 64, deadline: float | None = None,
            special: dict[str, int | None] | None = None) -> ProjectLM:
    """A `ProjectLM` over `model` and a `tokenizers.Tokenizer` (special tokens read from it
    unless given)."""
    return ProjectLM(model, tokenizer, max_length, batch_size=batch_size, max_gen_tokens=max_gen_tokens,
                     deadline=deadline, special=special)


def _task_config(task: EvalTask, repo_root: Path) -> Any:
    """A task lm-eval knows by name, or the config of a local task file with its data files made
    absolute (relative to the file), so no run depends on the working directory."""
    if task.path is None:
        return task.name
    from lm_eval.tasks._yaml_loader import load_yaml  # resolves `!function` relative to the file

    file = (Path(repo_root) / task.path).resolve()
    if not file.is_file():
        raise TaskFailed(f"no task file {task.path}")
    config = load_yaml(file)
    kwargs = dict(config.get("dataset_kwargs") or {})
    files = kwargs.get("data_files")

    def absolute(ref: str) -> str:
        found = file.parent / ref
        if not found.is_file():
            raise TaskFailed(f"{task.path}: its data file {ref} does not exist (for the demo task: pipeline data demo)")
        return str(found)

    if isinstance(files, str):
        kwargs["data_files"] = absolute(files)
    elif isinstance(files, list):
        kwargs["data_files"] = [absolute(f) for f in files]
    elif isinstance(files, dict):
        kwargs["data_files"] = {k: absolute(v) if isinstance(v, str) else [absolute(f) for f in v]
                                for k, v in files.items()}
    config["dataset_kwargs"] = kwargs
    if task.name:
        config["task"] = task.name
    return config


def _clean(value: Any) -> Any:
    """JSON-safe per-example records (lm-eval keeps tuples, numpy numbers, nan)."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str | int | bool) or value is None:
        return value
    if hasattr(value, "item"):
        return _clean(value.item())
    return str(value)


def evaluate_tasks(lm: Any, spec: EvalSpec, repo_root: Path, out_dir: Path, seed: int = 1234,
                   deadline: float | None = None) -> tuple[dict[str, float], dict[str, Any]]:
    """Score every task of `spec` with `lm`; (metrics, results). Metrics are
    `eval/task/<task>/<metric>` plus `<metric>_stderr` and `n`. A task that fails is recorded in
    results["tasks"][task]["error"] and the others still run; per-example records go to
    `out_dir/samples_<task>.jsonl`, the summary to `out_dir/results.json`."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from validation.eval_tasks import task_name

    out_dir.mkdir(parents=True, exist_ok=True)
    metrics: dict[str, float] = {}
    summary: dict[str, Any] = {"tasks": {}, "strategy": "rank 0, exported model", "seed": seed}
    # Indexing lm-eval's own task folder takes seconds: only when a task is named, not a file.
    manager = TaskManager(include_defaults=any(t.path is None for t in spec.tasks))
    for task in spec.tasks:
        name = task_name(task, repo_root) or str(task.path)
        started = time.monotonic()
        entry: dict[str, Any] = {"limit": task.limit, "num_fewshot": task.num_fewshot, "path": task.path}
        try:
            if deadline is not None and time.monotonic() > deadline:
                raise BudgetExceeded("the downstream evaluation ran past eval.time_budget_s")
            config = _task_config(task, repo_root)
            result = lm_eval.simple_evaluate(
                model=lm, tasks=[config], num_fewshot=task.num_fewshot, limit=task.limit, task_manager=manager,
                log_samples=True, bootstrap_iters=1000, random_seed=seed, numpy_random_seed=seed,
                torch_random_seed=seed, fewshot_random_seed=seed)
            if result is None or name not in result.get("results", {}):
                raise TaskFailed(f"lm-eval returned no results for task '{name}'")
            row = result["results"][name]
            n = int(result.get("n-samples", {}).get(name, {}).get("effective", task.limit))
            values: dict[str, float] = {}
            for key, value in row.items():
                metric, _, flt = key.partition(",")
                if (flt not in ("none", "") or metric in NOT_METRICS or not isinstance(value, int | float)
                        or isinstance(value, bool)):
                    continue
                values[metric] = float(value)
            for metric, value in values.items():
                metrics[f"eval/task/{name}/{metric}"] = value
            metrics[f"eval/task/{name}/n"] = float(n)
            entry |= {"metrics": values, "n": n, "higher_is_better": _clean(result.get("higher_is_better", {})
                                                                            .get(name, {}))}
            with open(out_dir / f"samples_{name}.jsonl", "w", encoding="utf-8") as fh:
                for sample in result.get("samples", {}).get(name, []):
                    record = {k: sample.get(k) for k in ("doc_id", "target", "filtered_resps", "doc")}
                    record |= {k: sample[k] for k in values if k in sample}
                    fh.write(json.dumps(_clean(record), sort_keys=True) + "\n")
        except Exception as exc:  # any task error, including lm-eval's own: keep the run's result
            log.error("downstream task %s failed: %s: %s", name, type(exc).__name__, exc)
            entry["error"] = f"{type(exc).__name__}: {exc}"
        entry["seconds"] = round(time.monotonic() - started, 3)
        summary["tasks"][name] = entry
    summary["metrics"] = metrics
    (out_dir / "results.json").write_text(json.dumps(_clean(summary), indent=2, sort_keys=True), encoding="utf-8")
    return metrics, summary


def evaluate_export(model_dir: Path, spec: EvalSpec, repo_root: Path, out_dir: Path,
                    seed: int = 1234) -> tuple[dict[str, float], dict[str, Any]]:
    """Score the exported model in `model_dir` (RUN/model/) on one process."""
    import torch

    deadline = time.monotonic() + spec.time_budget_s
    torch.manual_seed(seed)
    lm = ProjectLM.from_export(model_dir, batch_size=spec.batch_size, max_gen_tokens=spec.max_gen_tokens,
                               deadline=deadline)
    return evaluate_tasks(lm, spec, repo_root, out_dir, seed=seed, deadline=deadline)


def upload_samples(run_dir: Path, results_dir: Path) -> str | None:
    """Log `results_dir` (RUN/downstream/: results.json, samples_<task>.jsonl) as the `downstream/`
    artifacts of the run's MLflow run (the metric sink's, named in RUN/mlflow_run.json). Best
    effort, bounded like every MLflow call: returns why nothing was uploaded, None when done."""
    from trainer.metric_sinks import RUN_FILE

    run_file = Path(run_dir) / RUN_FILE
    saved = json.loads(run_file.read_text()) if run_file.is_file() else {}
    if not saved.get("run_id") or not saved.get("tracking_uri"):
        return "no MLflow run"
    from trainer.mlflow_endpoint import reachable_client, short_error

    client = reachable_client(saved["tracking_uri"])
    if client is None:
        return f"MLflow at {saved['tracking_uri']} unreachable"
    try:
        client.log_artifacts(saved["run_id"], str(results_dir), artifact_path=RESULTS_DIR)
    except Exception as exc:  # noqa: BLE001 - the local files stay; the run's result does not depend on it
        log.warning("downstream samples not uploaded to MLflow: %s", short_error(exc))
        return short_error(exc)
    return None
