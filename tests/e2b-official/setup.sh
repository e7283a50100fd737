#!/usr/bin/env bash
# Installs what the vendored official E2B suites need, at the SDK versions their commits
# were written for, into a venv: setup.sh DEST  →  DEST/e2b-official-venv
# Idempotent: a stamp records what was installed.
set -euo pipefail
venv="$1/e2b-official-venv"
want="e2b==2.45.1 e2b-code-interpreter==2.9.1 pytest==9.0.3 pytest-asyncio==1.3.0 pytest-xdist==3.8.0 pytest-timeout==2.4.0 python-dotenv==1.2.1 pytest-dotenv==0.5.2 packaging"
if [ "$(cat "$venv/.glovebox-stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  mkdir -p "$1"
  python3 -m venv "$venv"
  # shellcheck disable=SC2086
  "$venv/bin/pip" install --quiet --disable-pip-version-check $want
  echo "$want" > "$venv/.glovebox-stamp"
fi
