#!/usr/bin/env bash
# Installs the official E2B SDKs, at pinned versions, for the E2B-compatibility tests:
#   $1/e2b-venv   Python venv with e2b and e2b-code-interpreter (from PyPI)
#   $1/e2b-node   node_modules with @e2b/code-interpreter and its e2b (from npm)
# Idempotent: a stamp per tree records what was installed.
set -euo pipefail
dest="$1"
E2B_PY=2.63.0
E2B_CI_PY=2.11.5
E2B_CI_JS=2.8.0
E2B_JS=2.51.0
mkdir -p "$dest"

venv="$dest/e2b-venv"
want_py="e2b==$E2B_PY e2b-code-interpreter==$E2B_CI_PY"
if [ "$(cat "$venv/.glovebox-stamp" 2>/dev/null)" != "$want_py" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  # shellcheck disable=SC2086
  "$venv/bin/pip" install --quiet --disable-pip-version-check $want_py
  echo "$want_py" > "$venv/.glovebox-stamp"
fi

node="$dest/e2b-node"
want_js="@e2b/code-interpreter@$E2B_CI_JS e2b@$E2B_JS"
if command -v npm >/dev/null; then
  if [ "$(cat "$node/.glovebox-stamp" 2>/dev/null)" != "$want_js" ]; then
    rm -rf "$node"
    mkdir -p "$node"
    echo '{"name":"glovebox-e2b-tests","private":true}' > "$node/package.json"
    # shellcheck disable=SC2086
    (cd "$node" && npm install --silent --no-audit --no-fund $want_js)
    echo "$want_js" > "$node/.glovebox-stamp"
  fi
fi
