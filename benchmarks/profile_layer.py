"""Run a sweep layer's forward a few times through one backend, for Nsight Compute (GPU), e.g. the CUDA phase
correlation on problem 77 (backend torch) or tap_columns on k3s1p1:

    ncu --clock-control none -k regex:phase_conv --launch-skip 3 --launch-count 1 [--section ... | --metrics ...] \
        python3 benchmarks/profile_layer.py kernelbench_l1_77_dilated torch
    ncu ... -k regex:tap_columns ... python3 benchmarks/profile_layer.py k3s1p1 tap_columns
    ncu ... -k regex:tiled_kernel ... python3 benchmarks/profile_layer.py unet3d_k2s2_deep tiled [128x128x64s1w8n3]
    ncu ... -k regex:conv_transpose3d_kernel ... python3 benchmarks/profile_layer.py vae_k4s2p1_fp16 general

tap_columns: the Triton tap_columns kernel with one fixed config (64 x 128 x 32, 4 warps, 3 stages), not autotuned,
so that the profiled launch is that config's. general: the general fused kernel (forward.py) likewise, in the config
`auto` chose for vae_k4s2p1_fp16 in the forty-third session's sweeps (256 x 64 x 64, 8 warps, 3 stages). tiled: the
tiled GEMM (k2 s2 layers) with the config given as diag_tiled.py's --extra-configs write it (default 128 x 128 x 64,
swapped, 8 warps, 3 stages). TF32 mode, or with --tf32-off anywhere among the arguments TF32 off (3xFP16 in the CUDA
phase correlation).
"""

import pathlib
import sys

import torch

import convt3d
from convt3d.backends.triton import forward, tiled
from convt3d.bench.protocol import relative_error
from convt3d.bench.workloads import sweep_layers

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from diag_tiled import parse_config  # noqa: E402

TAP_COLUMNS = dict(KERNEL="tap_columns", BLOCK_M=64, BLOCK_N=128, BLOCK_CI=32, num_warps=4, num_stages=3)
GENERAL = dict(BLOCK_M=256, BLOCK_CO=64, BLOCK_CI=64, num_warps=8, num_stages=3, PER_SM=0)

arguments = [a for a in sys.argv[1:] if a != "--tf32-off"]
name, backend = arguments[0], arguments[1]
torch.backends.cudnn.allow_tf32 = "--tf32-off" not in sys.argv
layer = sweep_layers(name)[0]
_, x, w, b, reference = layer.kernel_case("cuda")
args = (layer.stride, layer.padding, layer.output_padding, layer.groups, layer.dilation)
tiled_config = parse_config(arguments[2] if len(arguments) > 2 else "128x128x64s1w8n3")
for _ in range(6):
    if backend == "tap_columns":
        y = forward.conv_transpose3d_triton(x, w, b, layer.plan(), config=TAP_COLUMNS)
    elif backend == "general":
        y = forward.conv_transpose3d_triton(x, w, b, layer.plan(), config=GENERAL)
    elif backend == "tiled":
        y = tiled.conv_transpose3d_tiled(x, w, b, layer.plan(), config=tiled_config)
    else:
        y = convt3d.conv_transpose3d(x, w, b, *args, backend=backend)
torch.cuda.synchronize()
print(name, backend, "rel. err. vs float64", relative_error(y, reference))
