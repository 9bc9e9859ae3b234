"""Problem 77 with TF32 off: the CUDA phase correlation (3xFP16, 3xTF32) against cuDNN's float32 and eager (GPU).

    PYTHONPATH=src python3 benchmarks/diag_3xtf32.py [--iters 100]

Each row: bench.protocol.time_cuda's mean and minimum (L2 flushed and the GPU idle before each call, as KernelBench
times) and the relative error against float64. "cuda" rows use the CUDA kernels (in 3xTF32 with TF32 off: the
forward and grad_input, in 3xFP16 since the twenty-fifth session; grad_weight stays Triton's 3xTF32), "cudnn" rows the
same code with them off (backends.cuda.ENABLED False). The pieces: the 3xTF32 and 3xFP16 operand passes and
correlations against the TF32 ones, and 3xTF32's forward error and correlation time with partial sums added every 1,
2 or 4 k-steps (phase_conv.PROMOTE).
"""

import argparse

import torch
import torch.nn.functional as F

import convt3d
from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.bench.protocol import relative_error, time_cuda
from convt3d.bench.workloads import PROBLEM_77
from diag_cuda_phases import P77, forward_backward, use_cuda_kernels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    iters = parser.parse_args().iters
    torch.manual_seed(0)
    eager, layer, x, grad = PROBLEM_77.training_case(torch.device("cuda"))
    x = x.detach()
    ref = F.conv_transpose3d(x.double(), eager.weight.double(), None, **P77)
    rows = []

    def row(what, fn, out=None, reference=ref):
        t = time_cuda(fn, iters=iters)
        err = relative_error(out, reference) if out is not None else float("nan")
        rows.append((what, t.mean_ms, t.min_ms, err))
        print(rows[-1], flush=True)

    xg = x.clone().requires_grad_()
    fwd_bwd = lambda module: forward_backward(module, xg, grad)

    x64 = x.double().requires_grad_()
    w64 = eager.weight.detach().double().requires_grad_()
    F.conv_transpose3d(x64, w64, None, **P77).backward(grad.double())
    forward = lambda: convt3d.conv_transpose3d(x, eager.weight, None, backend="torch", **P77)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        row("eager forward, TF32 off", lambda: eager(x), eager(x))
        for on in (True, False):
            use_cuda_kernels(on)
            name = "cuda" if on else "cudnn"
            row(f"{name}: forward (backend torch), TF32 off", forward, forward())
        row("eager forward+backward, TF32 off", fwd_bwd(eager))
        for on in (True, False):
            use_cuda_kernels(on)
            name = "cuda" if on else "cudnn"
            row(f"{name}: forward+backward (module), TF32 off", fwd_bwd(layer))
            layer.zero_grad(set_to_none=True)
            xg.grad = None
            layer(xg).backward(grad)
            print(name, "grad_input rel. err.", relative_error(xg.grad, x64.grad), "grad_weight rel. err.",
                  relative_error(layer.weight.grad, w64.grad), flush=True)
        use_cuda_kernels(True)
    row("cuda: forward (backend torch), TF32", forward, forward())

    # The pieces, 3xTF32 against TF32.
    from convt3d.backends.torch_phase import _lattice_geometry, _regions
    from convt3d.backends.triton.window import correlation_operands

    plan = PROBLEM_77.plan()
    phase_list = tuple(p for _, p in _regions(plan, True) if p is not None)
    out = torch.zeros(plan.output_shape, device="cuda")
    compact = torch.empty(16, 64, 16, 32, 32, device="cuda")
    for split, name in ((0, "TF32"), (2, "3xFP16"), (1, "3xTF32")):  # (3xTF32 last: the loop below times it)
        start, extent, launches = cuda_phases._forward_geometry(plan, phase_list, split)
        row(f"{name}: operand pass", lambda: correlation_operands(x, 0, x.shape, x.stride(), start, extent,
                                                                  eager.weight, False, split))
        window, taps, scales = correlation_operands(x, 0, x.shape, x.stride(), start, extent, eager.weight, False,
                                                    split)
        counts, dilation, grid, ((phases, offsets, firsts, steps),) = launches[0]  # its one phase
        offset, _, strides = _lattice_geometry(plan, phases, out.stride())
        row(f"{name}: correlation into the lattice", lambda: cuda.correlate(
            window, taps, None, out, offset, strides, grid, offsets, counts, firsts, steps, dilation, scales))
        row(f"{name}: correlation, compact output", lambda: cuda.correlate(
            window, taps, None, compact, 0, compact.stride(), grid, offsets, counts, firsts, steps, dilation, scales))
    row("out.zero_() (the fill)", out.zero_)
    # How often 3xTF32's partial sums go into the sums: error and time (compact output) per interval in k-steps.
    default, cuda.SPLIT = cuda.phase_conv.PROMOTE, 1
    for promote in (1, 2, 4):
        cuda.phase_conv.PROMOTE = promote
        cuda._kernel.cache_clear()
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            row(f"3xTF32, promote every {promote} k-steps: forward (backend torch)", forward, forward())
            row(f"3xTF32, promote every {promote} k-steps: correlation, compact", lambda: cuda.correlate(
                window, taps, None, compact, 0, compact.stride(), grid, offsets, counts, firsts, steps, dilation))
    cuda.phase_conv.PROMOTE, cuda.SPLIT = default, 2
    cuda._kernel.cache_clear()

    print("| what | mean ms | min ms | rel. err. vs float64 |")
    print("|---|---|---|---|")
    for what, mean, low, err in rows:
        print(f"| {what} | {mean:.4f} | {low:.4f} | {err:.1e} |")


if __name__ == "__main__":
    main()
