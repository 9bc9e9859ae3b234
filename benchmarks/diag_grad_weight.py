"""Problem 77's weight gradient on the H200: the CUDA kernel (backends/cuda/grad_weight.py) at several prefetch depths
against the Triton path (operand copies + kernel), and forward+backward of the module with each (GPU).

    PYTHONPATH=src python3 benchmarks/diag_grad_weight.py [--iters 50] [--ahead 2 4]

Rows: bench.protocol.time_cuda's mean and minimum (L2 flushed before each call), relative error against float64.
"""

import argparse

import torch
import torch.nn.functional as F

from convt3d.backends import cuda
from convt3d.backends.cuda import grad_weight, phases as cuda_phases
from convt3d.backends.torch_phase import _lattice_geometry
from convt3d.backends.triton import backward as triton_backward
from convt3d.backends.triton.forward import TF32
from convt3d.bench.protocol import relative_error, time_cuda
from convt3d.bench.workloads import PROBLEM_77
from diag_cuda_phases import forward_backward


def set_ahead(ahead: int) -> None:
    grad_weight.AHEAD = ahead
    cuda.grad_weight_config.cache_clear()
    cuda._grad_weight_kernel.cache_clear()
    cuda_phases._grad_weight_geometry.cache_clear()
    cuda_phases.grad_weight_unsupported.cache_clear()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--ahead", type=int, nargs="*", default=[2, 4])
    args = parser.parse_args()
    torch.manual_seed(0)
    eager, layer, xg, grad = PROBLEM_77.training_case("cuda")
    x = xg.detach()
    x64 = x.double().requires_grad_()
    w64 = eager.weight.detach().double().requires_grad_()
    F.conv_transpose3d(x64, w64, None, PROBLEM_77.stride, PROBLEM_77.padding, PROBLEM_77.output_padding,
                       PROBLEM_77.groups, PROBLEM_77.dilation).backward(grad.double())
    plan = PROBLEM_77.plan()
    (phase,) = plan.nonempty_phases
    phases = phase.axes
    offset, _, strides = _lattice_geometry(plan, phases, grad.stride())
    rows = []

    def row(what, fn, reference=None):
        t = time_cuda(fn, iters=args.iters)
        err = relative_error(fn(), reference) if reference is not None else float("nan")
        rows.append((what, t.mean_ms, t.min_ms, err))
        print(rows[-1], flush=True)

    fwd_bwd = lambda module: forward_backward(module, xg, grad)

    def triton_weight():
        copied, windows = triton_backward.phase_operands(grad, x, plan, phases, TF32)
        return triton_backward.phase_grad_weight(copied, x, plan, phases, TF32, lattice_rounded=True, windows=windows)

    row("grad_weight, Triton (operand copies + kernel)", triton_weight, w64.grad)
    for ahead in args.ahead:
        set_ahead(ahead)
        config = cuda.grad_weight_config(32, 64, (3, 3, 3), (1, 1, 1))
        if config is None:
            print(f"{ahead} rows ahead: the rings do not fit in shared memory")
            continue
        row(f"grad_weight, CUDA, {ahead} rows ahead ({config[-1]} B shared)",
            lambda: cuda_phases.phase_grad_weight(grad, offset, strides, x, plan, phases), w64.grad)
        row(f"forward+backward (module), CUDA grad_weight {ahead} ahead", fwd_bwd(layer))
    row("eager forward+backward", fwd_bwd(eager))
    print("| what | mean ms | min ms | rel. err. vs float64 |")
    print("|---|---|---|---|")
    for what, mean, low, err in rows:
        print(f"| {what} | {mean:.4f} | {low:.4f} | {err:.1e} |")


if __name__ == "__main__":
    main()
