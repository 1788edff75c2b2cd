"""Held-out evaluation: loss and bits per byte per source, and their mixture-weighted mean.

Every rank evaluates a disjoint share of each source's eval batches; one all-reduce per
source sums (loss x tokens, tokens), so the numbers do not depend on the world size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainer.collectives import Collectives
from trainer.model import bits_per_byte
from trainer.monitor import track_best

if TYPE_CHECKING:
    import torch

    from trainer.data import PreparedData
    from validation.spec import ExperimentSpec


class Evaluator:
    def __init__(self, spec: ExperimentSpec, prepared: PreparedData, comm: Collectives, rank: int,
                 autocast: Callable[[], Any], to_device: Callable[[dict[str, Any]], dict[str, torch.Tensor]]):
        self.spec = spec
        self.prepared = prepared
        self.comm = comm
        self.rank = rank
        self.autocast = autocast
        self.to_device = to_device

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        import torch

        from trainer.data import eval_batches

        spec, world = self.spec, self.comm.world
        model.eval()
        out: dict[str, float] = {}
        weights = spec.data.weights()
        agg_loss = agg_bpb = agg_w = 0.0
        bs = spec.train.micro_batch_size
        with torch.no_grad(), self.autocast():
            for source in self.prepared.sources:
                loss_sum = count = 0.0
                batches = eval_batches(self.prepared, source, spec.data.seq_len, bs, spec.train.eval_batches)
                for i, batch in enumerate(batches):
                    if i % world != self.rank:
                        continue
                    inputs = self.to_device(batch)
                    n = float((inputs["labels"][:, 1:] != -100).sum())
                    if n == 0:
                        continue
                    loss = model(**inputs, use_cache=False).loss.float()
                    loss_sum += float(loss) * n
                    count += n
                loss_sum, count = self.comm.all_reduce([loss_sum, count])
                if count == 0:
                    continue
                loss = loss_sum / count
                bpb = bits_per_byte(loss, self.prepared.bytes_per_token(source))
                out[f"eval/{source}/loss"] = loss
                out[f"eval/{source}/bpb"] = bpb
                w = weights.get(source, 0.0)
                if w > 0:
                    agg_loss, agg_bpb, agg_w = agg_loss + w * loss, agg_bpb + w * bpb, agg_w + w
        if agg_w:
            # Mixture-weighted: the objective the model is trained for, independent of eval set sizes.
            out["eval/loss"] = agg_loss / agg_w
            out["eval/bpb"] = agg_bpb / agg_w
        model.train()
        return out


def update_best(state: Any, metrics: dict[str, float], patience: int) -> bool:
    """Record the eval loss and the best so far in `state` (a TrainState); True when early
    stopping says stop (`patience` evaluations without improvement; 0 = never)."""
    value = metrics.get("eval/loss")
    if value is None or not math.isfinite(value):
        return False
    state.eval_metric = value
    best, state.evals_without_improvement = track_best(state.best_metric, state.evals_without_improvement, value)
    if best != state.best_metric:
        state.best_metric, state.best_step = best, state.step
    return bool(patience) and state.evals_without_improvement >= patience
