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
(seventy-third session; the one-round scale as FP16_HELPERS' planes_max since the seventy-fourth, the same SASS), so
the script now takes them back out for the forms without them.

What it found (seventy-third session, benchmarks/RESULTS.md): the first two took about 2% off the forward (means
0.2633-0.2654 ms against 0.2697-0.2708 in rounds 2 and 3, minima 0.2562-0.2585 against 0.2600-0.2624); write_tile
by two added nothing. Every output bitwise the library's.

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call), the forms alternating each
round; each form's output, NaN-poisoned before its first call, checked against the first form's (bitwise), float64 and
eager (KernelBench's check).
"""

from p77_correlation import (Timings, alternate_forms, arguments, modes, patched_row_runs, patched_row_runs_source,
                             problem_77)

ONE_ROUND_SCALE = ("""        float amax = 0.f;
        for (int kd = 0; kd < KD; kd++)
            amax = fmaxf(amax, plane_max(block_max, first_row + (long long)kd * DD * XH, HH, 0, max_blocks,
                                         max_blocks, lane));
        a_scale = pow2_scale(amax, a_inverse);
""", """        a_scale = pow2_scale(planes_max(block_max, first_row, KD, (long long)DD * XH, HH, 0, max_blocks, max_blocks,
                                        lane), a_inverse);
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


def registers() -> None:
    """ptxas's registers and spills per form for problem 77 (NVRTC on this machine, tests/test_cuda_compile.py's)."""
    from test_cuda_compile import P77_INPUT, registers_and_spills
    for name, patches in FORMS:
        text = patched_row_runs_source(patches, input_geometry=P77_INPUT, exactly_once=True)
        print(f"{name}: (registers, spilled bytes) {registers_and_spills(text)}")


def main():
    args = arguments(3, registers)

    x, w, _, _ = problem_77()
    timings = Timings(args.iters)
    mode, _, reference, eager = next(modes(x, w))  # FP16 (TF32 allowed)
    forms = [(name, patched_row_runs(*patches, exactly_once=True), True) for name, patches in FORMS]
    alternate_forms(x, w, forms, timings, mode, args.rounds, reference, eager)
    print(timings.table())


if __name__ == "__main__":
    main()
