#!/usr/bin/env bash
# Register this machine as an EPHEMERAL self-hosted GitHub Actions runner and run one job.
#
# Ephemeral: the runner takes exactly one job, then GitHub deregisters it; nothing a job
# leaves behind (files, processes, credentials) survives into the next job, provided the
# machine or container is also fresh (a pod, a VM from an image, a Slurm allocation with a
# scratch work dir). See docs/operations.md for the threat model.
#
# Usage:
#   scripts/register-runner.sh --repo OWNER/REPO --labels gpu,h100 [options]
# Options:
#   --repo OWNER/REPO     repository to serve (or env GITHUB_REPOSITORY)
#   --labels L1,L2        labels besides the automatic self-hosted/Linux/X64 (must include
#                         `gpu` for experiment-train.yml, plus the spec's `gpu_type`)
#   --name NAME           runner name (default: <hostname>-<slurm job id or random>)
#   --group NAME          runner group (restrict it to this repository in the org settings)
#   --runner-dir DIR      where the actions/runner release is unpacked (default: ~/actions-runner)
#   --work DIR            job work directory (default: a fresh temp dir, deleted afterwards)
#   --server URL          GitHub web URL (default: env GITHUB_SERVER_URL or https://github.com)
#   --loop                register again after each job (a long-lived node in a pool)
#   --dry-run             print the config.sh command instead of running it
# Token: env RUNNER_TOKEN, else `pipeline runners token` (needs GITHUB_TOKEN with the
# repository's administration permission; a registration token is valid for one hour).
set -euo pipefail

repo="${GITHUB_REPOSITORY:-}"
labels=""
name=""
group=""
runner_dir="${HOME}/actions-runner"
work=""
server="${GITHUB_SERVER_URL:-https://github.com}"
loop=false
dry_run=false
pipeline="${PIPELINE:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/pipeline}"

die() { echo "register-runner: $*" >&2; exit 2; }

while [ "$#" -gt 0 ]; do
  case "$1" in
    --repo) repo="$2"; shift 2 ;;
    --labels) labels="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    --group) group="$2"; shift 2 ;;
    --runner-dir) runner_dir="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --server) server="$2"; shift 2 ;;
    --loop) loop=true; shift ;;
    --dry-run) dry_run=true; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

[[ "$repo" =~ ^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$ ]] || die "--repo OWNER/REPO is required"
[[ "$labels" =~ ^[a-z0-9_.-]+(,[a-z0-9_.-]+)*$ ]] || die "--labels must be a comma list like gpu,h100"
[[ ",$labels," == *",gpu,"* ]] || echo "register-runner: warning: no 'gpu' label; experiment-train.yml will not use this runner" >&2
name="${name:-$(hostname -s)-${SLURM_JOB_ID:-$RANDOM$RANDOM}}"
[ -x "$runner_dir/config.sh" ] || $dry_run || die "$runner_dir/config.sh not found: unpack the actions/runner release there"

registration_token() {
  if [ -n "${RUNNER_TOKEN:-}" ]; then
    printf '%s' "$RUNNER_TOKEN"
  else
    GITHUB_REPOSITORY="$repo" "$pipeline" runners token --repo "$repo"
  fi
}

run_once() {
  local job_work cleanup=false
  if [ -n "$work" ] || $dry_run; then job_work="${work:-<temp dir>}"; else job_work="$(mktemp -d)"; cleanup=true; fi
  local args=(--unattended --ephemeral --disableupdate --replace
              --url "$server/$repo" --name "$name" --labels "$labels" --work "$job_work")
  [ -n "$group" ] && args+=(--runnergroup "$group")
  if $dry_run; then
    echo "$runner_dir/config.sh ${args[*]} --token ***"
    return 0
  fi
  local token
  token="$(registration_token)"
  [ -n "$token" ] || die "could not obtain a registration token"
  (cd "$runner_dir" && ./config.sh "${args[@]}" --token "$token")
  unset token
  # run.sh returns after the single job (ephemeral); GitHub removes the registration.
  (cd "$runner_dir" && ./run.sh) || echo "register-runner: runner exited with $?" >&2
  if $cleanup; then rm -rf "$job_work"; fi
}

if $loop; then
  while true; do run_once; $dry_run && break; sleep 5; done
else
  run_once
fi
