"""Launch convt3d's Triton forward on problem 77 a few times with one fixed config, for ncu.

    ncu --clock-control none -k regex:conv_transpose3d --launch-skip 2 --launch-count 1 \
        python3 benchmarks/profile_once.py [BLOCK_M BLOCK_CO BLOCK_CI warps stages precision]
"""

import sys

import torch

from convt3d.backends.triton.forward import conv_transpose3d_triton
from convt3d.bench.workloads import PROBLEM_77

args = list(map(int, sys.argv[1:])) or [128, 64, 32, 4, 3, 1]
cfg = dict(zip(("BLOCK_M", "BLOCK_CO", "BLOCK_CI", "num_warps", "num_stages"), args[:5]), PER_SM=0)
plan = PROBLEM_77.plan()
x = torch.rand(PROBLEM_77.input_shape, device="cuda")
w = torch.randn(PROBLEM_77.weight_shape(), device="cuda") * 0.05
for _ in range(4):
    conv_transpose3d_triton(x, w, None, plan, precision=args[5], config=cfg)
torch.cuda.synchronize()
