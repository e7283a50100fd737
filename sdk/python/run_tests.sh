#!/usr/bin/env bash
# The Python SDK's test suite against a real daemon (started by tests/conftest.py).
# Must run as root (the daemon makes namespaces, cgroups and mounts), like the rest of CI.
# Makes sdk/python/.venv on first use, installs the package and pytest into it, runs pytest.
# Env: PYTHON (interpreter for the venv, default python3), GLOVEBOX_BIN (daemon binary),
# GLOVEBOX_TEMPLATES_DIR (enables the code-interpreter test); extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
if [ "$(id -u)" != 0 ]; then
  echo "sdk/python/run_tests.sh: run as root (the tests start a real daemon)" >&2
  exit 1
fi
venv=.venv
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade . 'pytest>=7'
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
