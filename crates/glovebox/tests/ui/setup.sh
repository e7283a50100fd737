#!/usr/bin/env bash
# Installs the pinned browser driver for the dashboard test into $1/ui-node (from npm):
# playwright-core only (no browser download; the test drives Debian's /usr/bin/chromium).
# Idempotent: a stamp records what was installed.
set -euo pipefail
dest="$1"
want="playwright-core@1.65.1"
node="$dest/ui-node"
mkdir -p "$dest"
if [ "$(cat "$node/.glovebox-stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$node"
  mkdir -p "$node"
  echo '{"name":"glovebox-ui-tests","private":true}' > "$node/package.json"
  (cd "$node" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --silent --no-audit --no-fund --save-exact "$want")
  echo "$want" > "$node/.glovebox-stamp"
fi
