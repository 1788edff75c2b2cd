#!/usr/bin/env bash
# One just-in-time runner for the length of one job, e.g. as a Slurm job that hosts the
# runner for one training (node-local scratch; the allocation ends with the job):
#
#   sbatch -N1 --gres=gpu:8 --export=NONE,GITHUB_REPOSITORY=acme/lab,RUNNER_ORG=acme,RUNNER_GROUP=gpu-pool \
#     --wrap 'GITHUB_RUNNERS_TOKEN=$(cat ~/.config/gitops/runners-token) pipelines/github/ephemeral-runner.sh gpu,h100'
#
# A thin wrapper over scripts/register-runner.sh (organisation runner group limited to
# experiment-train.yml on the default branch, generate-jitconfig, fresh per-job folders).
# The admin token is read from a file by the wrapped command, never written on a command line.
set -euo pipefail
labels="${1:?usage: ephemeral-runner.sh LABELS (comma-separated, e.g. gpu,h100)}"
here="$(cd "$(dirname "$0")/../.." && pwd)"
exec "$here/scripts/register-runner.sh" --org "${RUNNER_ORG:?set RUNNER_ORG}" --group "${RUNNER_GROUP:?set RUNNER_GROUP}" \
  --labels "$labels" --repo "${GITHUB_REPOSITORY:?set GITHUB_REPOSITORY=owner/name}" \
  --scratch "${SLURM_TMPDIR:-${TMPDIR:-/tmp}}" ${RUNNER_NAME:+--name "$RUNNER_NAME"}
