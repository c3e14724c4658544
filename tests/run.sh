#!/usr/bin/env bash
# Run the test suite from nothing, on two Pythons:
#   3.11 + torch 2.13.0, CPU build: the whole suite but the users'-runtime files
#        below; the startup tests also run on each of Python 3.10-3.13 that
#        pyenv has;
#   3.13 + torch 2.12.0: the users' Python and torch: the kitchen backend (the
#        users' pin and the newest release), the bed, and the users'-runtime
#        files below. PyPI has only the
#        CUDA 13.0 build of torch for Python 3.13 on x86_64 (2.12.0+cu130, the
#        users' own build): about 2.6 GB to download, 4.8 GB in its venv.
# Each venv gets what the tests need (wrapt, pytest, hatchling, safetensors,
# numpy, mypy, pytest-xdist) and what the real ComfyUI releases import
# (tests/requirements-comfyui.txt, torch pinned); the comfy-kitchen releases the
# INT8 tests and each ComfyUI release use are downloaded once into .cache/ (per
# Python: they carry compiled extensions), the eight ComfyUI releases unpacked.
#
# ASCEND_SHIM_TEST_PYTHONS="3.11" runs the first suite alone (then whole);
# ASCEND_SHIM_TEST_KITCHENS="0.2.26 0.2.40" narrows the comfy-kitchen matrix;
# ASCEND_SHIM_TEST_WORKERS sets the number of pytest workers (default 2).
# Extra arguments go to every pytest run. Each test file's name is printed as
# it starts (tests/conftest.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHONS="${ASCEND_SHIM_TEST_PYTHONS:-3.11 3.13}"
# pytest-xdist workers, one test file each at a time; most tests wait on a
# child interpreter, so two are about twice as fast on two cores
WORKERS="${ASCEND_SHIM_TEST_WORKERS:-2}"

find_python() {  # find_python 3.11
    local root="${PYENV_ROOT:-$HOME/.pyenv}" candidate
    for candidate in "$root"/versions/"$1".*/bin/python3 "$(command -v "python$1" || true)"; do
        if [ -n "$candidate" ] && [ -x "$candidate" ]; then
            echo "$candidate"
            return
        fi
    done
    echo "Python $1 not found (pyenv or python$1 on PATH); ASCEND_SHIM_TEST_PYTHONS picks others" >&2
    exit 1
}

torch_for() {  # the torch each suite tests with
    case "$1" in
        # the +cpu local version: pip never falls back to the multi-GB CUDA build
        3.11) echo "torch==2.13.0+cpu" ;;
        3.13) echo "torch==2.12.0" ;;
        *) echo "torch" ;;
    esac
}

torchvision_for() {  # the torchvision built for that torch, where the registry has one
    case "$1" in
        3.13) echo "torchvision==0.27.0" ;;  # torch 2.12.0 (cu130); none exists for 2.13.0+cpu
        *) echo "" ;;
    esac
}

kitchens_for() {  # the comfy-kitchen releases each suite's INT8 matrix runs (empty: all)
    if [ "$1" = "3.13" ]; then echo "${ASCEND_SHIM_TEST_KITCHENS-$KITCHENS_313}"; else echo "${ASCEND_SHIM_TEST_KITCHENS:-}"; fi
}

venv_for() {
    if [ "$1" = "3.11" ]; then echo "${ASCEND_SHIM_TEST_VENV:-.venv-test}"; else echo ".venv-test-$1"; fi
}

cache_for() {
    if [ "$1" = "3.11" ]; then echo ".cache"; else echo ".cache/py$1"; fi
}

prepare() {  # prepare 3.11: the venv and the downloads, before any test runs
    local minor="$1" venv cache
    venv="$(venv_for "$minor")"
    cache="$(cache_for "$minor")"
    echo "== Python $minor: venv $venv with $(torch_for "$minor")"
    if [ ! -x "$venv/bin/python" ]; then
        "$(find_python "$minor")" -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install -q --disable-pip-version-check \
        "$(torch_for "$minor")" "wrapt>=1.14" pytest pytest-xdist hatchling editables safetensors numpy mypy
    # what the real ComfyUI releases import, with this venv's torch pinned: pip never replaces it
    local pin
    pin="$(mktemp)"
    "$venv/bin/python" -c 'from importlib.metadata import version; print("torch==" + version("torch"))' > "$pin"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check \
        -r tests/requirements-comfyui.txt -c "$pin"
    # raylight's Ray and yunchang, torch pinned; xfuser --no-deps (raylight loads its files itself)
    "$venv/bin/python" -m pip install -q --disable-pip-version-check \
        -r tests/requirements-raylight.txt -c "$pin"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "xfuser==0.7.0"
    rm -f "$pin"
    # --no-deps: its torch requirement must never reinstall torch
    if [ -n "$(torchvision_for "$minor")" ]; then
        "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$(torchvision_for "$minor")"
    fi
    # every release of the matrix, whichever each suite runs (test_rope picks its own)
    ASCEND_SHIM_TEST_CACHE="$PWD/$cache" ASCEND_SHIM_TEST_KITCHENS="" "$venv/bin/python" - <<'PY'
import sys
sys.path.insert(0, "tests")
import harness
for version in harness.KITCHEN_VERSIONS:
    harness.kitchen_dir(version)
for version in harness.COMFYUI_VERSIONS:
    harness.comfyui_dir(version)
    if harness.comfyui_kitchen(version):  # the comfy-kitchen each release pins
        harness.kitchen_dir(harness.comfyui_kitchen(version))
harness.pytest_asyncio_dir()
for version in harness.RAYLIGHT_RELEASES:
    harness.raylight_dir(version)
for version in harness.TORCH_NPU_VERSIONS:  # real torch_npu schemas and kernel registries
    harness.torch_npu_dir(version)
    harness.torch_npu_registry(version)
for python in harness.pyenv_pythons().values():
    harness.wheelhouse_for(python)
print("comfy-kitchen releases:", ", ".join(harness.KITCHEN_VERSIONS))
print("ComfyUI releases:", ", ".join(harness.COMFYUI_VERSIONS))
print("Pythons for the startup tests:", ", ".join(sorted(harness.pyenv_pythons())) or "none")
PY
}

# the users' runtime (3.13 + torch 2.12.0+cu130) runs these alone where both suites run: what they
# check is the shim on the users' own torch (selftest's NPU math, ComfyUI's CUDA-build symptoms on
# every release, ten threads importing at once, ComfyUI's start-up, fp8 layers, prompts with the
# audit, model moves, the attention account, torch_npu's fallback lines), which a second torch
# only repeats
USERS_RUNTIME_ONLY="tests/test_selftest.py tests/patches/test_comfy_patches.py tests/test_reliability.py
    tests/patches/test_comfy_startup.py tests/patches/test_fp8_real.py tests/patches/test_audit_prompts.py
    tests/patches/test_model_moves.py tests/patches/test_attention_account.py tests/test_fallback_report.py"
# ... and these run once, on 3.11: matrices whose outcome does not depend on torch's build (startup
# on every Python, flags, lifecycle, kitchen parity, fp8 loaders, tests-unit, wheels, README,
# launchers' card choice, the calibration kit's tables), the end-to-end sampling (on 3.13 + torch
# 2.12 it gave the same cosines and counts to 6 digits for ~2 more CPU minutes) and the CLI's words
ONCE_ON_311="tests/test_bootstrap.py tests/test_wrapt_range.py tests/e2e tests/patches/test_comfy_flags.py
    tests/test_patch_lifecycle.py tests/kitchen/test_parity.py tests/patches/test_fp8.py
    tests/patches/test_comfy_unit_tests.py tests/testbed/test_real_signatures.py tests/test_readme.py
    tests/patches/test_launchers.py tests/test_calibration.py tests/test_newcomer.py tests/test_cli.py
    tests/test_cli_output.py tests/test_doctor.py tests/test_startup_messages.py"
# on 3.13 the comfy-kitchen matrix is the users' pin and the newest release
KITCHENS_313="0.2.26 0.2.40"

ignoring() {  # ignoring "a b": --ignore=a --ignore=b
    local path
    for path in $1; do printf -- "--ignore=%s " "$path"; done
}

suite_args() {  # what each Python runs
    if [ "$1" = "3.13" ]; then
        echo "tests $(ignoring "$ONCE_ON_311")"
    elif [[ " $PYTHONS " == *" 3.13 "* ]]; then
        echo "tests $(ignoring "$USERS_RUNTIME_ONLY")"
    else
        echo "tests"
    fi
}

# Every venv is prepared at once, in the background; each suite starts as soon
# as its own venv is ready, so the 3.13 download (2.6 GB) overlaps the 3.11 suite.
declare -A preparing prepare_log
for minor in $PYTHONS; do
    prepare_log[$minor]="$(mktemp)"
    prepare "$minor" > "${prepare_log[$minor]}" 2>&1 &
    preparing[$minor]=$!
done
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT  # an early exit leaves no download running

ready() {  # ready 3.13: wait for that venv, show how its preparation went
    local status=0
    wait "${preparing[$1]}" || status=$?
    echo
    cat "${prepare_log[$1]}"
    rm -f "${prepare_log[$1]}"
    if [ "$status" -ne 0 ]; then
        echo "preparing the Python $1 test venv failed (exit $status)" >&2
    fi
    return "$status"
}

results="$(mktemp)"
failed=0
# type-check the public surface ([tool.mypy] in pyproject.toml), once
first="${PYTHONS%% *}"
ready "$first" || exit $?
echo
echo "== mypy on the public surface (Python $first)"
if ! "$(venv_for "$first")/bin/python" -m mypy --no-error-summary; then
    echo "mypy found type errors" >&2
    failed=1
fi
for minor in $PYTHONS; do
    if [ "$minor" != "$first" ] && ! ready "$minor"; then
        failed=1
        continue
    fi
    venv="$(venv_for "$minor")"
    log="$(mktemp)"
    echo
    echo "== Python $minor, $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)')"
    set +e
    # shellcheck disable=SC2046
    # one torch thread per process: the workers (and their children) already fill the cores
    PYTHONUNBUFFERED=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" ASCEND_SHIM_TEST_CACHE="$PWD/$(cache_for "$minor")" \
        ASCEND_SHIM_TEST_KITCHENS="$(kitchens_for "$minor")" \
        "$venv/bin/python" -m pytest $(suite_args "$minor") -p no:cacheprovider \
            -n "$WORKERS" --dist loadfile --durations=30 -rs "$@" | tee "$log"
    status=${PIPESTATUS[0]}
    set -e
    if [ "$status" -eq 5 ]; then
        echo "Python $minor: pytest collected no tests" >&2
    fi
    if [ "$status" -ne 0 ]; then
        failed=1
    fi
    "$venv/bin/python" - "$log" "$minor" >> "$results" <<'PY'
import re, sys
lines = open(sys.argv[1], errors="replace").read().splitlines()
last = next((l for l in reversed(lines) if re.search(r"\d+ (passed|failed|errors?)\b", l)), "")
count = lambda word: sum(int(n) for n in re.findall(r"(\d+) %s\b" % word, last))
print(sys.argv[2], count("passed"), count("failed") + count("errors?"), count("skipped"))
PY
    rm -f "$log"
done

echo
passed=0; failures=0; skipped=0
while read -r minor p f s; do
    echo "Python $minor: $p passed, $f failed, $s skipped"
    passed=$((passed + p)); failures=$((failures + f)); skipped=$((skipped + s))
done < "$results"
rm -f "$results"
if [ "$passed" -eq 0 ]; then
    failed=1
fi
echo "total: $passed passed, $failures failed, $skipped skipped"
exit "$failed"
