#!/usr/bin/env bash
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
python3 -m pytest -p no:warnings -x tests/test_cuda_phases.py tests/test_gpu.py -k "cuda_phase or problem_77" 2>&1 | tail -30 | tee $OUT/pytest.log
python3 benchmarks/diag_cuda_phases.py --iters 50 2>&1 | tee $OUT/diag.log | tail -40
