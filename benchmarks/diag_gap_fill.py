"""Problem 77's forward with the fill leaving the lattice rows out, at full occupancy and in turn: a fill of every
output row but the phase's lattice rows (diag_side_fill.py's GAP_FILL, here in many programs of several warps), then
the operand pass and the correlation writing its lattice rows whole (diag_full_rows.py's store in row_runs.py's
kernel, reading the input itself in FP16 as the library does).

    PYTHONPATH=src python3 benchmarks/diag_gap_fill.py [--iters 100] [--rounds 2] [--fills plain1056x8,...]

Why: the library writes the lattice rows twice, zeros by out.zero_() (0.124 ms for 571 MB), then the correlation's
values into every other element, its sectors half written (so the L2 reads them back from DRAM: 184 MB read under
Nsight Compute, sixty-fifth session). Written once, whole, by the correlation, the fill has 434 MB left. The sixty-
fifth session's diag_side_fill ran this split with fills of one warp a program (to fit beside the correlation), which
were 5-14 times slower than zero_(); diag_full_rows and diag_fill_gaps wrote rows whole after a full fill or the gaps
from the correlation's own programs. A fill of the gaps at full occupancy, in turn with the rest, was not measured.

What it found (sixty-ninth session, benchmarks/RESULTS.md): slower, on both counts. The gap fill took 0.248-0.264 ms
(minima, 528 to 2,112 programs) against out.zero_()'s 0.124 for the whole output: a warp a plane, its runs of rows 260
bytes long. And the pass with the correlation writing its rows whole took 0.176 ms in FP16 and 0.238 in 3xFP16
(minima) against about 0.14 and 0.22 for the library's (its forward less zero_()), as diag_full_rows and
diag_side_fill found. The whole forward: 0.428-0.445 ms against the library's 0.262-0.264 in FP16, 0.495-0.512 against
0.342-0.343 in 3xFP16 (minima), bitwise the library's output.

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call). Every composed forward's
output, NaN-poisoned before its first call, is compared with the library's forward (bitwise), float64 and
F.conv_transpose3d (KernelBench's check).
"""

import argparse

import torch

from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.triton.launch import _current_stream
from convt3d.backends.triton.window import correlation_operands
from diag_overlap import checked
from diag_side_fill import full_rows_row_runs, gap_fill, gap_fill_kernel
from p77_correlation import Timings, composed, correlation_geometry, library_forward, modes, problem_77, use_row_runs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fills", default="plain1056x8,plain2112x4,plain528x8",
                        help="gap fills as plain<programs>x<warps>, ','-separated")
    args = parser.parse_args()
    x, w, plan, phase_list = problem_77()
    fills = [tuple(int(v) for v in f.removeprefix("plain").split("x")) for f in args.fills.split(",")]
    kernels = {warps: gap_fill_kernel("plain", warps) for _, warps in fills}
    timings = Timings(args.iters)

    for mode, split, reference, eager in modes(x, w):
        direct_input = split == 3  # (the library's: FP16 reads the input, 3xFP16 the window)
        library, expected = library_forward(x, w, direct_input=direct_input)
        out = torch.empty(plan.output_shape, device="cuda")
        start, extent, geometry = correlation_geometry(plan, phase_list, split, out.stride())
        direct = cuda_phases.input_direct(x, plan, phase_list, split) if direct_input else None
        fill = lambda blocks, warps: gap_fill(kernels[warps], blocks, plan, out.stride(), geometry)

        def pass_and_full_rows(y):
            window, taps, scales = correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False,
                                                        split=split, window=not direct_input)
            cuda.correlate(x if direct_input else window, taps, None, y, **geometry, scales=scales, split=split,
                           direct=direct)

        for round_ in range(args.rounds):
            library_forward(x, w, direct_input=direct_input)
            timings.row(mode, f"library forward (round {round_ + 1})", library,
                        checked(library, expected, reference, eager) if round_ == 0 else "")
            use_row_runs(full_rows_row_runs, direct_input=direct_input)
            if round_ == 0:
                timings.row(mode, "out.zero_()", out.zero_)
                for blocks, warps in fills:
                    timings.row(mode, f"gap fill {blocks}x{warps} alone",
                                lambda: fill(blocks, warps)(out, _current_stream(0)))
                timings.row(mode, "pass + full rows (no fill)", lambda: pass_and_full_rows(out))
            for blocks, warps in fills:
                forward = composed(plan, fill(blocks, warps), pass_and_full_rows)
                timings.row(mode, f"gap fill {blocks}x{warps}, pass, full rows (round {round_ + 1})", forward,
                            checked(forward, expected, reference, eager) if round_ == 0 else "")
        del expected, reference, eager
    library_forward(x, w)
    print(timings.table())


if __name__ == "__main__":
    main()
