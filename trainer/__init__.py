"""The execution layer: `python -m trainer --spec RUN/spec.resolved.json --run-dir RUN --data-dir CACHE`.

Runs on every rank under `accelerate launch`, reads only the resolved spec and makes no
decisions of its own. Modules:

  __main__    `python -m trainer` is `entry.main`
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
  step        one optimizer step for every layout: loss weighted over the global token count, clip,
              non-finite skip, schedule; out-of-memory and SIGTERM decided by all ranks together; how
              the micro-batches run is the layout's `ForwardBackward` (accelerate's, or the stages')
  model_parts the model as a list of parts (torchtitan's `model_parts`): one for one process, DDP,
              FSDP or TP, one per pipeline stage on this rank; what the loop, step, evaluation,
              checkpoint and export take
  step_metrics  per-step loss and grad norm kept on the device, read once per log interval;
              a fused AdamW skips a non-finite step without a host read
  state       the loop's small mutable state: `TrainState` (what a checkpoint carries besides
              tensors) and `StepResult` (one step's outcome)
  evaluation  held-out loss and bits per byte per source and pooled, on an eval set fixed per
              data version and `seq_len` (whatever the layout)
  collectives  the few collectives the trainer uses, each a no-op on one process; every
              decision that depends on one rank's observation goes through them
  parallel    `ParallelDims` (pipeline x data x tensor parallel): every rank question, the one device
              mesh and every process group; `make_accelerator` (with the FSDP-on-CPU patch), FSDP2 /
              TP model materialised shard by shard from the meta device
  pipeline_parallel  pipeline stages (torch.distributed.pipelining) composed with DDP, FSDP and TP:
              the stage split, the stages as model parts, the schedule as the step's forward/backward,
              evaluation through the stages
  activation_checkpointing  the `train.activation_checkpointing` modes applied to the plug-in's blocks
  contract_checks  the plug-in contract's torch half (`pipeline contract`): meta counts, FLOPs, TP
              names, packed rows equal to documents alone, optimizer state round trip
  hf_checkpoint  weights exported in Hugging Face's layout and read back (`model/`, transformers)
  export      the run's export RUN/model/ from the model parts, or a sharded layout's final
              checkpoint streamed tensor by tensor; checked before it is renamed into place
  dry_run     the full-scale dry run of `pipeline plan --dry-run`: the real model on fake tensors,
              sharded by `parallel` over a fake process group, one step under torch's memory tracker
              (pipeline layouts: the first and the last stage's ranks, each through the real schedule)
  measure     what an architecture declares, measured: parameters on the meta device, FLOPs on
              fake tensors (refusing uncounted ops), saved activations of one block
  calibrate   this machine's CPU speed now: a few training steps of a spec's own model, what the plan
              prices a CPU run from (`validation.plan.cpu_speed`; `pipeline demo`, `plan --measure`)
  record      the run record, pure functions: MLflow tags and params, result.json
  runlock     one writer per run directory (a `flock` per rank, `live_ranks`), ranks that die
              with their launcher (parent-death signal)
  diskfull    ENOSPC as `DiskSpaceError`: a clear message, exit code `disk-space`, never retried
  host_memory  glibc allocator thresholds (`mallopt`) so CPU training keeps freed activation
              memory in the heap instead of faulting in fresh pages every step
  faults      fault injection for tests as a null object: `FaultPlan` never fires,
              `InjectedFaults` reads the TRAINER_INJECT_* / TRAINER_FAULT_* variables

Importing this package is free: heavy imports happen inside the modules that need them.
"""
