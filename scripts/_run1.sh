#!/usr/bin/env bash
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
python3 -m pytest -p no:warnings tests/test_gpu.py tests/test_triton_backward.py tests/test_cuda_phases.py tests/test_ops.py tests/test_triton_launch.py 2>&1 | tail -4 | tee $OUT/pytest.log
python3 -m convt3d bench --json $OUT/p77_1.json 2>&1 | tail -12 | tee $OUT/bench_1.log
for i in 1 2 3; do
python3 -m convt3d bench --backward --no-compile --json $OUT/p77_backward_$i.json 2>&1 | tail -3 | tee $OUT/backward_$i.log
done
