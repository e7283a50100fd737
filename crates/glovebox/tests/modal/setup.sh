#!/usr/bin/env bash
# Installs the official Modal Python client, at a pinned version, for the Modal-compatibility
# test: $1/modal-venv. Idempotent: a stamp records what was installed.
#
# The venv uses the host's /usr/bin/python3 when there is one: `Image.debian_slim()` asks for
# the client's own Python series, and on Glovebox that image is the host's /usr.
set -euo pipefail
dest="$1"
MODAL_PY=1.6.4
mkdir -p "$dest"
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3

venv="$dest/modal-venv"
want="modal==$MODAL_PY $($py -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$(cat "$venv/.glovebox-stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "modal==$MODAL_PY"
  echo "$want" > "$venv/.glovebox-stamp"
fi
