"""Run a sweep layer's forward a few times through one backend, for Nsight Compute (GPU), e.g. the CUDA phase
correlation on problem 77 (backend torch) or tap_columns on k3s1p1:

    ncu --clock-control none -k regex:phase_conv --launch-skip 3 --launch-count 1 [--section ... | --metrics ...] \
        python3 benchmarks/profile_layer.py kernelbench_l1_77_dilated torch
    ncu ... -k regex:tap_columns ... python3 benchmarks/profile_layer.py k3s1p1 tap_columns

tap_columns: the Triton tap_columns kernel with one fixed config (64 x 128 x 32, 4 warps, 3 stages), not autotuned,
so that the profiled launch is that config's. TF32 mode.
"""

import sys

import torch

import convt3d
from convt3d.backends.triton import forward
from convt3d.bench.protocol import relative_error
from convt3d.bench.workloads import sweep_layers

TAP_COLUMNS = dict(KERNEL="tap_columns", BLOCK_M=64, BLOCK_N=128, BLOCK_CI=32, num_warps=4, num_stages=3)

name, backend = sys.argv[1], sys.argv[2]
torch.backends.cudnn.allow_tf32 = True
layer = sweep_layers(name)[0]
_, x, w, b, reference = layer.kernel_case("cuda")
args = (layer.stride, layer.padding, layer.output_padding, layer.groups, layer.dilation)
for _ in range(6):
    if backend == "tap_columns":
        y = forward.conv_transpose3d_triton(x, w, b, layer.plan(), config=TAP_COLUMNS)
    else:
        y = convt3d.conv_transpose3d(x, w, b, *args, backend=backend)
torch.cuda.synchronize()
print(name, backend, "rel. err. vs float64", relative_error(y, reference))
