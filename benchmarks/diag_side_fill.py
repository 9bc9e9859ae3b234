"""Problem 77's forward with the fill on a second stream beside the correlation: the fill writes every output row but
the phase's lattice rows, and the correlation (row_runs.py's kernel) writes its lattice rows whole, each value with
the zero beside it, so that no element is written by both and the two may run at the same time.

    PYTHONPATH=src python3 benchmarks/diag_side_fill.py [--iters 100] [--rounds 2]

Why: the library fills the whole output (0.125 ms), then the correlation writes the lattice into it (FP16 0.142 ms,
3xFP16 0.201), one after the other. Earlier fills beside the correlation (sixty-third session: by batch chunks;
thirty-fourth: cp.async.bulk) wrote the lattice rows' zeros too, so they had to finish before the correlation's
writes began. Here the fill leaves the lattice rows alone (434 of the output's 571 MB are its), in one warp per
program, so that a program fits beside the correlation's on a multiprocessor (row_runs.py's FP16 kernel leaves
1,024 of its 65,536 registers, 3xFP16's about 2,000), and the correlation writes whole rows (diag_full_rows.py's
store, here in row_runs.py's kernel): a lattice row of problem 77 is its output row's odd columns, and no other
phase writes that row.

What it found (sixty-fifth session, benchmarks/RESULTS.md): not a way. A fill in one warp a program is slow: the
plain form 0.68-0.79 ms with 264 programs (1.53 with 132), the bulk form (one cp.async.bulk a run of rows) 0.94 and
1.80, against out.zero_()'s 0.125. Beside it the correlation hid almost wholly (plain, 264 programs: 0.71-0.77 ms for
the composed forward against 0.68 for the fill alone, 0.90-0.96 in turn), but the fill itself is several times the
library's whole forward. And the correlation writing its rows whole took 0.179-0.182 ms in FP16 (means) against 0.142
into the half-written lattice (diag_turned, the same session), 0.225-0.228 against 0.201 in 3xFP16, as diag_full_rows
found with phase_conv.py's kernel.

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call); "gap fill": the fill of every
row but the lattice's (GAP_FILL, blocks x warps); "full rows": the correlation into the lattice rows, whole; "pass":
the operand pass (window.correlation_operands). Every composed forward's output, NaN-poisoned before its first call,
is compared with the library's forward (bitwise), float64 and F.conv_transpose3d (KernelBench's check).
"""

import argparse

import torch

from convt3d.backends import cuda
from convt3d.backends.triton.launch import _current_stream
from convt3d.backends.triton.window import correlation_operands
from diag_full_rows import FULL_ROWS_STORE, STORE
from diag_overlap import checked
from p77_correlation import (Timings, composed, correlation_geometry, library_forward, modes, patched_row_runs,
                             problem_77, use_row_runs)

# Zeros into every row of y (planes of H x W floats, D planes a sample's channel) but the lattice rows: depth d0 + sd
# k, row h0 + sh j for j < QH. One warp a plane at a time; runs of rows between lattice rows in 16-byte stores.
GAP_FILL = r"""
#if BULK
__shared__ __align__(128) float zeros[ZERO_FLOATS];
#endif
// n zeros from p on: the floats before the first 16-byte boundary and after the last by the lanes, the 16-byte
// groups between by the lanes' float4 stores (BULK 0) or lane 0's cp.async.bulk copies of the zeros in shared
// memory (BULK 1).
__device__ __forceinline__ void zero_run(float* p, int n, int lane) {
    const int head = min(n, (int)(((16 - ((unsigned long long)p & 15)) & 15) >> 2));
    const int body = (n - head) & ~3, tail = n - head - body;
    if (lane < head) p[lane] = 0.f;
    if (lane < tail) p[head + body + lane] = 0.f;
#if BULK
    if (lane == 0 && body > 0) {
        for (int at = 0; at < body; at += ZERO_FLOATS)
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                         :: "l"(p + head + at), "r"((unsigned)__cvta_generic_to_shared(zeros)),
                            "r"(4 * min(ZERO_FLOATS, body - at)) : "memory");
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    }
#else
    float4* q = (float4*)(p + head);
    for (int i = lane; i < body / 4; i += 32) q[i] = make_float4(0.f, 0.f, 0.f, 0.f);
#endif
}

extern "C" __global__ void __launch_bounds__(32 * WARPS) gap_fill(float* __restrict__ y, int planes, int D, int H,
                                                                   int W, int d0, int sd, int h0, int sh, int QH) {
    const int lane = threadIdx.x & 31;
    const int warps = gridDim.x * WARPS;
#if BULK
    for (int i = threadIdx.x; i < ZERO_FLOATS; i += 32 * WARPS) zeros[i] = 0.f;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the zeros visible to the copies
    __syncthreads();
#endif
    for (int p = blockIdx.x * WARPS + (threadIdx.x >> 5); p < planes; p += warps) {
        const int d = p % D;
        float* plane = y + (long long)p * H * W;
        if (d < d0 || (d - d0) % sd) {
            zero_run(plane, H * W, lane);
            continue;
        }
        int start = 0;  // the current run of rows
        for (int j = 0; j < QH; j++) {
            const int h = h0 + sh * j;
            if (h > start) zero_run(plane + start * W, (h - start) * W, lane);
            start = h + 1;
        }
        if (H > start) zero_run(plane + start * W, (H - start) * W, lane);
    }
#if BULK
    if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // the zeros stay until copied
#endif
}
"""


def gap_fill_kernel(kind: str, warps: int):
    """GAP_FILL in programs of warps warps: kind "plain" (16-byte stores) or "bulk" (cp.async.bulk, 8 KB of zeros)."""
    defines = f"#define WARPS {warps}\n#define BULK {int(kind == 'bulk')}\n#define ZERO_FLOATS 2048\n"
    return cuda._Kernel(defines + GAP_FILL, "gap_fill", 0, 32 * warps)


def gap_fill(kernel, blocks: int, plan, out_strides, geometry):
    """fill(y, stream): kernel (gap_fill_kernel's) in blocks programs over an output of plan and out_strides, leaving
    out the lattice rows of the correlation of geometry (correlation_geometry's; problem 77's: every other depth and
    row)."""
    n, c, d, h, wd = plan.output_shape
    lattice_offset = geometry["out_offset"]
    (d0, h0), (sd, sh) = (lattice_offset // out_strides[2] % d, lattice_offset // out_strides[3] % h), (2, 2)
    return lambda y, stream: kernel.launch(
        blocks, (y.data_ptr(),), (n * c * d, d, h, wd, d0, sd, h0, sh, geometry["grid"][1]), (), stream)


# row_runs.py's kernel with diag_full_rows' store (a builder for use_row_runs).
full_rows_row_runs = patched_row_runs((STORE, FULL_ROWS_STORE))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fills", default="bulk132x1,bulk264x1,plain264x1",
                        help="gap fills as kind (plain, bulk), programs x warps, ','-separated")
    args = parser.parse_args()
    x, w, plan, phase_list = problem_77()
    fills = [(f.rstrip("0123456789x"), *(int(v) for v in f.lstrip("abcdefghijklmnopqrstuvwxyz").split("x")))
             for f in args.fills.split(",")]
    kernels = {(kind, warps): gap_fill_kernel(kind, warps) for kind, _, warps in fills}
    side = torch.cuda.Stream()
    timings = Timings(args.iters)

    for mode, split, reference, eager in modes(x, w):
        library, expected = library_forward(x, w)
        use_row_runs(full_rows_row_runs)
        out = torch.empty(plan.output_shape, device="cuda")
        start, extent, geometry = correlation_geometry(plan, phase_list, split, out.stride())
        fill = lambda kind, blocks, warps: gap_fill(kernels[kind, warps], blocks, plan, out.stride(), geometry)

        def operands():
            return correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False, split=split)

        window, taps, scales = operands()

        def full_rows(y, ops=None):
            window, taps, scales = ops if ops is not None else operands()
            cuda.correlate(window, taps, None, y, **geometry, scales=scales, split=split)

        for round_ in range(args.rounds):
            use_row_runs()
            timings.row(mode, f"library forward (round {round_ + 1})", library,
                        checked(library, expected, reference, eager))
            use_row_runs(full_rows_row_runs)
            if round_ == 0:
                timings.row(mode, "pass", operands)
                timings.row(mode, "full rows, operands made before", lambda: full_rows(out, (window, taps, scales)))
                timings.row(mode, "out.zero_()", out.zero_)
                for kind, blocks, warps in fills:
                    timings.row(mode, f"gap fill {kind} {blocks}x{warps}",
                                lambda: fill(kind, blocks, warps)(out, _current_stream(0)))
            for kind, blocks, warps in fills:
                for name, stream in (("in turn", None), ("beside", side)):
                    forward = composed(plan, fill(kind, blocks, warps), full_rows, stream)
                    timings.row(mode, f"gap fill {kind} {blocks}x{warps} {name} pass + full rows (round {round_ + 1})",
                                forward, checked(forward, expected, reference, eager))
        del expected, reference, eager
    use_row_runs()
    print(timings.table())


if __name__ == "__main__":
    main()
