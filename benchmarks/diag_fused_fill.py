"""Problem 77's forward with the output's zero fill and the correlation's operand pass in one launch: does the pass
hide in the fill?

    PYTHONPATH=src python3 benchmarks/diag_fused_fill.py [--iters 100] [--rounds 2] [--forms every1,every8,...]

Why: the library's forward is three launches in turn, out.zero_() (0.125 ms, bound by writing 571 MB), the operand
pass (window.correlation_operands: 0.035-0.046 ms, reading the input and writing its channels-last window) and the
correlation into the lattice (0.14 ms in FP16). The pass moves about 76 MB, far from the bandwidth in its time, so
beside a fill that writes at the bandwidth it might cost little. Earlier sessions ran zero_() on a second stream beside
the pass (sixty-third session, diag_fill_chunks.py: 0.314 against the library's 0.311 ms); there the fill's grid,
launched first, held the multiprocessors. Here one Triton launch takes both: the pass's programs (window.py's own
functions, the same operands) at every EVERY-th program of the grid from the first on, the fill's blocks of
FILL_BLOCK zeros in the programs between and after, in the output's order or, with REVERSE, from its end (so that
the first samples' lines, which the correlation writes first, are the L2's most recent).

What it found (sixty-seventh session, benchmarks/RESULTS.md): no. The fused launch took 0.147-0.154 ms by its minima
with the pass's programs first or every second (0.17 with them spread over the grid), against 0.125 + 0.028 in turn:
the pass's bytes at the fill's bandwidth. The forward with it was no faster than the library's (minima 0.283-0.289
against 0.284 ms in FP16).

Sixty-eighth session: the pass as the library's forward now runs it, in FP16 without the window (the correlation
reads the input itself: row_runs.py's INPUT_DIRECT), so that it reads the input's 33.5 MB and writes little; the
question again, with the correlation reading the input.

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call). "fill": the launch with no
pass programs; "fused": the launch alone; "forward": the fused launch and the library's correlation (cuda.correlate,
row_runs.py's kernel) on its operands. Every forward's output, NaN-poisoned before its first call, is compared with
the library's forward (bitwise: the same operands and correlation), float64 and F.conv_transpose3d (KernelBench's
check); every fused launch's operands with correlation_operands' (bitwise) and its output with zeros.
"""

import argparse

import torch
import triton
import triton.language as tl

from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.triton import cdiv
from convt3d.backends.triton import window as window_module
from convt3d.backends.triton.window import _weight_halves, _weight_taps, _window_row, correlation_operands
from diag_overlap import checked
from p77_correlation import Timings, correlation_geometry, library_forward, modes, problem_77


@triton.jit
def fill_and_operands_kernel(
    out_ptr, FILL_BLOCKS, TOTAL, PASS_PROGRAMS,
    source_ptr, window_ptr, weight_ptr, taps_ptr, block_max_ptr, inverse_ptr,
    WEIGHT_PROGRAMS, COLUMN_BLOCKS, OFFSET, SN, SC, SD, SH, SW, D, H, W, XD, XH, XW, START_D, START_H, START_W,
    TAP_ELEMENTS, O, I, WO, WI, WD, WH, WW, KH, KW,
    C: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT: tl.constexpr,
    WINDOW: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_TAPS: tl.constexpr, FILL_BLOCK: tl.constexpr,
    EVERY: tl.constexpr, REVERSE: tl.constexpr,
):
    """window.correlation_operands_kernel's program p at program p x EVERY (p < PASS_PROGRAMS), zeros into the output's
    blocks of FILL_BLOCK elements in the others, in order (or from the last block, REVERSE)."""
    program = tl.program_id(0)
    if (program % EVERY == 0) & (program // EVERY < PASS_PROGRAMS):
        p = program // EVERY
        if p >= WEIGHT_PROGRAMS:
            _window_row(source_ptr, window_ptr, block_max_ptr, p - WEIGHT_PROGRAMS, COLUMN_BLOCKS, OFFSET, SN, SC,
                        SD, SH, SW, D, H, W, XD, XH, XW, START_D, START_H, START_W, C, BLOCK_C, BLOCK_P, SPLIT,
                        WINDOW)
        elif SPLIT == 2:
            _weight_halves(weight_ptr, taps_ptr, inverse_ptr, p, TAP_ELEMENTS // (O * I), O, I, WO, WI, WD, WH, WW,
                           KH, KW, BLOCK_I, BLOCK_TAPS)
        else:
            _weight_taps(weight_ptr, taps_ptr, p, TAP_ELEMENTS, O, I, WO, WI, WD, WH, WW, KH, KW, BLOCK_T, SPLIT)
    else:
        block = program - tl.minimum(program // EVERY + 1, PASS_PROGRAMS)  # (the pass programs up to this one)
        if REVERSE:
            block = FILL_BLOCKS - 1 - block
        offsets = block.to(tl.int64) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
        tl.store(out_ptr + offsets, tl.zeros([FILL_BLOCK], dtype=tl.float32), mask=offsets < TOTAL)


def fused_operands(x, w, start, extent, split: int, window: bool = True):
    """The operands as correlation_operands allocates them (with or without the window), and a function (out,
    fill_block, every, reverse, with_pass) that launches the fill (and, with_pass, the pass into those operands)."""
    split = min(split, 2)
    grid, scalars, options, window_shape, block_p = window_module._geometry(
        0, tuple(x.shape), tuple(x.stride()), tuple(start), tuple(extent), tuple(w.shape), w.stride(), False, split,
        window)
    kd, kh, kw = w.shape[2:]
    window_values = torch.empty(window_shape, dtype=torch.float32, device=x.device) if window else None
    taps = torch.empty((kd, kh, kw, w.shape[1], 2 * w.shape[0]), dtype=torch.float16, device=x.device)
    block_max = torch.empty((*window_shape[:3], cdiv(window_shape[3], block_p)), dtype=torch.float32,
                            device=x.device)
    inverse = torch.empty(w.shape[1], dtype=torch.float32, device=x.device)

    def launch(out, fill_block: int, every: int, reverse: bool, with_pass: bool = True):
        pass_programs = grid[0] if with_pass else 0
        fill_blocks = cdiv(out.numel(), fill_block)
        if pass_programs * every > pass_programs + fill_blocks:
            raise ValueError(f"every={every}: the pass's programs reach past the grid ({pass_programs} of them, "
                             f"{fill_blocks} fill blocks)")
        fill_and_operands_kernel[(pass_programs + fill_blocks,)](
            out, fill_blocks, out.numel(), pass_programs, x, block_max if window_values is None else window_values,
            w, taps, block_max, inverse, *scalars, **dict(options), FILL_BLOCK=fill_block, EVERY=every,
            REVERSE=int(reverse))

    return (window_values, taps, (block_max, block_p, inverse)), launch


def parse_form(form: str):
    """"every8r4096": (every 8, reverse, fill block 4096); the block 2048 and forward order where not given."""
    rest = form.removeprefix("every")
    reverse = "r" in rest
    every, _, block = rest.partition("r" if reverse else "b")
    return int(every), reverse, int(block or 2048)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--forms", default="every1,every2,every8,every8r,every4b4096",
                        help="fused forms, ','-separated: every<E> (a pass program every E programs), then r (fill "
                             "from the end) or b, and the fill's block (2048 where not given)")
    args = parser.parse_args()
    forms = {form: parse_form(form) for form in args.forms.split(",")}
    x, w, plan, phase_list = problem_77()
    timings = Timings(args.iters)
    for mode, split, reference, eager in modes(x, w):
        library, expected = library_forward(x, w)
        out = torch.empty(plan.output_shape, device="cuda")
        start, extent, geometry = correlation_geometry(plan, phase_list, split, out.stride())
        # As the library's forward: in FP16 the correlation reads the input itself, the pass no window.
        direct = cuda_phases._direct_input(x, plan, phase_list, split, False)
        operands, launch = fused_operands(x, w, start, extent, split, window=direct is None)
        made = correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False, split=split,
                                    window=direct is None)
        print(mode, "the correlation reads", "the window" if direct is None else "the input", flush=True)

        def forward(every, reverse, block):
            def run():
                y = torch.empty(plan.output_shape, device="cuda")
                launch(y, block, every, reverse)
                window, taps, scales = operands
                cuda.correlate(window if direct is None else x, taps, None, y, **geometry, scales=scales, split=split,
                               direct=direct)
                return y
            return run

        for form, (every, reverse, block) in forms.items():  # the fused launch's own results, once per mode
            written = [out, *operands[1:2], operands[2][0], operands[2][2], *operands[:1 if direct is None else 0]]
            for tensor in written:
                tensor.fill_(float("nan"))
            launch(out, block, every, reverse)
            pairs = [(operands[1], made[1]), (operands[2][0], made[2][0]), (operands[2][2], made[2][2])]
            same = all(torch.equal(a, b) for a, b in pairs + ([(operands[0], made[0])] if direct is None else []))
            print(mode, form, f"operands equal to the pass's {same}, output all zeros {bool((out == 0).all())}",
                  flush=True)
        for round_ in range(args.rounds):
            timings.row(mode, f"library forward (round {round_ + 1})", library,
                        checked(library, expected, reference, eager))
            if round_ == 0:
                timings.row(mode, "out.zero_()", out.zero_)
                timings.row(mode, "pass (correlation_operands)",
                            lambda: correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False,
                                                         split=split, window=direct is None))
                for block in sorted({block for _, _, block in forms.values()}):
                    timings.row(mode, f"fill alone, blocks of {block}",
                                lambda: launch(out, block, 1, False, with_pass=False))
                for form, (every, reverse, block) in forms.items():
                    timings.row(mode, f"fused {form} alone", lambda: launch(out, block, every, reverse))
            for form, (every, reverse, block) in forms.items():
                run = forward(every, reverse, block)
                timings.row(mode, f"forward, fused {form} (round {round_ + 1})", run,
                            checked(run, expected, reference, eager))
        del expected, reference, eager
    print(timings.table())


if __name__ == "__main__":
    main()
