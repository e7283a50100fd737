#!/usr/bin/env bash
# Builds the SDK and runs its tests against a real `glovebox serve` (each test file starts its
# own daemon on a free loopback port). Needs root, like the rest of the suite.
# Set GLOVEBOX_TEMPLATES_DIR (see scripts/build-code-interpreter) to run the PNG test too.
set -euo pipefail
cd "$(dirname "$0")"
repo="$(cd ../.. && pwd)"
bin="${GLOVEBOX_BIN:-$repo/target/x86_64-unknown-linux-gnu/debug/glovebox}"
if [ ! -x "$bin" ]; then
  echo "== cargo build (no $bin)" >&2
  (cd "$repo" && cargo build --quiet)
fi
if [ ! -d node_modules ]; then
  echo "== npm install" >&2
  if [ -f package-lock.json ]; then npm ci --no-audit --no-fund; else npm install --no-audit --no-fund; fi
fi
echo "== build" >&2
rm -rf dist dist-test
npx tsc -p tsconfig.json
npx tsc -p test/tsconfig.json
echo "== node --test" >&2
exec node --test --test-reporter=spec --test-timeout=60000 dist-test/*.test.js
