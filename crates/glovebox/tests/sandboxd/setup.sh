#!/usr/bin/env bash
# Installs the agent-sandbox Python SDK (`k8s-agent-sandbox`, with its `grpc` extra) at a
# pinned version, for the sandboxd test: $1/sandboxd-venv. Idempotent: a stamp records what
# was installed. The version is the one proto/sandboxd was regenerated from
# (scripts/sandboxd-proto.py).
set -euo pipefail
dest="$1"
SDK=1.0.8
mkdir -p "$dest"
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3

venv="$dest/sandboxd-venv"
want="k8s-agent-sandbox[grpc]==$SDK $($py -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$(cat "$venv/.glovebox-stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "k8s-agent-sandbox[grpc]==$SDK"
  echo "$want" > "$venv/.glovebox-stamp"
fi
