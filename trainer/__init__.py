"""The execution layer: `python -m trainer --spec RUN/spec.resolved.json --run-dir RUN --data-dir CACHE`.

Runs on every rank under `accelerate launch`, reads only the resolved spec and makes no
decisions of its own. Modules:

  entry       argument parsing, exit codes (0 finished, 5 failed/stopped, 143 preempted)
  loop        `Trainer`: model + AdamW + schedule, accumulation, eval, checkpoints, alerts, export
  model       the network of `spec.model`, built by its plug-in file in models/; parameters, bits per byte
  optim       AdamW and the warmup + cosine/linear/constant schedule
  checkpoint/ one `CheckpointManager`, the unsharded (safetensors) and sharded (DCP) layouts, one
              writer thread; `checkpoint.format` (torch-free) is what pipelines read (docs/checkpoints.md)
  monitor     `AnomalyDetector` (pure), `AlertLog` (alerts.jsonl + log + MLflow), stall watchdog
  metric_sinks  `MetricSink` protocol: MLflow (batched, spooled, exactly once), metrics.jsonl, null
  mlflow_endpoint  default tracking URI, artifact location, the HTTP bound of every MLflow call
  spool_replay  a run's MLflow spool after the run: the report's notice, `pipeline replay-metrics`
  smoke       shrunk-model smoke run used by `pipeline smoke` and the PR check (its sharded
              2-process half: `pipelines.layout_probe`)
  lm_eval_scoring  `eval.tasks` scored with lm-evaluation-harness on the exported model, rank 0
  batches     packed, mixture-weighted training rows and eval rows from prepared data (numpy arrays)

Importing this package is free: heavy imports happen inside the modules that need them.
"""
