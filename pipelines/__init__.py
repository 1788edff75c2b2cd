"""The orchestration layer: `pipeline ...`, turning a spec into an execution plan and running it.

Stages cached by run identity, launchers (local `accelerate launch`, Slurm `sbatch`, a static
multi-node rendezvous), retries, run directories, data preparation, GitHub events and ChatOps.
It does not know what a transformer is: it reads `spec.resolved.json` (`validation.resolved`)
and starts `python -m trainer` on every rank. Top layer: it may import `validation`,
`models`, `trainer` and `reports`; nothing imports it. Importing this package imports nothing.

  cli             `pipeline`: the thin entry point; each `cmd_*` module registers its commands
  cmd_validate    `pipeline validate | plan | schema`: the configuration layer (no torch, ever)
  cmd_data        `pipeline data demo | prepare | check`
  cmd_run         `pipeline run | train | status | cancel | runs | doctor`
  cmd_train       `pipeline smoke` and `pipeline replay-metrics`
  cmd_report      `pipeline report`: candidate against baseline runs
  cmd_github      `pipeline comment | chatops | promote | attest | runners | job-identity | provenance`
  cmd_contract    `pipeline contract`: the plug-in contract checks of architecture and optimizer files
  cmd_demo        `pipeline demo` (`make demo`): the experiment PR flow on one laptop
  exits           how a command ends on an error: one line, the error's exit code (`fail`)
  progress        a line per stage event, a bar per training run (from metrics.jsonl)
  orchestrate     `ExperimentFlow`: validate -> prepare -> check -> smoke -> train -> evaluate
                  -> report, baseline first, on the same seeds
  stages          `StageRunner`: typed stage results written last, skipped when already done
  identity        run identity: hash(code version, spec hash, data version, seed)
  launch_plan     the trusted plan's data types (seeds, reuse, data digests, resume points), the only
                  part of the trusted side a training job reads
  tracked_runs    finished runs found by identity on the tracking server, fetched into a run directory
  rundir          run directories (`runs/<date>/<experiment>/<run-id>/`) and their layout
  resources       host checks before heavy work (disk space before data or checkpoints)
  doctor          the startup checklist every launcher runs first (`pipeline doctor`)
  layout_probe    the smoke's sharded half: a 2-process CPU step of the experiment's layout
  continuation    `--continue-from RUN_DIR`: seed a run on another layout from a run's checkpoint
  machine_speed   this machine's CPU speed for the specs a command prices (demo, run --measure-cpu, plan --measure)
  sweep           sweeps, pure: trials, winner, trial table, cost, `SuccessiveHalving` pruner
  sweep_trials    `run_sweep`: trials at once, pruned at their evals, the winner on the hypothesis seeds
  pr_comment      the experiment's sticky PR comment: progress while it trains, then the report
  mlflow_verdict  the champion baseline's records and the verdict tags left on candidate runs
  dataprep/       data preparation: source files -> a verified data version (datatrove executors)
  launchers/      `Launcher` protocol and its `local`, `slurm`, `static` launchers, retries
  github/         the code host: PyGithub adapter, sticky comment, events, ChatOps, runners, the
                  training job's OIDC identity toward MLflow
  trusted/        code only trusted jobs run: registry, provenance, promotion, job identities, the
                  MLflow server's check of a job's OIDC token (its own CODEOWNERS line)

`python -m pipelines` (`__main__`) is `pipeline`.
"""
