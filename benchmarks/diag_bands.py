"""Problem 77's forward with every output element written once by the CUDA phase correlation (phase_conv.py's BANDS:
persistent programs of two warpgroups, each writing its tile's band of planes and rows whole, zeros and bias
included, in 16-byte stores; ORDERED: the warpgroups take turns at the tensor cores, so that one writes while the
other computes), against the library's forward (a fill of the whole output, then the correlation into the lattice).

    PYTHONPATH=<bda9193's src> python3 benchmarks/diag_bands.py [--iters 100] [--variants o4,f4,o1,o8] [--parts]

It needs the library of commit bda9193 (the experiment, reverted in the next commit). Thirty-ninth session
(benchmarks/RESULTS.md): bitwise equal to the library's forward, the kernel alone 0.31-0.42 ms against the library's
whole forward's 0.315. --parts times the kernel's parts instead (as scripts/_run3.py did in calls 3 and 4): the
library's correlation into a compact output and into the lattice, and BANDS with its writes left out (band_skip 1)
or its MMAs left out (band_skip 2), and with streaming stores (st.global.cs).

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call). Outputs are NaN-filled before
their checked call; each form's output is compared bitwise with the library's, by KernelBench's check with eager in
the same mode, and relative to float64.
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
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--variants", type=lambda text: [(v[0] == "o", int(v[1:])) for v in text.split(",")],
                        default="o4,f4", help="o|f (ordered or free) and the band loop's unroll, comma-separated")
    parser.add_argument("--parts", action="store_true", help="time the kernel's parts (the docstring)")
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    w = (torch.rand(32, 64, 3, 3, 3, device="cuda") - 0.5) * 0.2
    rows = []

    def row(mode, what, fn, check=None):
        t = time_cuda(fn, iters=args.iters)
        rows.append((mode, what, f"{t.mean_ms:.4f}", f"{t.min_ms:.4f}", check or ""))
        print(rows[-1], flush=True)

    if args.parts:
        parts(x, w, row)
        print(markdown_table(["mode", "what", "mean ms", "min ms", "check"], rows))
        return

    plan = make_plan(tuple(x.shape), tuple(w.shape), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
    for bias in (None, torch.randn(64, device="cuda")):
        reference = F.conv_transpose3d(x.double(), w.double(), None if bias is None else bias.double(), **P77)
        for mode, tf32 in (("TF32", True), ("TF32 off", False)):
            torch.backends.cudnn.allow_tf32 = tf32
            split = cuda_phases._split(tf32)
            mode = f"{mode}{'' if bias is None else ', bias'}"
            expected = F.conv_transpose3d(x, w, bias, **P77)
            library = lambda: convt3d.conv_transpose3d(x, w, bias, backend="torch", **P77)
            ours = library()
            if bias is None or not tf32:
                row(mode, "library forward (backend torch)", library,
                    f"{relative_error(ours, reference):.1e}, KB {kernelbench_check(ours, expected)}")
            operands, _, geometry, lattice = phase_case(x, w, plan, split)
            window, taps, scales = operands()
            out = torch.empty(plan.output_shape, device="cuda")
            for ordered, unroll in args.variants:
                kernel = lambda: cuda.correlate_bands(window, taps, bias, out, *geometry, lattice, scales, split,
                                                      ordered, band_unroll=unroll)

                def forward():
                    window, taps, scales = operands()
                    cuda.correlate_bands(window, taps, bias, out, *geometry, lattice, scales, split, ordered,
                                         band_unroll=unroll)
                name = f"{'ordered' if ordered else 'free'}, unroll {unroll}"
                out.fill_(float("nan"))
                kernel()
                torch.cuda.synchronize()
                check = (f"bitwise {torch.equal(out, ours)}, {relative_error(out, reference):.1e}, "
                         f"KB {kernelbench_check(out, expected)}, NaN {out.isnan().sum().item()}")
                row(mode, f"bands {name}: kernel alone", kernel, check)
                if bias is None:
                    row(mode, f"bands {name}: operand pass + kernel", forward)
    torch.backends.cudnn.allow_tf32 = True
    zero = torch.empty(16, 64, 33, 65, 65, device="cuda")
    row("", "out.zero_() (the write floor's measure)", zero.zero_)
    print(markdown_table(["mode", "what", "mean ms", "min ms", "check"], rows))


def phase_case(x, w, plan, split):
    """Problem 77's one phase, as the library's forward computes it (cuda_phases._forward_geometry): (its operand
    pass, a function returning (window, weight taps, scales); its axis phases; the correlation's geometry (grid,
    window offsets, tap counts, first taps, tap steps, dilation) as cuda.correlate and correlate_bands take it after
    their output's; its lattice's start and steps)."""
    phase_list = tuple(p for _, p in _regions(plan, True) if p is not None)
    start, extent, launches = cuda_phases._forward_geometry(plan, phase_list, split)
    counts, dilation, grid, ((phases, offsets, firsts, steps),) = launches[0]
    lattice = (*(p.out_start for p in phases), *(a.stride for a in plan.axes))
    operands = lambda: correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False, split=split)
    return operands, phases, (grid, offsets, counts, firsts, steps, dilation), lattice


def parts(x, w, row):
    """The kernel's parts, without bias (the docstring); the BANDS forms with all writes checked bitwise against the
    library's forward."""
    plan = make_plan(tuple(x.shape), tuple(w.shape), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
    for mode, tf32 in (("TF32", True), ("TF32 off", False)):
        torch.backends.cudnn.allow_tf32 = tf32
        split = cuda_phases._split(tf32)
        ours = convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
        operands, phases, geometry, lattice = phase_case(x, w, plan, split)
        window, taps, scales = operands()
        out = torch.empty(plan.output_shape, device="cuda")
        offset, _, strides = _lattice_geometry(plan, phases, out.stride())
        row(mode, "library correlation into the lattice", lambda: cuda.correlate(
            window, taps, None, out, offset, strides, *geometry, scales, split))
        compact = torch.empty(16, 64, 16, 32, 32, device="cuda")
        row(mode, "library correlation, compact output", lambda: cuda.correlate(
            window, taps, None, compact, 0, compact.stride(), *geometry, scales, split))
        for ordered, skip, stream, unroll in ((True, 0, False, 4), (True, 2, False, 4), (False, 0, False, 4),
                                              (False, 2, False, 4), (False, 0, False, 1), (False, 2, False, 1),
                                              (False, 0, True, 4), (True, 0, True, 4)):
            kernel = lambda: cuda.correlate_bands(window, taps, None, out, *geometry, lattice, scales, split, ordered,
                                                  band_skip=skip, band_stream=stream, band_unroll=unroll)
            out.fill_(float("nan"))
            kernel()
            torch.cuda.synchronize()
            name = (f"bands {'ordered' if ordered else 'free'}, unroll {unroll}"
                    f"{', no writes' if skip == 1 else ', no MMAs' if skip == 2 else ''}"
                    f"{', st.global.cs' if stream else ''}")
            row(mode, name, kernel, f"bitwise {torch.equal(out, ours)}" if skip == 0 else "")
    torch.backends.cudnn.allow_tf32 = True


if __name__ == "__main__":
    main()
