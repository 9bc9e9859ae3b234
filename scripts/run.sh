#!/usr/bin/env bash
# Set up (only what is missing) and run convt3d's tests or benchmark.
#   bash scripts/run.sh test [pytest args]     the test suite (Triton kernels under the interpreter without a GPU)
#   bash scripts/run.sh bench [bench args]     python -m convt3d bench (problem 77 by default)
# Works offline where torch, triton, pytest (and matplotlib for --plot) are already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
need() { ! "$PY" -c "import $1" >/dev/null 2>&1; }
if need torch; then
    # Any torch >= 2.4 works; 2.13.0 is pinned so that a CPU-only machine with it on disk installs nothing new.
    "$PY" -m pip install -q "torch==2.13.0"
fi
if need triton && [ "$(uname -sm)" = "Linux x86_64" ]; then "$PY" -m pip install -q triton; fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
cmd=${1:-test}; shift || true
case "$cmd" in
    test)
        if need pytest; then "$PY" -m pip install -q pytest; fi
        # pytest-xdist spreads the tests over the machine's cores (the Triton interpreter keeps one core busy per
        # process); offline without it they run in one process.
        if need xdist; then "$PY" -m pip install -q pytest-xdist || echo "pytest-xdist unavailable: one process"; fi
        if ! need xdist; then set -- -n auto "$@"; fi  # a later -n of the caller's wins
        # matplotlib only lets the bench tests draw their chart; offline without it they skip that part.
        if need matplotlib; then "$PY" -m pip install -q matplotlib || echo "matplotlib unavailable"; fi
        # onnx, onnxscript and onnxruntime only let the ONNX export tests run; offline without them those skip.
        if need onnx || need onnxscript || need onnxruntime; then
            "$PY" -m pip install -q onnx onnxscript onnxruntime || echo "onnx packages unavailable: ONNX tests skip"
        fi
        exec "$PY" -m pytest "$@" ;;
    bench)
        if need matplotlib; then "$PY" -m pip install -q matplotlib || echo "matplotlib unavailable: no --plot"; fi
        exec "$PY" -m convt3d bench "$@" ;;
    *) echo "usage: bash scripts/run.sh test|bench [args]" >&2; exit 2 ;;
esac
