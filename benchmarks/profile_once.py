"""Launch one of convt3d's Triton kernels on problem 77 a few times with one fixed config, for ncu.

    ncu --clock-control none -k regex:<kernel> --launch-skip 2 --launch-count 1 \
        python3 benchmarks/profile_once.py forward [BLOCK_M BLOCK_CO BLOCK_CI warps stages precision]
    ... python3 benchmarks/profile_once.py phase_conv [BLOCK_M BLOCK_OC BLOCK_IC warps stages precision]
    ... python3 benchmarks/profile_once.py grad_weight [BLOCK_CO BLOCK_N warps stages per_sm precision]
"""

import sys

import torch

from convt3d.backends import torch_phase as tp
from convt3d.backends.triton.backward import phase_grad_weight
from convt3d.backends.triton.forward import conv_transpose3d_triton
from convt3d.backends.triton.phase_conv import phase_conv
from convt3d.bench.workloads import PROBLEM_77

kernel = sys.argv[1] if len(sys.argv) > 1 else "forward"
args = list(map(int, sys.argv[2:]))
plan = PROBLEM_77.plan()
(phase,) = plan.nonempty_phases
phases = phase.axes
x = torch.rand(PROBLEM_77.input_shape, device="cuda")
w = torch.randn(PROBLEM_77.weight_shape(), device="cuda") * 0.05
g = torch.randn(plan.output_shape, device="cuda")
lattice = (slice(None), slice(None), *(tp._out_slice(p, a) for p, a in zip(phases, plan.axes)))
for _ in range(4):
    if kernel == "forward":
        args = args or [128, 64, 32, 4, 3, 1]
        cfg = dict(zip(("BLOCK_M", "BLOCK_CO", "BLOCK_CI", "num_warps", "num_stages"), args[:5]), PER_SM=0)
        conv_transpose3d_triton(x, w, None, plan, precision=args[5], config=cfg)
    elif kernel == "phase_conv":
        args = args or [128, 64, 32, 4, 3, 1]
        compact = torch.empty(g[lattice].shape, device="cuda")
        phase_conv(x, [-p.input_start for p in phases], tp._phase_weight(w, phases, 1),
                   [p.input_dilation for p in phases], 1, compact, precision=args[5], config=tuple(args[:5]))
    else:
        args = args or [64, 256, 8, 3, 4, 1]
        phase_grad_weight(g[lattice], x, plan, phases, precision=args[5], config=tuple(args[:5]))
torch.cuda.synchronize()
