"""The configuration layer: an experiment file -> one frozen, validated `ExperimentSpec`, resolved once.

Everything that varies lives in the spec; errors are caught here, before any machine is
touched, with file:line for every problem. Preflight is pure code, and the resolve step
writes the `ResolvedExperiment` (`spec.resolved.json`) every other layer reads. Above
`basics/` and `models/` only: nothing here imports `trainer`, `reports` or `pipelines`, and `pipeline
validate` imports it without torch, so this package imports nothing. Errors and exit codes,
atomic files, paths and the environment are `basics/`, below every layer.

  spec            `ExperimentSpec`: one frozen, typed model per section, fields documented
  loader          `load_spec` / `check_spec`: file, `extends` chain, models, rules, file rules
  yaml_source     one untrusted YAML file -> plain data with the line/column of every node
  extends         the `extends:` chain, deep-merged, every value keeping the file it came from
  error_locations `SpecIssues`: each problem as `path:line:col: field: message` at its YAML node
  rules           cross-field rules, each `Violation` naming the field to change
  schema          the JSON Schema of an experiment file (`experiments/schema.json`), generated
  resolved        resolve once: `ResolvedExperiment`, written and read as `spec.resolved.json`
  plan/           parallel plan, memory and compute estimates, approval tier (pure; preflight.py re-exports it)
  capability      what the trainer can execute (`TRAINER`), read by validate, plan, smoke, trainer
  flops           device peak FLOPS and training FLOPs per token: one table, one formula
  eval_tasks      `eval.tasks` (lm-evaluation-harness tasks), checked without lm-eval or torch
  contract        the plug-in contract's torch-free half: what a model or optimizer file must declare
  data/           prepared data as its readers see it: format, mixture schedule, profiles, checks
                  (preparation itself is `pipelines.dataprep`)
"""
