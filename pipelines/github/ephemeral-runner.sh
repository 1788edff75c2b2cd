#!/usr/bin/env bash
# Register this machine as an EPHEMERAL self-hosted GitHub Actions runner, run exactly one
# job, and leave (GitHub unregisters ephemeral runners after their job). Meant for a GPU
# node from a pool, or for a Slurm job that hosts a runner for the length of one training:
#
#   sbatch -N1 --gres=gpu:8 --wrap "pipelines/github/ephemeral-runner.sh gpu,h100"
#
# Needs: the actions runner unpacked in $RUNNER_DIR (default ~/actions-runner; this script
# never downloads anything), `pipeline` on PATH (or $PIPELINE), and GITHUB_TOKEN (a token
# allowed to administer the repository's runners), GITHUB_REPOSITORY=owner/name.
# The registration token is fetched through the API (`pipeline runners token`) and is
# only ever passed to config.sh, never printed.
set -euo pipefail

labels="${1:?usage: ephemeral-runner.sh LABELS (comma-separated, e.g. gpu,h100)}"
if [[ ! "$labels" =~ ^[A-Za-z0-9._-]+(,[A-Za-z0-9._-]+)*$ ]]; then
  echo "error: labels must be letters, digits, '.', '_' or '-', separated by commas" >&2
  exit 2
fi
if [[ ! "${GITHUB_REPOSITORY:-}" =~ ^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$ ]]; then
  echo "error: set GITHUB_REPOSITORY=owner/name" >&2
  exit 2
fi
runner_dir="${RUNNER_DIR:-$HOME/actions-runner}"
name="${RUNNER_NAME:-$(hostname -s)-${SLURM_JOB_ID:-$$}}"
server="${GITHUB_SERVER_URL:-https://github.com}"

token="$("${PIPELINE:-pipeline}" runners token 2>/dev/null | tail -n 1)"
cd "$runner_dir"
./config.sh --unattended --ephemeral --disableupdate --replace \
  --url "$server/$GITHUB_REPOSITORY" --token "$token" --name "$name" --labels "$labels"
exec ./run.sh
