#!/usr/bin/env bash
# Static checks of the GitHub workflows, all offline:
#  - zizmor, default persona: must report nothing;
#  - zizmor, auditor persona: must report nothing either; every finding it would
#    raise is either fixed or ignored inline (`# zizmor: ignore[audit]`) next to a
#    comment that says why it is acceptable;
#  - check-jsonschema against the GitHub workflow schema (and the issue-form schema).
# Exits non-zero on any finding. Uses the project venv's binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${VENV:-.venv}/bin"
# Arguments override the files checked (the policy tests use this on bad samples).
if [ "$#" -gt 0 ]; then workflows=("$@"); else workflows=(.github/workflows/*.yml); fi

# No token: zizmor stays offline (the online audits need the API).
unset GH_TOKEN GITHUB_TOKEN ZIZMOR_GITHUB_TOKEN

status=0
echo "== zizmor (default persona)"
"$bin/zizmor" --offline --no-progress --quiet "${workflows[@]}" || status=1
echo "== zizmor (auditor persona; remaining findings must be justified inline)"
"$bin/zizmor" --offline --no-progress --quiet --persona auditor "${workflows[@]}" || status=1
echo "== check-jsonschema (vendor.github-workflows)"
"$bin/check-jsonschema" --builtin-schema vendor.github-workflows "${workflows[@]}" || status=1
if [ "$#" -eq 0 ]; then
  echo "== check-jsonschema (vendor.github-issue-forms)"
  "$bin/check-jsonschema" --builtin-schema vendor.github-issue-forms .github/ISSUE_TEMPLATE/*.yml || status=1
fi
exit "$status"
