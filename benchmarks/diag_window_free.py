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
padding adds zeros) and the weight's halves with window.py's own function. The kernel is row_runs.py's source with its
plane load patched (PLANE_LOAD), the input's sizes, strides and the window's start compiled in as macros.

Since the sixty-eighth session the library's forward reads the input itself this way (row_runs.py's INPUT_DIRECT, the
pass window.correlation_operands(window=False)); this script's library rows take the window, as before.

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
from convt3d.backends.cuda import row_runs
from convt3d.backends.triton import window as window_module
from convt3d.backends.triton.window import _finite_magnitude, _weight_halves, correlation_operands
from diag_overlap import checked
from p77_correlation import (Timings, correlation_geometry, library_forward, modes, patched_row_runs, problem_77,
                             use_row_runs)

# row_runs.py's plane load, from its first line to the unit's 16 values in f[] (from the window's channels-last rows,
# four float4 a unit of 16 channels) ...
_PLANE_LOAD_START = row_runs.SOURCE.index("        const float4* src = ")
PLANE_LOAD = row_runs.SOURCE[_PLANE_LOAD_START:row_runs.SOURCE.index(
    "\n", row_runs.SOURCE.index("f[4 * q + 3] = v[h][q].w;", _PLANE_LOAD_START)) + 1]
# ... and from the input: unit u is channels 16 (u / (HH XW)) on of plane position u % (HH XW), lanes along a row.
INPUT_LOAD = """        const int x_d = qd + off_d + kd * DD + X_START_D;  // the plane's depth in the input
        const float* x_plane = x + (long long)n * X_SN + (long long)x_d * X_SD;
        #pragma unroll
        for (int base = 0; base < UNITS; base += 2 * THREADS) {
            float v[2][16];
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const int u = base + h * THREADS + tid;
                const int c16 = u / (HH * XW), p = u % (HH * XW);
                const int x_h = qh0 + off_h + p / XW + X_START_H, x_w = p % XW + X_START_W;
                const bool inside = u < UNITS && x_d >= 0 && x_d < X_D && x_h >= 0 && x_h < X_H && x_w >= 0
                                    && x_w < X_W;
                const float* at = x_plane + (long long)(16 * c16) * X_SC + (long long)x_h * X_SH + x_w;
                #pragma unroll
                for (int j = 0; j < 16; j++) v[h][j] = inside ? at[(long long)j * X_SC] : 0.f;
            }
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const int u = base + h * THREADS + tid;
                if (u >= UNITS) continue;
                const int c16 = u / (HH * XW), p = u % (HH * XW);
                float f[16];
                #pragma unroll
                for (int j = 0; j < 16; j++) f[j] = v[h][j];
"""


def input_macros(x, start) -> str:
    """The input's sizes and strides (elements; its rows contiguous) and the window's start, as INPUT_LOAD reads them."""
    assert x.stride(4) == 1
    names = dict(X_SN=x.stride(0), X_SC=x.stride(1), X_SD=x.stride(2), X_SH=x.stride(3), X_D=x.shape[2],
                 X_H=x.shape[3], X_W=x.shape[4], X_START_D=start[0], X_START_H=start[1], X_START_W=start[2])
    return "".join(f"#define {name} {value}\n" for name, value in names.items())


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
    """The pass for a contiguous input x: (the window's shape, a function (poisoned: its outputs NaN-filled first) that
    launches it and returns (weight halves, (block maxima, their block's columns, inverse scales)) as
    correlation_operands' split 2)."""
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

    return window_shape, run


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
        window_shape, operands = window_free_operands(x, w, start, extent)
        # correlate() takes the window's shape from its tensor and its address as the kernel's x: the input's, here.
        input_as_window = x.as_strided(window_shape, (0,) * 5)
        window_free = patched_row_runs((PLANE_LOAD, INPUT_LOAD), head=input_macros(x, start))

        made = correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False, split=split)
        taps, scales = operands(poisoned=True)
        print(mode, "operands equal to the pass's:", torch.equal(taps, made[1]),
              torch.equal(scales[0], made[2][0]), torch.equal(scales[2], made[2][2]), flush=True)

        def correlation(y, ops):
            taps, scales = ops
            cuda.correlate(input_as_window, taps, None, y, **geometry, scales=scales, split=split)

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
            use_row_runs(window_free)
            timings.row(mode, f"window-free forward (round {round_ + 1})", forward,
                        checked(forward, expected, reference, eager))
            if round_ == 0:
                timings.row(mode, "window-free: pass (maxima and weights)", operands)
                ops = operands()
                timings.row(mode, "window-free: correlation into the lattice, operands made before",
                            lambda: correlation(out, ops))
        del expected, reference, eager
    use_row_runs()
    print(timings.table())


if __name__ == "__main__":
    main()
