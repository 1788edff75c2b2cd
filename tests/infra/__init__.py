"""Helpers shared by tests of several tiers (import as `tests.infra.<module>`; no test imports another).

  tiers             test tiers by directory; the guard that fails a unit test starting a process or server
  corpus            the demo corpus, built once per test process for each size, copied where wanted
  data_helpers      specs from dicts and small demo-corpus slices for the data tests
  golden_run        the tiny deterministic CPU run whose losses tests/golden/losses_tiny.json records
  tiny_experiments  the tiny experiment files the end-to-end flows train (`BASE`, `CANDIDATE`)
  trainer_runs      the trainer as its tests run it: tiny spec, prepared corpus, `run_trainer`, `train_here`
  launch_helpers    builders for launcher tests: a tiny spec, its data, a `LaunchJob` running the probe
  probe_train       a stand-in for `python -m trainer` that exercises what the launchers must get right
  slurm.sh          a real single-host Slurm cluster with two slurmd nodes (start, stop, status, env)
  mlflow_server     a real `mlflow server` on 127.0.0.1 (sqlite store, local artifacts, one worker)
  report_runs       runs as the reports layer reads them: seed run directories and `RunRecord`s
  sweep_flow        the sweep end-to-end scaffolding: scratch repository, reporter, Slurm job facts
  lm_eval_tasks     tiny local lm-eval tasks: a multiple-choice task YAML and its examples
  github_emulator   a local GitHub REST emulator that can misbehave on request (5xx, rate limits, lost answers)
  github_markdown   Markdown as GitHub shows it (`cmarkgfm`, raw HTML, the GFM tag filter)
  act_scene         a pull request on an emulated repository, ready for nektos/act (`Scene`)
  workflow_runner   an emulated GitHub Actions runner, for per-job tokens (which act cannot do)
  eval_task_repo    a scratch repository whose base experiment scores a local lm-eval task
  layout_specs      the layout-continuation tests' tiny YAML template, its three layouts, a scratch repository
  tokenizer_fit_repo  a scratch repository with a local tokenizer beside a model vocabulary of another size
  model_variants    tiny configurations of each architecture and the variants that change counts or FLOPs
"""
