"""Problem 77's forward with no fill before the correlation: each of row_runs.py's programs zeroes its share of its
sample's output itself, counts it, and writes its lattice tile once every program of the sample has counted. (GPU)

    PYTHONPATH=src python3 benchmarks/diag_sample_fill.py [--iters 100] [--rounds 2] [--forms end,start,end_rows]

Why: the library's forward is out.zero_() (571 MB, 0.124 ms), the operand pass (0.019) and the correlation into the
lattice (0.124), which under Nsight Compute read 174.5 MB from DRAM and wrote 138.8 MB (sixty-ninth session): its
half-written lattice sectors are read back from DRAM, where zero_()'s zeros went long before. The fills beside the
correlation tried so far wrote the same bytes the same way and took as long as the two in turn (diag_fill_flags,
sixty-fifth session). Here the zeros of a sample (35.7 MB, within the L2's 50 MB) are written by that sample's own 128
programs, each a contiguous share (279 KB, 16-byte stores), just before (FILL_AT_START 0: after its MMAs) or long before
(1: at its start) their lattice writes: if the L2 merges the lattice's half-written sectors with the zeros it still
holds, the forward moves about 605 MB instead of about 880. benchmarks/diag_l2_merge.py measures that premise alone. A
third form (end_rows) fills after the MMAs and writes the lattice rows whole (each value with the zero beside it:
diag_full_rows.py's store), so that no sector is half written: the L2 need merge nothing.

The order: each program's fill stores, a fence, then an atomic add to its sample's count (the bias argument carries
the counts, problem 77 has no bias); thread 0 polls the count (acquire) until the sample's round is complete, and the
program then writes its tile. The counts are never reset: each launch adds SAMPLE_PROGRAMS to each sample's count, so
a program's round is its add's old value / SAMPLE_PROGRAMS. A program takes its tile by a ticket (an atomic counter
after the counts), in the order programs start, whatever order the hardware starts them in: every tile before a
waiting program's is then held by a program that has started, those of earlier samples finish, and the rest of its
sample's 128 start as they make room (396 programs fit the H200 at once at three a multiprocessor, 264 at two): no
deadlock. A poll that waits past about a second traps instead of hanging.

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call), the library's forward and the
fused forms taking turns per round, in FP16 (TF32 mode, reading the input) and 3xFP16 (TF32 off). Every output,
NaN-poisoned before its first call, is compared with the library's (bitwise), float64 and F.conv_transpose3d
(KernelBench's check).
"""

import argparse
import functools
import math

import torch

from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.triton.window import correlation_operands
from diag_full_rows import FULL_ROWS_STORE, STORE
from diag_overlap import checked
from p77_correlation import (Timings, correlation_geometry, library_forward, modes, patched_row_runs, problem_77,
                             use_row_runs)

# Before row_runs.py's source: a program's share of its sample's zeros, and its count and wait.
SAMPLE_FILL = r"""
__device__ __forceinline__ unsigned load_acquire(const unsigned* at) {
    unsigned value;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(value) : "l"(at) : "memory");
    return value;
}
// Zeros over share j of SAMPLE_PROGRAMS of the SAMPLE_FLOATS floats from sample on (16-byte aligned).
__device__ __forceinline__ void fill_share(float* sample, int j, int tid, int threads) {
    const long long quads = SAMPLE_FLOATS / 4, first = quads * j / SAMPLE_PROGRAMS;
    const long long last = quads * (j + 1) / SAMPLE_PROGRAMS;
    float4* at = (float4*)sample;
    for (long long e = first + tid; e < last; e += threads) at[e] = make_float4(0.f, 0.f, 0.f, 0.f);
}
// After every thread's fill stores: this program counted in its sample's round, then a wait for the round's last.
__device__ __forceinline__ void count_and_wait(unsigned* count, int tid) {
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        const unsigned round_end = (atomicAdd(count, 1u) / SAMPLE_PROGRAMS + 1) * SAMPLE_PROGRAMS;
        long long polls = 0;
        while ((int)(load_acquire(count) - round_end) < 0) {
            __nanosleep(64);
            if (++polls > (1ll << 20)) __trap();  // a program of the sample never came: a hang, not a wait
        }
    }
    __syncthreads();
}
"""
# A program's tile by the order in which programs start, not by its index: thread 0 takes the next ticket (the word
# after the samples' counts; each launch takes gridDim.x of them, a power of two, so that the count wraps with it) and
# hands it to the others through shared memory, before the weights' copies use that memory.
TILE = "    int tile = blockIdx.x;\n"
TICKET = r"""    if (tid == 0) ((volatile int*)smem4)[0] = (int)(atomicAdd((unsigned*)bias + SAMPLES, 1u) % gridDim.x);
    __syncthreads();
    const int claimed = ((volatile int*)smem4)[0];
    __syncthreads();
    int tile = claimed;
"""
DECODED = "    const int qd = tile % QD, n = tile / QD;\n"
WRITES = "    float* y_tile = y + n * syn"
SAMPLE = "y - phase[9] + n * syn"  # (TAKE_PHASE moved y to the lattice: phase[9] is its offset)
FILL_FIRST = f"    if (FILL_AT_START) fill_share({SAMPLE}, claimed % SAMPLE_PROGRAMS, tid, THREADS);\n"
FILL_LAST = (f"    if (!FILL_AT_START) fill_share({SAMPLE}, claimed % SAMPLE_PROGRAMS, tid, THREADS);\n"
             "    count_and_wait((unsigned*)bias + n, tid);\n")


# The forms: where a program fills its share, and whether it writes its lattice rows whole (each value with the zero
# beside it, 8-byte stores: diag_full_rows.py's) rather than every other element.
FORMS = {"end": (False, False), "start": (True, False), "end_rows": (False, True)}


@functools.lru_cache(maxsize=None)
def sample_fill_row_runs(samples: int, sample_programs: int, sample_floats: int, at_start: bool, rows_whole: bool):
    """A builder for use_row_runs: row_runs.py's kernel, no bias, each program filling its share of its sample (each
    configuration compiled once)."""
    head = (f"#define SAMPLES {samples}\n#define SAMPLE_PROGRAMS {sample_programs}\n"
            f"#define SAMPLE_FLOATS {sample_floats}ll\n#define FILL_AT_START {int(at_start)}\n" + SAMPLE_FILL)
    build = patched_row_runs((TILE, TICKET), (DECODED, DECODED + FILL_FIRST), (WRITES, FILL_LAST + WRITES),
                             (STORE, FULL_ROWS_STORE if rows_whole else STORE), head=head, has_bias=False)
    return functools.lru_cache(maxsize=None)(build)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--forms", default="end,start,end_rows", help=f"','-separated, of {', '.join(FORMS)}")
    args = parser.parse_args()
    x, w, plan, phase_list = problem_77()
    samples, sample_floats = plan.output_shape[0], math.prod(plan.output_shape[1:])
    out_strides = torch.empty(plan.output_shape, device="meta").stride()
    counts = torch.zeros(samples + 1, dtype=torch.int32, device="cuda")  # (and the tickets)
    timings = Timings(args.iters)
    for mode, split, reference, eager in modes(x, w):
        _, expected = library_forward(x, w)
        start, extent, geometry = correlation_geometry(plan, phase_list, split, out_strides)
        _, _, ((_, _, grid, members),) = cuda_phases._forward_geometry(plan, phase_list, split)
        assert cuda._row_runs_layer(32, 64, split, grid)
        sample_programs = cuda._programs(1, grid, cuda.row_runs.ROWS, 64, 64) * len(members)
        programs = sample_programs * samples
        assert programs & (programs - 1) == 0, programs  # (the tickets wrap with the grid: TICKET)

        def fused(form: str):
            """The forward with each program filling its sample's share: the operand pass and the correlation."""
            use_row_runs(sample_fill_row_runs(samples, sample_programs, sample_floats, *FORMS[form]),
                         direct_input=split == 3)
            direct = cuda_phases._direct_input(x, plan, phase_list, split, True)

            def forward():
                y = torch.empty(plan.output_shape, device="cuda")  # (the first allocation: checked poisons it)
                window, taps, scales = correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False,
                                                            split=split, window=direct is None)
                cuda.correlate(window if direct is None else x, taps, counts.view(torch.float32), y, **geometry,
                               scales=scales, split=split, direct=direct)
                return y
            return forward

        for round_ in range(args.rounds):
            library, _ = library_forward(x, w)
            timings.row(mode, f"library forward (round {round_ + 1})", library,
                        checked(library, expected, reference, eager))
            for form in args.forms.split(","):
                forward = fused(form)
                what = {"end": "sample fill after the MMAs", "start": "sample fill at the start",
                        "end_rows": "sample fill after the MMAs, rows whole"}[form]
                timings.row(mode, f"{what} (round {round_ + 1})", forward, checked(forward, expected, reference, eager))
    library_forward(x, w)  # (the library's kernel again)
    print(timings.table())


if __name__ == "__main__":
    main()
