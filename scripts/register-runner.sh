#!/usr/bin/env bash
# Run ONE job on this machine as a just-in-time (JIT) GitHub Actions runner, then leave.
#
# The runner is registered at the ORGANISATION level in a runner group that only
# `experiment-train.yml` on the default branch may use (`pipeline runners jit` refuses any
# other group), with `generate-jitconfig`: a single-job runner, no registration token, and
# the JIT config (a credential) only in a 0600 file and the runner's environment, never on
# a command line or in a log. Every job gets a fresh copy of the runner, a fresh HOME, TMPDIR
# and caches (pip, HF, XDG), all deleted afterwards: nothing one job writes is there for the
# next. Run it in a fresh VM or container per job (docs/operations.md, section 3) so nothing
# outside those folders is shared either; `--loop` is refused for that reason.
#
# Usage:
#   scripts/register-runner.sh --org ORG --group GROUP --labels gpu,h100 [options]
# Options:
#   --org ORG             organisation that owns the runner group
#   --group NAME          runner group restricted to OWNER/REPO/.github/workflows/experiment-train.yml@refs/heads/main
#   --labels L1,L2        labels besides self-hosted (`gpu` plus the spec's `gpu_type`)
#   --repo OWNER/REPO     the repository the group serves (or env GITHUB_REPOSITORY)
#   --name NAME           runner name (default: <hostname>-<slurm job id or random>)
#   --runner-dir DIR      the unpacked actions/runner release, read only (default: ~/actions-runner)
#   --scratch DIR         where the per-job folders are made (default: $TMPDIR or /tmp; node-local on Slurm)
#   --dry-run             print what would run, register nothing
# Token: GITHUB_RUNNERS_TOKEN (or GITHUB_TOKEN) allowed to administer the organisation's
# self-hosted runners; used only by `pipeline runners jit`, never passed to the job.
set -euo pipefail

org=""; group=""; labels=""; name=""
repo="${GITHUB_REPOSITORY:-}"
runner_dir="${HOME}/actions-runner"
scratch="${TMPDIR:-/tmp}"
dry_run=false
pipeline="${PIPELINE:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/pipeline}"

die() { echo "register-runner: $*" >&2; exit 2; }

while [ "$#" -gt 0 ]; do
  case "$1" in
    --org) org="$2"; shift 2 ;;
    --group) group="$2"; shift 2 ;;
    --labels) labels="$2"; shift 2 ;;
    --repo) repo="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    --runner-dir) runner_dir="$2"; shift 2 ;;
    --scratch) scratch="$2"; shift 2 ;;
    --dry-run) dry_run=true; shift ;;
    --loop) die "--loop is refused: one job per fresh machine or container (a reused host keeps state between jobs)" ;;
    --ephemeral|--token|--url) die "$1: registration tokens are not used; runners are just-in-time (generate-jitconfig)" ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

[[ "$org" =~ ^[A-Za-z0-9][A-Za-z0-9-]{0,38}$ ]] || die "--org ORG is required"
[[ "$group" =~ ^[A-Za-z0-9][A-Za-z0-9\ _.-]{0,79}$ ]] || die "--group NAME is required"
[[ "$repo" =~ ^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$ ]] || die "--repo OWNER/REPO (or GITHUB_REPOSITORY) is required"
[[ "$labels" =~ ^[a-z0-9_.-]+(,[a-z0-9_.-]+)*$ ]] || die "--labels must be a comma list like gpu,h100"
[[ ",$labels," == *",gpu,"* ]] || echo "register-runner: warning: no 'gpu' label; experiment-train.yml will not use this runner" >&2
name="${name:-$(hostname -s)-${SLURM_JOB_ID:-$RANDOM$RANDOM}}"

if $dry_run; then
  echo "$pipeline runners jit --org $org --group '$group' --labels $labels --name $name --repo $repo --out <job dir>/jit (0600)"
  echo "cp -a $runner_dir <job dir>/runner; HOME/TMPDIR/caches in <job dir>; ACTIONS_RUNNER_INPUT_JITCONFIG=<file> <job dir>/runner/run.sh; rm -rf <job dir>"
  exit 0
fi
[ -x "$runner_dir/run.sh" ] || die "$runner_dir/run.sh not found: unpack the actions/runner release there"

umask 077
job="$(mktemp -d "$scratch/gitops-runner.XXXXXX")"
cleanup() { rm -rf "$job"; }
trap cleanup EXIT
mkdir -p "$job/home" "$job/tmp" "$job/cache"
cp -a "$runner_dir/." "$job/runner/"

GITHUB_REPOSITORY="$repo" "$pipeline" runners jit --org "$org" --group "$group" --labels "$labels" \
  --name "$name" --repo "$repo" --out "$job/jit"

# The job sees only these: a fresh HOME, TMPDIR and caches, and no token of ours.
status=0
(
  cd "$job/runner"
  ACTIONS_RUNNER_INPUT_JITCONFIG="$(cat "$job/jit")"
  rm -f "$job/jit"
  export ACTIONS_RUNNER_INPUT_JITCONFIG
  exec env -u GITHUB_TOKEN -u GITHUB_RUNNERS_TOKEN HOME="$job/home" TMPDIR="$job/tmp" \
    XDG_CACHE_HOME="$job/cache" PIP_CACHE_DIR="$job/cache/pip" HF_HOME="$job/cache/hf" ./run.sh
) || status=$?
[ "$status" -eq 0 ] || echo "register-runner: runner exited with $status" >&2
exit "$status"
