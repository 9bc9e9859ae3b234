"""Problem 77's forward in TF32 mode (FP16) with row_runs.py's kernel compiled for four programs a multiprocessor
instead of three: at __launch_bounds__(128, 4) ptxas fits the FP16 kernel in 128 registers (compiled on the project's
CPU with NVRTC 12.9 for sm_90a: no spill reading the window; reading the input itself 64 bytes of spill with two
units a thread a round, none with one), and four programs' 50 KB of shared memory fit a multiprocessor. The
sixty-fourth session measured three against two (0.096 against 0.104 ms, the compact correlation); four was not tried.

    PYTHONPATH=src python3 benchmarks/diag_programs_per_sm.py [--iters 100] [--rounds 3]

What it found (sixty-ninth session, benchmarks/RESULTS.md): no gain. The driver's occupancy calculator gave four
programs a multiprocessor to the MIN_BLOCKS 4 forms, three to the others; reading the input, every form's forward
took 0.2716-0.2728 ms by the means of rounds 2 and 3 (minima 0.2662-0.2689), the library's as fast as any; reading the
window, four programs took 0.297 against three's 0.289. Every output bitwise the library's.

Forms: the correlation reading the input (the library's default) or the window; MIN_BLOCKS 3 or 4; the plane's load
rounds of two units a thread (the library's) or one; "carveout": the kernel's preferred shared-memory carveout set to
the most. Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call), the forms
alternating each round; each form's output, NaN-poisoned before its first call, checked against the library's
(bitwise), float64 and eager (KernelBench's check). First the programs a multiprocessor holds, as the driver's
occupancy calculator says, per form.

Its patches fit row_runs.py as it was before 7f5caa7 (ninety-third session), whose plane loads hold HELD_ROUNDS
rounds: run it at 43c9181 or earlier (its kernel then is the library's of the sixty-ninth to ninety-second sessions).
"""

import argparse
import ctypes
import functools

import torch

from convt3d.backends import driver
from diag_overlap import prefer_shared
from p77_correlation import LIBRARY_ROW_RUNS_KERNEL, Timings, alternate_forms, modes, patched_row_runs, problem_77

FOUR = ("#define MIN_BLOCKS 3\n", "#define MIN_BLOCKS 4\n")
ONE_UNIT = (("base += 2 * THREADS", "base += THREADS"), ("float v[2][16];", "float v[1][16];"),
            ("float4 v[2][4];", "float4 v[1][4];"), ("for (int h = 0; h < 2; h++)", "for (int h = 0; h < 1; h++)"))
# (name, reads the input, patches, carveout)
FORMS = (
    ("library: input, 3 a multiprocessor, 2 units a round", True, (), False),
    ("input, 4, 1 unit", True, (FOUR, *ONE_UNIT), False),
    ("input, 4, 1 unit, carveout", True, (FOUR, *ONE_UNIT), True),
    ("input, 3, 1 unit", True, ONE_UNIT, False),
    ("window, 3, 2 units", False, (), False),
    ("window, 4, 2 units, carveout", False, (FOUR,), True),
)


def builder(patches, carveout: bool):
    """cuda._row_runs_kernel's stand-in for a form: the library's own where it patches nothing, kept per arguments."""
    if not patches and not carveout:
        return LIBRARY_ROW_RUNS_KERNEL
    build = patched_row_runs(*patches)

    @functools.lru_cache(maxsize=None)
    def cached(*args):
        kernel = build(*args)
        if carveout:
            prefer_shared(kernel.function)
        return kernel
    return cached


def occupancy(kernel) -> int:
    """The programs of kernel a multiprocessor holds at its threads and shared memory (the driver's calculator)."""
    libcuda = driver.libcuda()
    libcuda.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                                                                    ctypes.c_int, ctypes.c_size_t]
    blocks = ctypes.c_int()
    driver.check(libcuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), kernel.function,
                                                                      kernel.threads, kernel.shared_bytes))
    return blocks.value


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    x, w, _, _ = problem_77()
    builders = {name: builder(patches, carveout) for name, _, patches, carveout in FORMS}
    timings = Timings(args.iters)
    mode, _, reference, eager = next(modes(x, w))  # FP16 (TF32 allowed)
    alternate_forms(x, w, [(name, builders[name], direct_input) for name, direct_input, _, _ in FORMS], timings, mode,
                    args.rounds, reference, eager)
    for name, direct_input, patches, carveout in FORMS:  # (each builder called as the forwards called it)
        kernel = builders[name](torch.cuda.current_device(), 64, (3, 3, 3), (1, 1, 1), 34, False, 3,
                                ((16, 32, 32), (-1, -1, -1), tuple(x.stride()[:4])) if direct_input else None)
        print(f"{name}: {occupancy(kernel)} programs a multiprocessor")
    print(timings.table())


if __name__ == "__main__":
    main()
