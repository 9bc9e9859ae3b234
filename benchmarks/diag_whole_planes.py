"""Problem 77's forward by whole planes (backends/cuda/phases.write_whole_planes) against the fill of the whole output
followed by the correlation into the lattice, in one process, in both precision modes.

    PYTHONPATH=<b85b1f0's src> python3 benchmarks/diag_whole_planes.py [--iters 50]

It needs the library of commit b85b1f0 (the experiment, reverted in the next commit). Thirty-third session, call 3
(benchmarks/RESULTS.md): the correlation writing its planes whole took 0.267 ms alone against 0.167 into the lattice,
and the forward 0.466 (fill first) / 0.746 (fill after) against 0.329 with the fill then the lattice.

The whole-planes forward: the correlation's programs write their lattice planes whole (phase_conv's WHOLE epilogue),
and plane_fill writes the other planes on a second stream at the same time, started before the operand pass
(FILL_FIRST) or after the correlation's launch. Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed
before each call), backend="torch" (the phase path) on problem 77 without bias; each form's output NaN-poisoned before
its first call and compared with the fill-first path's (bitwise), with float64 and with eager (KernelBench's check).
"""

import argparse

import torch
import torch.nn.functional as F

import convt3d
from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.torch_phase import _lattice_geometry, _regions
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.plan import make_plan

P77 = dict(stride=2, padding=1, dilation=2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    torch.manual_seed(0)
    layer = torch.nn.ConvTranspose3d(32, 64, 3, bias=False, device="cuda", **P77)
    w = layer.weight.detach()
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    plan = make_plan(tuple(x.shape), tuple(w.shape), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
    phase_list = tuple(p for _, p in _regions(plan, True) if p is not None)
    whole = cuda_phases.whole_planes(plan, phase_list, 0)
    rows = []

    def row(mode, what, fn, check=""):
        t = time_cuda(fn, iters=args.iters)
        rows.append((mode, what, f"{t.mean_ms:.4f}", f"{t.min_ms:.4f}", check))
        print(rows[-1], flush=True)

    def forward():
        return convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)

    out = torch.empty(plan.output_shape, device="cuda")
    row("-", "out.zero_()", out.zero_)
    stream = torch.cuda.current_stream().cuda_stream
    row("-", "plane_fill alone (132 programs)", lambda: cuda.fill_planes(out, None, *whole[1][:3], 132, stream))
    row("-", "plane_fill alone (528 programs)", lambda: cuda.fill_planes(out, None, *whole[1][:3], 528, stream))
    for mode, tf32 in (("TF32 (FP16)", True), ("TF32 off (3xFP16)", False)):
        torch.backends.cudnn.allow_tf32 = tf32
        reference = F.conv_transpose3d(x.double(), w.double(), None, **P77)
        eager = layer(x).detach()
        cuda.WHOLE_PLANES = False
        torch.cuda.empty_cache()
        expected = forward()
        split = cuda_phases._split(tf32)
        start, extent, ((counts, dilation, grid, strides, fields),) = cuda_phases._forward_launches(
            plan, phase_list, split, out.stride(), _lattice_geometry)
        window, taps, scales = cuda_phases.correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False,
                                                                split=split)
        row(mode, "correlation into the lattice alone (operands made before)",
            lambda: cuda.correlate_phases(window, taps, None, out, strides, grid, counts, dilation, fields, scales,
                                          split))
        row(mode, "correlation writing its planes whole alone (operands made before)",
            lambda: cuda.correlate_phases(window, taps, None, out, strides, grid, counts, dilation, fields, scales,
                                          split, whole[0]))
        for name, enabled, fill_first in (("fill, then the correlation into the lattice (the library before)", False,
                                           True),
                                          ("whole planes, plane_fill first", True, True),
                                          ("whole planes, plane_fill after the correlation's launch", True, False)):
            cuda.WHOLE_PLANES, cuda_phases.FILL_FIRST = enabled, fill_first
            torch.cuda.empty_cache()
            poisoned = torch.full(plan.output_shape, float("nan"), device="cuda")
            del poisoned  # the caching allocator hands this NaN block to the output, the forward's first allocation
            y = forward()
            torch.cuda.synchronize()
            check = (f"equal {bool(torch.equal(y, expected))}, {relative_error(y, reference):.1e}, "
                     f"KB check {kernelbench_check(y, eager)}")
            del y
            row(mode, name, forward, check)
        del expected, reference, eager
    cuda.WHOLE_PLANES, cuda_phases.FILL_FIRST = True, True
    torch.backends.cudnn.allow_tf32 = True
    print(markdown_table(["mode", "what", "mean ms", "min ms", "check"], rows))


if __name__ == "__main__":
    main()
