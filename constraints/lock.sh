#!/usr/bin/env bash
# Regenerate constraints/github-jobs.lock from constraints/github-jobs.in: every package
# pinned with the hashes of its distributions (pip install --require-hashes checks them).
# `--check` regenerates into a temporary file and fails when the committed lock differs
# (CI's lint job runs it). Re-running it without --check keeps the current pins; to move
# to newer releases, delete the lock first (or pass --upgrade through UV_ARGS). Uses `uv pip compile` (uv is a dev dependency); the index is
# uv's default unless UV_INDEX_URL / UV_DEFAULT_INDEX say otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
uv="${UV:-.venv/bin/uv}"
out=constraints/github-jobs.lock
target="$out"
if [ "${1:-}" = "--check" ]; then
  # Start from the committed lock: uv keeps the versions already pinned in the output file,
  # so the check fails when the .in file changed, not whenever a dependency is released.
  target="$(mktemp)"; cp "$out" "$target"
fi
"$uv" pip compile constraints/github-jobs.in --generate-hashes --python-version 3.11 \
  --python-platform x86_64-unknown-linux-gnu --no-header --quiet ${UV_ARGS:-} --output-file "$target"
if [ "$target" != "$out" ]; then
  if ! diff -u "$out" "$target"; then
    echo "constraints/github-jobs.lock is out of date: run constraints/lock.sh" >&2
    exit 1
  fi
  echo "constraints/github-jobs.lock is current"
fi
