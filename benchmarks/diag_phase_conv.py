"""Problem 77's forward phase by the CUDA phase correlation (backends/cuda/phase_conv.py) on the GPU, in TF32 mode (TF32
and FP16, phase_conv.py's SPLIT 0 and 3) and with TF32 off (3xTF32 and 3xFP16, SPLIT 1 and 2): the correlation alone
into a compact output and into the output's lattice, the whole forward through it (backend="torch": operand pass,
fill, correlation), and a phase's grad_input (operand pass + correlation).

    PYTHONPATH=src python3 benchmarks/diag_phase_conv.py [--iters 50] [--tag new]

To compare two versions, run it with PYTHONPATH=<old or new>/src in alternating processes. Rows: bench.protocol.
time_cuda's mean and minimum in ms (L2 flushed before each call); the compact output is NaN-poisoned before its first
call; errors relative to float64, and KernelBench's check of the whole forward against F.conv_transpose3d in the same
mode.
"""

import argparse

import torch
import torch.nn.functional as F

import convt3d
from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.torch_phase import _lattice_geometry, _regions
from convt3d.backends.triton.window import correlation_operands
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.plan import make_plan

P77 = dict(stride=2, padding=1, dilation=2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--tag", default="", help="a label for this process's rows (old, new, ...)")
    args = parser.parse_args()
    torch.manual_seed(0)
    w = torch.randn(32, 64, 3, 3, 3, device="cuda") * 0.02
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    lattice = torch.randn(16, 64, 16, 32, 32, device="cuda")
    reference = F.conv_transpose3d(x.double(), w.double(), None, **P77)
    grad_input_reference = F.conv3d(lattice.double(), w.double(), None, 1, 1)
    plan = make_plan(tuple(x.shape), tuple(w.shape), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
    phase_list = tuple(p for _, p in _regions(plan, True) if p is not None)
    rows = []

    def row(mode, what, fn, error=""):
        t = time_cuda(fn, iters=args.iters)
        rows.append((args.tag, mode, what, f"{t.mean_ms:.4f}", f"{t.min_ms:.4f}", error))
        print(rows[-1], flush=True)

    for mode, split in (("TF32", 0), ("FP16", 3), ("3xTF32", 1), ("3xFP16", 2)):
        tf32 = split in (0, 3)
        torch.backends.cudnn.allow_tf32 = tf32
        if tf32:
            cuda.TF32_SPLIT = split
        else:
            cuda.SPLIT = split
        expected = F.conv_transpose3d(x, w, None, **P77)
        start, extent, launches = cuda_phases._forward_geometry(plan, phase_list, split)
        counts, dilation, grid, ((phases, offsets, firsts, steps),) = launches[0]  # its one phase
        window, taps, scales = correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False, split=split)
        compact = torch.full((16, 64, 16, 32, 32), float("nan"), device="cuda")
        into_compact = lambda: cuda.correlate(window, taps, None, compact, 0, compact.stride(), grid, offsets, counts,
                                              firsts, steps, dilation, scales, split)
        into_compact()
        row(mode, "correlation, compact output", into_compact,
            f"{relative_error(compact, reference[:, :, 1::2, 1::2, 1::2]):.1e}")
        out = torch.zeros(plan.output_shape, device="cuda")
        offset, _, strides = _lattice_geometry(plan, phases, out.stride())
        row(mode, "correlation into the lattice", lambda: cuda.correlate(
            window, taps, None, out, offset, strides, grid, offsets, counts, firsts, steps, dilation, scales, split))
        forward = lambda: convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
        y = forward()
        row(mode, "forward (backend torch)", forward,
            f"{relative_error(y, reference):.1e}, KB check {kernelbench_check(y, expected)}")
        grad_input = lambda: cuda_phases.phase_grad_input(lattice, w, plan, phases)
        row(mode, "grad_input (operand pass + correlation)", grad_input,
            f"{relative_error(grad_input(), grad_input_reference):.1e}")
    torch.backends.cudnn.allow_tf32 = True
    print(markdown_table(["process", "mode", "what", "mean ms", "min ms", "rel. err. vs float64"], rows))


if __name__ == "__main__":
    main()
