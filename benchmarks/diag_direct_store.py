"""Problem 77's forward with row_runs.py's correlation storing its sums straight from the MMA's registers, rather than
staging the tile in shared memory for write_tile.

    PYTHONPATH=src python3 benchmarks/diag_direct_store.py [--iters 100] [--rounds 3]
    PYTHONPATH=src:tests python3 benchmarks/diag_direct_store.py --registers   # on a CPU with NVRTC: ptxas's report

Why: Nsight Compute's per-instruction warp-stall samples of the library's correlation on problem 77 (seventy-third
session, benchmarks/RESULTS.md) put 24.5% of them after the depth-tap loop: the last MMA wait (3.0%), staging the
tile in shared memory (2.9%) and write_tile's shared-memory loads feeding its global stores, and the exit (18.6%). The
staging takes a barrier before and after it, 68 shared-memory stores a thread, then 64 loads and 64 global stores.

The variant: each thread stores its accumulators d[4 j + e] (output channel 16 warp + g + 8 (e / 2), tile position
8 j + 2 t + e % 2) to the output itself, the bias added and the scales multiplied as when staged: 68 global stores a
thread, no barrier, no shared memory. A warp's store then covers 8 channels x 4 positions (16 sectors, a quarter of
each written) where write_tile's covers 32 columns of one channel (8 sectors, half of each). The same arithmetic, so
the output must be bitwise the library's.

What it found (seventy-fourth session, benchmarks/RESULTS.md): far slower. Problem 77's forward took 0.4322-0.4329 ms
against 0.2633-0.2661 in FP16, 0.4846-0.4874 against 0.3479-0.3538 in 3xFP16 (means), every output bitwise the
library's. Not kept.

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call), the forms alternating each
round, in TF32 mode (FP16, reading the input) and with TF32 off (3xFP16, reading the window); each form's output,
NaN-poisoned before its first call, checked against the library's (bitwise), float64 and eager (KernelBench's check).
"""

from p77_correlation import (LIBRARY_ROW_RUNS_KERNEL, Timings, alternate_forms, arguments, modes, patched_row_runs,
                             problem_77)

STAGED = """    compute_sync();  // shared memory free: the tile goes there
"""
STAGED_END = """    write_tile<ROWS, COB, THREADS>(staged, OCS, XW, y_tile, syc, syh, qh0, QH, lane < QW, warp, lane);
"""
DIRECT = """    // d[4 j + e]: channel 16 warp + g + 8 (e / 2) of the block, position 8 j + 2 t + e % 2, stored as is.
    #pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int o = 16 * warp + g + 8 * hf;
        const float b = HAS_BIAS ? bias[ob * COB + o] : 0.f;
        const float s = w_inverse[ob * COB + o];
        const float a_unit = SPLIT == 3 ? a_inverse : 1.f;
        float* y_channel = y + n * syn + (long long)(ob * COB + o) * syc + qd * syd;
        #pragma unroll
        for (int j = 0; j < NP / 8; j++)
            #pragma unroll
            for (int e = 0; e < 2; e++) {
                const int p = 8 * j + 2 * t + e, r = p / XW, c = p % XW;
                if (r < ROWS && c < QW && qh0 + r < QH)
                    y_channel[(long long)(qh0 + r) * syh + (long long)c * syw] = d[4 * j + 2 * hf + e] * s * a_unit + b;
            }
    }
"""


def direct_store_patch(text: str) -> tuple[str, str]:
    """(old, new): the source's epilogue from the staging barrier through write_tile, and the direct stores."""
    start, end = text.index(STAGED), text.index(STAGED_END) + len(STAGED_END)
    return text[start:end], DIRECT


def source(direct: bool, split: int, input_geometry=None) -> str:
    """row_runs.py's source for problem 77, with the direct stores where direct."""
    from convt3d.backends.cuda import row_runs
    text = row_runs.source(64, (3, 3, 3), (1, 1, 1), 34, False, split, input_geometry)
    if direct:
        old, new = direct_store_patch(text)
        text = text.replace(old, new)
    return text


def registers() -> None:
    """ptxas's registers and spills per form and precision for problem 77 (NVRTC on this machine)."""
    from test_cuda_compile import P77_INPUT, registers_and_spills
    for split, geometry, mode in ((3, P77_INPUT, "FP16, input"), (2, None, "3xFP16, window")):
        for direct in (False, True):
            print(f"{mode}, {'direct' if direct else 'staged'}: (registers, spilled bytes) "
                  f"{registers_and_spills(source(direct, split, geometry))}")


def main():
    args = arguments(3, registers)
    from convt3d.backends.cuda import row_runs

    x, w, _, _ = problem_77()
    direct_stores = patched_row_runs(direct_store_patch(row_runs.source(64, (3, 3, 3), (1, 1, 1), 34, False, 3)))
    timings = Timings(args.iters)
    for mode, split, reference, eager in modes(x, w):
        direct_input = split == 3  # as the library reads them (cuda.reads_input)
        forms = (("library (staged, write_tile)", LIBRARY_ROW_RUNS_KERNEL, direct_input),
                 ("direct stores", direct_stores, direct_input))
        alternate_forms(x, w, forms, timings, mode, args.rounds, reference, eager)
    print(timings.table())


if __name__ == "__main__":
    main()
