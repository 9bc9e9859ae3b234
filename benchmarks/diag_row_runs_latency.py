"""Problem 77's forward in TF32 mode (FP16) with three of row_runs.py's serial waits shortened, each a patch of its
source that leaves the result bitwise the same.

    PYTHONPATH=src python3 benchmarks/diag_row_runs_latency.py [--iters 100] [--rounds 3]
    PYTHONPATH=src:tests python3 benchmarks/diag_row_runs_latency.py --registers   # on a CPU with NVRTC

Why: Nsight Compute's warp-stall samples per SASS instruction of the library's correlation on problem 77 (seventy-
third session, benchmarks/RESULTS.md) put about half of them outside the depth-tap loop: 13.5% in the prologue, most
in the first depth tap's weight copies (one tap's two cp.async an iteration of a loop not unrolled, each iteration
waiting for the previous one's address registers), 12.2% in FP16's scale (the block maxima of the three planes read
in three rounds, each waiting for its load), and 24.5% after the loop (the last MMA wait, staging the tile, and
write_tile's loop, not unrolled, each iteration's stores waiting for its shared-memory loads).

Forms (cumulative, as measured): the library's of the seventy-second session; the scale's block maxima in one round
of loads ("one-round scale"); the weight copies' tap loop unrolled by three ("weight copies by three"; fully unrolled,
ptxas spilled 8 bytes); write_tile's loop unrolled by two ("write_tile by two"). The first two are row_runs.py's since
(seventy-third session), so the script now takes them back out for the forms without them.

What it found (seventy-third session, benchmarks/RESULTS.md): the first two took about 2% off the forward (means
0.2633-0.2654 ms against 0.2697-0.2708 in rounds 2 and 3, minima 0.2562-0.2585 against 0.2600-0.2624); write_tile
by two added nothing. Every output bitwise the library's.

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call), the forms alternating each
round; each form's output, NaN-poisoned before its first call, checked against the first form's (bitwise), float64 and
eager (KernelBench's check).
"""

import argparse
import functools

from convt3d.backends.cuda import row_runs

ONE_ROUND_SCALE = ("""        float amax = 0.f;
        for (int kd = 0; kd < KD; kd++)
            amax = fmaxf(amax, plane_max(block_max, first_row + (long long)kd * DD * XH, HH, 0, max_blocks,
                                         max_blocks, lane));
""", """        // Every depth tap's block maxima in one round of loads, lanes over (depth tap, row, column block).
        float amax = 0.f;
        for (int e = lane; e < KD * HH * max_blocks; e += 32) {
            const int kd = e / (HH * max_blocks), r = e % (HH * max_blocks);
            amax = fmaxf(amax, block_max[(first_row + (long long)kd * DD * XH + r / max_blocks) * max_blocks
                                         + r % max_blocks]);
        }
        for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
""")
UNROLLED_WEIGHT_COPIES = ("""        #pragma unroll 1
        for (int tap = 0; tap < KH * KW; tap++) {""", """        #pragma unroll 3
        for (int tap = 0; tap < KH * KW; tap++) {""")
WRITE_TILE_BY_TWO = ("""    #pragma unroll 1
    for (int job = warp;""", """    #pragma unroll 2
    for (int job = warp;""")


def undone(patch):
    """The patch taken back out: (new, old)."""
    return patch[1], patch[0]


FORMS = (
    ("seventy-second session's", (undone(ONE_ROUND_SCALE), undone(UNROLLED_WEIGHT_COPIES))),
    ("one-round scale", (undone(UNROLLED_WEIGHT_COPIES),)),
    ("one-round scale, weight copies by three (the library's)", ()),
    ("one-round scale, weight copies by three, write_tile by two", (WRITE_TILE_BY_TWO,)),
)


def patched_source(patches, c_out=64, taps=(3, 3, 3), dilation=(1, 1, 1), window_columns=34, has_bias=False,
                   split=3, input_geometry=None) -> str:
    """row_runs.source with each (old, new) of patches replaced (an error where old is not there once)."""
    text = row_runs.source(c_out, taps, dilation, window_columns, has_bias, split, input_geometry)
    for old, new in patches:
        if text.count(old) != 1:
            raise RuntimeError(f"row_runs.py's source changed: a patch no longer matches {old[:60]!r}")
        text = text.replace(old, new)
    return text


def builder(patches):
    """cuda._row_runs_kernel's stand-in for a form (its signature), kept per arguments."""
    import torch
    from convt3d.backends import cuda

    @functools.lru_cache(maxsize=None)
    def build(device_index, c_out, taps, dilation, window_columns, has_bias, split, input_geometry=None):
        text = patched_source(patches, c_out, taps, dilation, window_columns, has_bias, split, input_geometry)
        with torch.cuda.device(device_index):
            return cuda._Kernel(text, "phase_conv_rows", row_runs.shared_bytes(taps, dilation, window_columns, split),
                                row_runs.THREADS)
    return build


def registers() -> None:
    """ptxas's registers and spills per form for problem 77 (NVRTC on this machine, tests/test_cuda_compile.py's)."""
    from test_cuda_compile import P77_INPUT, registers_and_spills
    for name, patches in FORMS:
        print(f"{name}: (registers, spilled bytes) {registers_and_spills(patched_source(patches, input_geometry=P77_INPUT))}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--registers", action="store_true", help="only ptxas's report, on a CPU with NVRTC")
    args = parser.parse_args()
    if args.registers:
        return registers()
    import convt3d
    from convt3d.backends import cuda
    from diag_overlap import checked
    from p77_correlation import P77, Timings, modes, problem_77, use_row_runs

    x, w, _, _ = problem_77()
    builders = {name: builder(patches) for name, patches in FORMS}
    forward = lambda: convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
    timings = Timings(args.iters)
    mode, _, reference, eager = next(modes(x, w))  # FP16 (TF32 allowed)
    use_row_runs(builders[FORMS[0][0]], direct_input=True)
    expected = forward()
    for round_ in range(args.rounds):
        for name, _ in FORMS:
            use_row_runs(builders[name], direct_input=True)
            check = checked(forward, expected, reference, eager) if round_ == 0 else ""
            timings.row(mode, f"{name} (round {round_ + 1})", forward, check)
    use_row_runs(direct_input=cuda.DIRECT_INPUT)
    print(timings.table())


if __name__ == "__main__":
    main()
