#!/usr/bin/env bash
# Installs the official Vercel Sandbox SDK at the version pinned in package.json (beside this
# script) into $1/vercel-node, for tests/vercel.rs. Idempotent: the installed package.json is
# the stamp.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="$1/vercel-node"
if ! cmp -s "$here/package.json" "$dest/package.json" || [ ! -d "$dest/node_modules/@vercel/sandbox" ]; then
  rm -rf "$dest"
  mkdir -p "$dest"
  cp "$here/package.json" "$dest/package.json.new"
  mv "$dest/package.json.new" "$dest/package.json"
  (cd "$dest" && npm install --silent --no-audit --no-fund --no-package-lock)
fi
