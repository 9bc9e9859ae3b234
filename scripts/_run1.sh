#!/usr/bin/env bash
# throwaway: session 21, call 3
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
git log --oneline -1 2>/dev/null
timeout 400 python3 -u -m convt3d bench --sweep --no-compile --iters 30 --json $OUT/sweep.json > $OUT/sweep.log 2>&1
echo "sweep rc $?"
tail -40 $OUT/sweep.log
timeout 170 python3 -m pytest -p no:warnings -o addopts="" -q tests/test_triton_tap_columns.py tests/test_triton_forward.py -k "not random_configs" 2>&1 | tail -4 | tee $OUT/tests.log
