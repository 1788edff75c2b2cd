#!/usr/bin/env bash
# Regenerate the hash-pinned locks (pip install --require-hashes checks every distribution):
#   constraints/github-jobs.lock  from constraints/github-jobs.in (the privileged GitHub jobs: no torch)
#   constraints/build-tools.lock  from constraints/build-tools.in (setuptools, wheel: installed first)
#   constraints/gpu-train.lock    from pyproject.toml + constraints/gpu-train.in, within
#                                 constraints/constraints.txt (the GPU training job: torch with
#                                 its CUDA wheels, Linux x86_64, Python 3.11)
# `--check` regenerates into temporary files and fails when a committed lock differs (CI's lint
# job runs it). Re-running it without --check keeps the current pins; to move to newer
# releases, delete the lock first (or pass --upgrade through UV_ARGS). Uses `uv pip compile`
# (uv is a dev dependency); the index is uv's default unless UV_INDEX_URL / UV_DEFAULT_INDEX
# say otherwise (a CUDA build from another index: UV_ARGS="--index-url ..." for that lock).
set -euo pipefail
cd "$(dirname "$0")/.."
uv="${UV:-.venv/bin/uv}"
status=0

lock() {  # lock OUTPUT INPUT... : compile the inputs into OUTPUT (or check it with --check)
  local out="$1"; shift
  local target="$out"
  if [ "$check" = 1 ]; then
    # Start from the committed lock: uv keeps the versions already pinned in the output file,
    # so the check fails when an input changed, not whenever a dependency is released.
    target="$(mktemp)"; cp "$out" "$target"
  fi
  "$uv" pip compile "$@" --generate-hashes --python-version 3.11 \
    --python-platform x86_64-unknown-linux-gnu --no-header --quiet ${UV_ARGS:-} --output-file "$target"
  if [ "$target" != "$out" ]; then
    if ! diff -u "$out" "$target"; then
      echo "$out is out of date: run constraints/lock.sh" >&2
      status=1
    else
      echo "$out is current"
    fi
    rm -f "$target"
  fi
}

check=0
if [ "${1:-}" = "--check" ]; then check=1; fi
lock constraints/github-jobs.lock constraints/github-jobs.in
lock constraints/build-tools.lock constraints/build-tools.in
lock constraints/gpu-train.lock pyproject.toml constraints/gpu-train.in -c constraints/constraints.txt
exit "$status"
