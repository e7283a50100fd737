#!/usr/bin/env bash
# The SDKs as packed artefacts, installed the way the README says into clean directories:
# the npm tarball (`npm pack`) and the Python wheel, each imported from a fresh project that
# has nothing else. Needs npm/node and python3 (scripts/deps installs them).
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d /tmp/glovebox-pack.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

echo "== npm pack (sdk/typescript)" >&2
(cd typescript && { [ -d node_modules ] || npm ci --no-audit --no-fund --silent; } && npm pack --silent --pack-destination "$tmp" >/dev/null)
tgz=$(ls "$tmp"/glovebox-sdk-*.tgz)
mkdir "$tmp/js" && cd "$tmp/js"
echo '{"name":"pack-check","private":true,"type":"module"}' > package.json
npm install --no-audit --no-fund --silent "$tgz"
node -e '
  import("@glovebox/sdk").then((m) => {
    if (typeof m.Sandbox !== "function") throw new Error("no Sandbox export: " + Object.keys(m));
    console.log("npm package: @glovebox/sdk imports, exports " + Object.keys(m).length + " names");
  });'
[ -f node_modules/@glovebox/sdk/dist/index.d.ts ] || { echo "the package has no type declarations" >&2; exit 1; }
cd - >/dev/null

echo "== wheel (sdk/python)" >&2
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" wheel --quiet --disable-pip-version-check --no-deps -w "$tmp/wheel" ./python
"$tmp/venv/bin/pip" install --quiet --disable-pip-version-check "$tmp"/wheel/glovebox-*.whl
(cd "$tmp" && "$tmp/venv/bin/python" -c '
import glovebox, os
assert hasattr(glovebox, "Sandbox"), dir(glovebox)
assert os.path.exists(os.path.join(os.path.dirname(glovebox.__file__), "py.typed"))
print("wheel: glovebox imports from", os.path.dirname(glovebox.__file__))')
