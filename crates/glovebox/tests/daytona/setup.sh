#!/usr/bin/env bash
# Installs the official Daytona Python SDK, at a pinned version, for the Daytona-compatibility
# test: $1/daytona-venv. Idempotent: a stamp records what was installed.
set -euo pipefail
dest="$1"
DAYTONA_PY=0.226.1
mkdir -p "$dest"

venv="$dest/daytona-venv"
want="daytona==$DAYTONA_PY"
if [ "$(cat "$venv/.glovebox-stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$want"
  echo "$want" > "$venv/.glovebox-stamp"
fi
