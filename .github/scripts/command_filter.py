"""Does this event carry a ChatOps command at all? (standard library only, no install)

The train workflow's `authorize` job runs for every PR comment that has a line starting
with `/`; this exact check of the command grammar runs before `make setup`, so ordinary
comments (`see trainer/train.py`, a URL ending in `/retry`, `/trainer`) cost a checkout
and nothing more. A line counts when it is `/train`, `/cancel` or `/retry`, alone or
followed by whitespace (and an argument, which `pipeline chatops` then checks, together
with where GitHub renders the line). Other events (dispatch) always pass.

Writes `command=true|false` to $GITHUB_OUTPUT.
"""

from __future__ import annotations

import json
import os
import re
import sys

COMMAND = re.compile(r"^/(?:train|cancel|retry)(?:[ \t].*)?$")


def has_command(body: str) -> bool:
    return any(COMMAND.match(line.rstrip("\r").strip(" \t")) for line in body.split("\n"))


def main() -> int:
    name = os.environ.get("GITHUB_EVENT_NAME", "")
    found = True
    if name == "issue_comment":
        with open(os.environ["GITHUB_EVENT_PATH"], encoding="utf-8") as fh:
            payload = json.load(fh)
        body = (payload.get("comment") or {}).get("body")
        found = isinstance(body, str) and has_command(body)
    out = os.environ.get("GITHUB_OUTPUT")
    line = f"command={'true' if found else 'false'}\n"
    if out:
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(line)
    print(line.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
