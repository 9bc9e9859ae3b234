"""Problem 77 with the CUDA kernels (backends/cuda) against cuDNN and Triton for the phases, and against eager (GPU).

    PYTHONPATH=src python3 benchmarks/diag_cuda_phases.py [--iters 100]

Each row: bench.protocol.time_cuda's mean and minimum (L2 flushed and the GPU idle before each call, as KernelBench
times), the relative error against float64, and for the forward KernelBench's check against the eager module.
"cuda" rows use the CUDA kernels (forward phase, grad_input, grad_weight), "cudnn" rows the same code with them off
(backends.cuda.ENABLED False: cuDNN and the Triton weight gradient), "grad_weight by Triton" the CUDA kernels but
that; all with backend="torch" for the forward, and the module's autograd for the backward. The pieces: the operand
pass (window + weight taps) and the correlation kernel alone, forward and grad_input shapes; the compact correlation
beside a fill of the output on a second stream; grad_input and grad_weight in place against the copies; other tile
row counts than config()'s.
"""

import argparse

import torch
import torch.nn.functional as F

import convt3d
from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda

P77 = dict(stride=2, padding=1, dilation=2)


def use_cuda_kernels(on: bool) -> None:
    cuda.ENABLED = on
    cuda_phases.forward_unsupported.cache_clear()
    cuda_phases.grad_input_unsupported.cache_clear()
    cuda_phases.grad_weight_unsupported.cache_clear()


def forward_backward(module, x, grad):
    """One forward+backward of module from x (requiring grad) with grad, as `bench --backward` runs them."""
    def run():
        module.zero_grad(set_to_none=True)
        x.grad = None
        module(x).backward(grad)
    return run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    iters = parser.parse_args().iters
    torch.manual_seed(0)
    eager = torch.nn.ConvTranspose3d(32, 64, 3, bias=False, **P77).cuda()
    layer = convt3d.convert(torch.nn.ConvTranspose3d(32, 64, 3, bias=False, **P77).cuda())
    layer.load_state_dict(eager.state_dict())
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    ref = F.conv_transpose3d(x.double(), eager.weight.double(), None, **P77)
    expected = eager(x)
    rows = []

    def row(what, fn, out=None, reference=ref):
        """fn's timing; with out, out's error against reference (and, for the forward, KernelBench's check)."""
        t = time_cuda(fn, iters=iters)
        err = relative_error(out, reference) if out is not None else float("nan")
        check = kernelbench_check(out, expected) if out is not None and reference is ref else ""
        rows.append((what, t.mean_ms, t.min_ms, err, check))
        print(rows[-1], flush=True)

    row("eager forward", lambda: eager(x), eager(x))
    for on in (True, False):
        use_cuda_kernels(on)
        name = "cuda" if on else "cudnn"
        fwd = lambda: convt3d.conv_transpose3d(x, eager.weight, None, backend="torch", **P77)
        row(f"{name}: forward (backend torch)", fwd, fwd())
    # Forward + backward, as `bench --backward` runs them.
    xg = x.clone().requires_grad_()
    grad = torch.randn(16, 64, 33, 65, 65, device="cuda")
    fwd_bwd = lambda module: forward_backward(module, xg, grad)

    row("eager forward+backward", fwd_bwd(eager))
    for on in (True, False):
        use_cuda_kernels(on)
        row(f"{'cuda' if on else 'cudnn'}: forward+backward (module)", fwd_bwd(layer))
    use_cuda_kernels(True)
    unsupported = cuda_phases.grad_weight_unsupported
    cuda_phases.grad_weight_unsupported = lambda *args: "off (diagnostic)"
    row("cuda, grad_weight by Triton: forward+backward (module)", fwd_bwd(layer))
    cuda_phases.grad_weight_unsupported = unsupported
    # Gradients against float64, with the CUDA kernels.
    layer.zero_grad(set_to_none=True)
    xg.grad = None
    layer(xg).backward(grad)
    x64 = x.double().requires_grad_()
    w64 = eager.weight.detach().double().requires_grad_()
    F.conv_transpose3d(x64, w64, None, **P77).backward(grad.double())
    print("grad_input rel. err.", relative_error(xg.grad, x64.grad), "grad_weight rel. err.",
          relative_error(layer.weight.grad, w64.grad), flush=True)

    # The pieces.
    from convt3d.backends.torch_phase import _lattice_geometry, _regions
    from convt3d.backends.triton.window import correlation_operands
    from convt3d.plan import make_plan

    plan = make_plan(tuple(x.shape), tuple(eager.weight.shape), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
    phase_list = tuple(p for _, p in _regions(plan, True) if p is not None)
    start, extent, launches = cuda_phases._forward_geometry(plan, phase_list, False)
    row("forward operand pass", lambda: correlation_operands(x, 0, x.shape, x.stride(), start, extent, eager.weight,
                                                             False))
    window, taps, _ = correlation_operands(x, 0, x.shape, x.stride(), start, extent, eager.weight, False)
    out = torch.zeros(plan.output_shape, device="cuda")
    counts, dilation, grid, ((phases, offsets, firsts, steps),) = launches[0]  # its one phase
    offset, _, strides = _lattice_geometry(plan, phases, out.stride())
    row("forward correlation into the lattice", lambda: cuda.correlate(
        window, taps, None, out, offset, strides, grid, offsets, counts, firsts, steps, dilation))
    compact = torch.empty(16, 64, 16, 32, 32, device="cuda")
    row("forward correlation, compact output", lambda: cuda.correlate(
        window, taps, None, compact, 0, compact.stride(), grid, offsets, counts, firsts, steps, dilation))
    row("out.zero_() (the fill)", out.zero_)
    side = torch.cuda.Stream()

    def overlapped():  # the compact correlation and a fill of the whole output at the same time
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out.zero_()
        cuda.correlate(window, taps, None, compact, 0, compact.stride(), grid, offsets, counts, firsts, steps,
                       dilation)
        torch.cuda.current_stream().wait_stream(side)
    row("compact correlation beside out.zero_() on a second stream", overlapped)
    lattice = torch.randn(16, 64, 16, 32, 32, device="cuda")
    g_start, g_extent, *_ = cuda_phases._grad_input_geometry(plan, phases, False)
    row("grad_input operand pass", lambda: correlation_operands(lattice, 0, lattice.shape, lattice.stride(), g_start,
                                                                g_extent, eager.weight, True))
    row("grad_input (operand pass + correlation)", lambda: cuda_phases.phase_grad_input(lattice, eager.weight, plan,
                                                                                        phases))
    row("cuDNN grad_input's conv3d (NCDHW)", lambda: F.conv3d(lattice, eager.weight, None, 1, 1))
    # The weight gradient: the CUDA kernel reading x and grad_output in place, against the Triton path (its operand
    # copies, then its kernel).
    from convt3d.backends.triton import backward as triton_backward
    from convt3d.backends.triton.forward import TF32

    g_offset, _, g_strides = _lattice_geometry(plan, phases, grad.stride())
    row("grad_input in place from grad_output (operand pass + correlation)",
        lambda: cuda_phases.phase_grad_input_in_place(grad, g_offset, g_strides, eager.weight, plan, phases))

    def triton_weight():
        copied, windows = triton_backward.phase_operands(grad, x, plan, phases, TF32)
        return triton_backward.phase_grad_weight(copied, x, plan, phases, TF32, lattice_rounded=True, windows=windows)

    cuda_weight = lambda: cuda_phases.phase_grad_weight(grad, g_offset, g_strides, x, plan, phases)
    row("grad_weight, CUDA kernel in place", cuda_weight, cuda_weight(), w64.grad)
    row("grad_weight, Triton (operand copies + kernel)", triton_weight, triton_weight(), w64.grad)
    # Tile rows: what config() chooses (two programs per multiprocessor) against other counts.
    g_window, g_taps, _ = correlation_operands(lattice, 0, lattice.shape, lattice.stride(), g_start, g_extent,
                                               eager.weight, True)
    grad_input = torch.empty(16, 32, 16, 32, 32, device="cuda")
    real_config = cuda.config
    for c_in, c_out, rows_choice in ((64, 32, 8), (32, 64, 16), (32, 64, 4)):
        smem = cuda.phase_conv.shared_bytes(c_in, min(c_out, 64), (3, 3, 3), (1, 1, 1), rows_choice)
        cuda.config = lambda *a, r=rows_choice, s=smem: (r, a[1] if a[1] <= 64 else 64, s, a[0])
        cuda._kernel.cache_clear()
        if c_in == 64:
            run = lambda: cuda.correlate(g_window, g_taps, None, grad_input, 0, grad_input.stride(), (16, 32, 32),
                                         (0, 0, 0), (3, 3, 3), (0, 0, 0), (1, 1, 1), (1, 1, 1))
        else:  # (the window's 34 rows serve 4, 8 and 16 tile rows alike: 32 rows are whole tiles of each)
            run = lambda: cuda.correlate(window, taps, None, compact, 0, compact.stride(), grid, offsets, counts,
                                         firsts, steps, dilation)
        try:
            row(f"correlation {c_in} -> {c_out} with {rows_choice} tile rows ({smem} B shared)", run)
        except RuntimeError as error:
            print(c_in, c_out, rows_choice, "failed:", error)
    cuda.config = real_config
    cuda._kernel.cache_clear()


    print("| what | mean ms | min ms | rel. err. vs float64 | KernelBench check |")
    print("|---|---|---|---|---|")
    for what, mean, low, err, check in rows:
        print(f"| {what} | {mean:.4f} | {low:.4f} | {err:.1e} | {check} |")


if __name__ == "__main__":
    main()
