"""The code host: PyGithub adapter, sticky comment, webhook events, ChatOps, runners.

Import the submodules directly (`from pipelines.github.comment import StickyComment`);
this package imports nothing heavy so `pipeline --help` stays fast.

  client      the code host behind small Protocols: PyGithub for GitHub, a file for dry runs;
              retry policy (idempotent methods only), rate limits
  comment     `StickyComment`: one comment per PR and experiment, updated in place, with its state
  events      webhook payloads (`$GITHUB_EVENT_PATH`) parsed into small typed events (pure)
  chatops     `/train`, `/cancel`, `/retry` in PR comments: parsed as GitHub renders them, who may
              trigger asked of the API, bound to the validated head SHA
  cancel      `/cancel` through the Actions API: the trusted runs training a PR's experiment
  runners     self-hosted runners: capacity before a launch, listing, pruning offline ones
  oidc_token  the training job's MLflow identity: its GitHub OIDC token on every request
              (`MLFLOW_TRACKING_AUTH=github-oidc`), refreshed before it expires
  ephemeral-runner.sh  one just-in-time runner for the length of one job (e.g. as a Slurm job)

Promotion, provenance and job identities are trusted-only code: pipelines/trusted/.
"""
