"""Problem 77's forward with the fill and the correlation at the same time, ordered by flags: a fill of the whole
output by cp.async.bulk on a second stream, sample by sample, counting each sample done in a flag; the correlation
(row_runs.py's kernel into the lattice, as the library's) waits, after its MMAs and before its writes, for its
sample's flag.

    PYTHONPATH=src python3 benchmarks/diag_fill_flags.py [--iters 100] [--rounds 2] [--programs 132,264]

Why: the library fills the whole output (0.125 ms), then the correlation writes the phase's lattice into it (0.142
ms in FP16, 0.201 in 3xFP16): the two add. A fill beside the correlation has so far either had to finish before the
correlation's writes began (the lattice rows' sectors are shared with the fill's zeros) or written only the rows the
lattice leaves alone, in pieces too small to fill fast (diag_side_fill.py). Here the fill writes everything in 16 KB
copies, as diag_bulk_fill.py's one warp a program (4.2 TB/s alone), and only the order is enforced: per sample, each
fill program, once its copies of the sample are complete (cp.async.bulk.wait_group, then fence.proxy.async and a
release), adds one to the sample's flag; a correlation program reads its sample's flag (acquire) until every fill
program has counted. The fill's programs fit beside the correlation's on a multiprocessor (one warp of 32 registers,
17 KB of shared memory), so neither waits for room: no deadlock.

What it found (sixty-fifth session, benchmarks/RESULTS.md): no overlap. The ordered fill alone took 0.137-0.145 ms
(132 or 264 programs), and the forward with it beside the correlation took as long as with the two in turn and as the
library's: 0.303-0.323 ms against the library's 0.290 in FP16 (round 2), 0.365-0.388 against 0.356 in 3xFP16. With
the lattice rows written whole (--rows whole: full sectors, none read back from DRAM to merge), slower still: 0.345-0.347
ms beside the fill, 0.336-0.337 in turn (FP16). Every output was the library's, bitwise.

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call). The flags are zeroed on the
main stream first, then the fill is queued on the side stream, the operand pass and the correlation on the main one.
Every composed forward's output, NaN-poisoned before its first call, is compared with the library's forward
(bitwise), float64 and F.conv_transpose3d (KernelBench's check).
"""

import argparse
import math

import torch

from convt3d.backends import cuda
from convt3d.backends.triton.launch import _current_stream
from convt3d.backends.triton.window import correlation_operands
from diag_full_rows import FULL_ROWS_STORE, STORE
from diag_overlap import checked
from p77_correlation import (Timings, composed, correlation_geometry, library_forward, modes, patched_row_runs,
                             problem_77, use_row_runs)
CHUNK_BYTES = 16384

# Every byte of out, sample by sample (sample_bytes each), in CHUNK_BYTES copies of zeros spread over the programs;
# done[n] counts the programs whose share of sample n is written.
ORDERED_FILL = r"""
extern "C" __global__ void __launch_bounds__(32) ordered_fill(float* out, int* done, int samples,
                                                              long long sample_bytes) {
    __shared__ __align__(128) float zeros[CHUNK_BYTES / 4];
    for (int i = threadIdx.x; i < CHUNK_BYTES / 4; i += 32) zeros[i] = 0.f;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the zeros visible to the copies
    __syncwarp();
    if (threadIdx.x != 0) return;
    const unsigned source = (unsigned)__cvta_generic_to_shared(zeros);
    const long long chunks = (sample_bytes + CHUNK_BYTES - 1) / CHUNK_BYTES;
    for (int n = 0; n <= samples; n++) {
        if (n < samples) {
            char* base = (char*)out + n * sample_bytes;
            for (long long i = blockIdx.x; i < chunks; i += gridDim.x) {
                const int bytes = (int)min((long long)CHUNK_BYTES, sample_bytes - i * CHUNK_BYTES);
                asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                             :: "l"(base + i * CHUNK_BYTES), "r"(source), "r"(bytes) : "memory");
            }
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
        if (n > 0) {  // sample n - 1's copies complete (all but the newest group, or all after the last sample)
            if (n < samples)
                asm volatile("cp.async.bulk.wait_group 1;\n" ::: "memory");
            else
                asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
            asm volatile("fence.proxy.async.global;\n" ::: "memory");
            asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" :: "l"(done + n - 1) : "memory");
        }
    }
}
"""

# Into row_runs.py's kernel: before the tile's writes, its sample's flag (the bias argument carries the flags, as
# problem 77 has no bias) read until every fill program has counted, FILL_PROGRAMS.
WRITES = "    float* y_tile = y + n * syn"
WAIT = r"""    if (tid == 0) {  // (diag_fill_flags) the fill of sample n done
        const int* flag = (const int*)bias + n;
        int seen = 0;
        for (long long polls = 0; polls < (1ll << 26); polls++) {
            asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(flag) : "memory");
            if (seen >= FILL_PROGRAMS) break;
            __nanosleep(64);
        }
    }
    __syncthreads();
"""


def flagged_row_runs(fill_programs: int, full_rows: bool):
    """A builder for use_row_runs: row_runs.py's kernel, no bias, waiting for its sample's fill before writing;
    full_rows: its lattice rows written whole (diag_full_rows.py's store)."""
    # (the bias argument carries the flags; the store is found either way)
    return patched_row_runs((WRITES, WAIT + WRITES), (STORE, FULL_ROWS_STORE if full_rows else STORE),
                            head=f"#define FILL_PROGRAMS {fill_programs}\n", has_bias=False)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--programs", default="132,264", help="fill programs, ','-separated")
    parser.add_argument("--rows", default="lattice", help="lattice (the library's writes), whole (full rows) or both")
    args = parser.parse_args()
    x, w, plan, phase_list = problem_77()
    samples = plan.output_shape[0]
    sample_bytes = 4 * math.prod(plan.output_shape[1:])
    fill = cuda._Kernel(f"#define CHUNK_BYTES {CHUNK_BYTES}\n" + ORDERED_FILL, "ordered_fill", 0, 32)
    done = torch.zeros(samples, dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream()
    timings = Timings(args.iters)

    def ordered_fill(programs):
        return lambda y, stream: fill.launch(programs, (y.data_ptr(), done.data_ptr()), (samples,), (sample_bytes,),
                                             stream)

    for mode, split, reference, eager in modes(x, w):
        library, expected = library_forward(x, w)
        out = torch.empty(plan.output_shape, device="cuda")
        start, extent, geometry = correlation_geometry(plan, phase_list, split, out.stride())

        def correlate(y):
            window, taps, scales = correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False,
                                                        split=split)
            cuda.correlate(window, taps, done.view(torch.float32), y, **geometry, scales=scales, split=split)

        programs_list = [int(p) for p in args.programs.split(",")]
        writes = {"lattice": (False,), "whole": (True,), "both": (False, True)}[args.rows]
        for round_ in range(args.rounds):
            use_row_runs()
            timings.row(mode, f"library forward (round {round_ + 1})", library,
                        checked(library, expected, reference, eager))
            for programs in programs_list:
                if round_ == 0:
                    timings.row(mode, f"ordered fill, {programs} programs",
                                lambda: ordered_fill(programs)(out, _current_stream(0)))
                for full_rows in writes:
                    use_row_runs(flagged_row_runs(programs, full_rows))
                    what = "rows whole" if full_rows else "lattice"
                    for name, stream in (("in turn", None), ("beside", side)):
                        forward = composed(plan, ordered_fill(programs), correlate, stream, first=done.zero_)
                        timings.row(mode, f"ordered fill ({programs}) {name} pass + correlation, {what} "
                                    f"(round {round_ + 1})", forward, checked(forward, expected, reference, eager))
        del expected, reference, eager
    use_row_runs()
    print(timings.table())


if __name__ == "__main__":
    main()
