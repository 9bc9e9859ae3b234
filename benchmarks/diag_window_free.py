"""Problem 77's correlation reading the input itself rather than the operand pass's window: the pass then writes only
the window rows' largest magnitudes and the weight's FP16 halves.

    PYTHONPATH=src python3 benchmarks/diag_window_free.py [--iters 100] [--rounds 2]

Why: the library's forward is out.zero_() (0.125 ms), the operand pass (window.correlation_operands, 0.028-0.032 ms:
it reads the input, 33.5 MB, and writes its channels-last window, 42.6 MB, with each window row's largest magnitude)
and row_runs.py's correlation, which reads the window plane by plane and splits it into FP16 in shared memory. The
fill and the pass do not overlap: in one launch they took 0.150 ms against 0.125 + 0.029 in turn, the pass's bytes at
the bandwidth (diag_fused_fill.py, sixty-seventh session). So the window's 85 MB (written, then read) is what to cut.
Here the correlation reads each plane's 16-channel units straight from the input (N, C, D, H, W), 16 loads of one
channel each, lanes along the input's rows, zero outside it (the window's padding), and splits them as before; the
pass (one Triton launch) writes the row maxima in the window's layout (each row's maximum is its input row's: the
padding adds zeros) and the weight's halves with window.py's own function.

Since the sixty-eighth session that correlation is the library's (row_runs.py's INPUT_DIRECT, launched here through
cuda.correlate's direct in both precisions, though the library takes it in FP16 alone), and this script runs it; the
sixty-eighth session's call 1 ran the same plane load patched into row_runs.py's source (this script at 25647eb). Its
library rows take the window, as the library did before.

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call). The operands of the pass are
compared with correlation_operands' (bitwise: block maxima, weight halves, inverse scales) and every forward's output,
NaN-poisoned before its first call, with the library's forward (bitwise: the same values, scales and MMAs), float64
and F.conv_transpose3d (KernelBench's check).
"""

import argparse

import torch
import triton
import triton.language as tl

from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.triton import window as window_module
from convt3d.backends.triton.window import _finite_magnitude, _weight_halves, correlation_operands
from diag_overlap import checked
from p77_correlation import Timings, correlation_geometry, library_forward, modes, problem_77


@triton.jit
def maxima_and_weights_kernel(
    x_ptr, block_max_ptr, weight_ptr, taps_ptr, inverse_ptr,
    WEIGHT_PROGRAMS, SN, SC, SD, SH, D, H, XD, XH, START_D, START_H,
    TAPS, O, I, WO, WI, WD, WH, WW, KH, KW,
    C: tl.constexpr, W: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_I: tl.constexpr,
    BLOCK_TAPS: tl.constexpr,
):
    """Programs below WEIGHT_PROGRAMS: an output channel's weight halves (window._weight_halves); the others: window
    row (n, a, b)'s largest finite magnitude, that of input row (n, a + START_D, b + START_H) or zero outside."""
    program = tl.program_id(0)
    if program < WEIGHT_PROGRAMS:
        _weight_halves(weight_ptr, taps_ptr, inverse_ptr, program, TAPS, O, I, WO, WI, WD, WH, WW, KH, KW, BLOCK_I,
                       BLOCK_TAPS)
    else:
        row = program - WEIGHT_PROGRAMS  # (n * XD + a) * XH + b
        n = row // XH // XD
        c = tl.arange(0, BLOCK_C)[:, None]
        w = tl.arange(0, BLOCK_W)[None, :]
        d = row // XH % XD + START_D + w * 0  # broadcast: the interpreter cannot mask with scalars
        h = row % XH + START_H + w * 0
        ok = (c < C) & (w < W) & (d >= 0) & (d < D) & (h >= 0) & (h < H)
        value = tl.load(x_ptr + n.to(tl.int64) * SN + c * SC + d * SD + h * SH + w, mask=ok, other=0.0)
        tl.store(block_max_ptr + row, tl.max(tl.max(_finite_magnitude(value), 1), 0))


def window_free_operands(x, w, start, extent):
    """The pass for a contiguous input x: a function (poisoned: its outputs NaN-filled first) that launches it and
    returns (weight halves, (block maxima, their block's columns, inverse scales)) as correlation_operands' split 2."""
    _, scalars, options, window_shape, block_p = window_module._geometry(
        0, tuple(x.shape), tuple(x.stride()), tuple(start), tuple(extent), tuple(w.shape), w.stride(), False, 2)
    assert window_shape[3] <= block_p  # one column block a row: a row's maximum is its input row's
    (_, _, _, sn, sc, sd, sh, _, d, h, width, xd, xh, _, start_d, start_h, _, tap_elements, o, i, wo, wi, wd, wh, ww,
     kh, kw) = scalars
    options = dict(options)
    rows = window_shape[0] * xd * xh

    def run(poisoned: bool = False):
        taps = torch.empty((*w.shape[2:], o, 2 * i), dtype=torch.float16, device=x.device)
        block_max = torch.empty((*window_shape[:3], 1), dtype=torch.float32, device=x.device)
        inverse = torch.empty(o, dtype=torch.float32, device=x.device)
        if poisoned:  # (for the check: every value the pass leaves is its own)
            for written in (taps, block_max, inverse):
                written.fill_(float("nan"))
        maxima_and_weights_kernel[(o + rows,)](
            x, block_max, w, taps, inverse, o, sn, sc, sd, sh, d, h, xd, xh, start_d, start_h,
            tap_elements // (o * i), o, i, wo, wi, wd, wh, ww, kh, kw, C=x.shape[1], W=width,
            BLOCK_C=options["BLOCK_C"], BLOCK_W=triton.next_power_of_2(width), BLOCK_I=options["BLOCK_I"],
            BLOCK_TAPS=options["BLOCK_TAPS"], num_warps=4)
        return taps, (block_max, block_p, inverse)

    return run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    x, w, plan, phase_list = problem_77()
    timings = Timings(args.iters)
    for mode, split, reference, eager in modes(x, w):
        library, expected = library_forward(x, w, direct_input=False)  # (the library before it read the input)
        out = torch.empty(plan.output_shape, device="cuda")
        start, extent, geometry = correlation_geometry(plan, phase_list, split, out.stride())
        operands = window_free_operands(x, w, start, extent)
        direct = cuda_phases.input_direct(x, plan, phase_list, split)

        made = correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False, split=split)
        taps, scales = operands(poisoned=True)
        print(mode, "operands equal to the pass's:", torch.equal(taps, made[1]),
              torch.equal(scales[0], made[2][0]), torch.equal(scales[2], made[2][2]), flush=True)

        def correlation(y, ops):
            taps, scales = ops
            cuda.correlate(x, taps, None, y, **geometry, scales=scales, split=split, direct=direct)

        def forward():
            y = torch.empty(plan.output_shape, device="cuda")
            y.zero_()
            correlation(y, operands())
            return y

        for round_ in range(args.rounds):
            library_forward(x, w, direct_input=False)
            timings.row(mode, f"library forward (round {round_ + 1})", library,
                        checked(library, expected, reference, eager))
            if round_ == 0:
                window, taps_made, scales_made = made
                timings.row(mode, "library: pass (correlation_operands)",
                            lambda: correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False,
                                                         split=split))
                timings.row(mode, "library: correlation into the lattice, operands made before",
                            lambda: cuda.correlate(window, taps_made, None, out, **geometry, scales=scales_made,
                                                   split=split))
            timings.row(mode, f"window-free forward (round {round_ + 1})", forward,
                        checked(forward, expected, reference, eager))
            if round_ == 0:
                timings.row(mode, "window-free: pass (maxima and weights)", operands)
                ops = operands()
                timings.row(mode, "window-free: correlation into the lattice, operands made before",
                            lambda: correlation(out, ops))
        del expected, reference, eager
    print(timings.table())


if __name__ == "__main__":
    main()
