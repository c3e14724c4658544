#!/usr/bin/env bash
# Run the test suite from nothing: a Python 3.11 venv with what the tests
# need (torch 2.13 CPU, wrapt, pytest, hatchling, safetensors), the real
# comfy-kitchen releases the INT8 tests use (downloaded once into .cache/),
# then pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

find_python() {
    local root="${PYENV_ROOT:-$HOME/.pyenv}"
    for candidate in "$root"/versions/3.11*/bin/python3 "$(command -v python3.11 || true)" "$(command -v python3 || true)"; do
        if [ -n "$candidate" ] && [ -x "$candidate" ] && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 10))' 2>/dev/null; then
            echo "$candidate"
            return
        fi
    done
    echo "no Python 3.10+ found" >&2
    exit 1
}

VENV="${ASCEND_SHIM_TEST_VENV:-.venv-test}"
if [ ! -x "$VENV/bin/python" ]; then
    "$(find_python)" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    "torch==2.13.0" "wrapt>=2.5" pytest hatchling editables safetensors numpy

# downloads up front, so the tests themselves never wait on the network
"$VENV/bin/python" - <<'PY'
import sys
sys.path.insert(0, "tests")
import harness
for version in harness.KITCHEN_VERSIONS:
    harness.kitchen_dir(version)
for python in harness.pyenv_pythons().values():
    harness.wheelhouse_for(python)
print("Pythons for the startup tests:", ", ".join(sorted(harness.pyenv_pythons())) or "none")
PY

set +e
"$VENV/bin/python" -m pytest tests -q "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests" >&2
    exit 1
fi
exit "$status"
