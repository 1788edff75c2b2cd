"""The execution layer: `python -m trainer --spec RUN/spec.resolved.json --run-dir RUN --data-dir CACHE`.

Runs on every rank under `accelerate launch`, reads only the resolved spec and makes no
decisions of its own. Modules:

  entry       argument parsing, exit codes (0 finished, 5 failed/stopped, 143 preempted)
  loop        `Trainer`: model + AdamW + schedule, accumulation, eval, checkpoints, alerts, export
  model       transformers model from `spec.model`, FLOPs per token, device peaks, bits per byte
  optim       AdamW and the warmup + cosine/linear/constant schedule
  checkpoint  atomic, manifest-verified, validated checkpoints; retention; resume selection
  monitor     `AnomalyDetector` (pure), `AlertLog` (alerts.jsonl + log + MLflow), stall watchdog
  tracking    `MetricSink` protocol: MLflow (batched, spooled, exactly once), metrics.jsonl, null
  smoke       shrunk-model smoke run used by `pipeline smoke` and the PR check
  data/       prepared data, mixture batcher, eval batches (H-data; never imports torch)

Importing this package is free: heavy imports happen inside the modules that need them.
"""
