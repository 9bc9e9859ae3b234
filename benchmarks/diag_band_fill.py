"""Problem 77's output (zeros) written by programs of 256 threads in the band layout that phase_conv.py's BANDS
experiment used (bda9193), against torch.zero_: how fast can few warps per multiprocessor write it in that order?
Needs an sm_90 GPU (Hopper: cp.async.bulk); runs on any library version.

    PYTHONPATH=src python3 benchmarks/diag_band_fill.py --form bulk|shapes

--form bulk: each tile's band of planes and rows (tiles of 8 rows x one plane pair x 64 channels, as the experiment's
programs), a warp per run, written by every lane's 16-byte stores (st.v4) or by bulk copies (cp.async.bulk, one lane
per run) from a buffer of ZB zeros in shared memory; 132 or 264 programs.
--form shapes: 16-byte stores in runs of other shapes: bands of 8 or 16 rows, bands with runs padded to whole 16-byte
groups (they overwrite up to 3 floats of their neighbours with zeros: timing only), whole planes, plane pairs as one
run, and contiguous chunks of the output; 132, 264 or 1,056 programs.
--form teams: the runs of a tile that computes every output channel (a GEMM tile's: plane pairs or bands of 8 rows,
64 channels), written by the whole program together, one run after another, rather than a warp per run: fewer runs
open at once, as zero_ keeps them. Channels in order in every program, or rotated by the tile; tiles with the depth
(qd) or the batch (n) fastest. Does any order a GEMM tile allows write near zero_'s time?

Every form ends with zero_ and the driver's cuMemsetD32Async of the whole output, for comparison.

Thirty-ninth session (benchmarks/RESULTS.md, calls 5 and 6): the band layout took 0.17-0.22 ms by either store,
contiguous chunks 0.14-0.16, zero_ 0.125. Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before
each call); the output is NaN-filled before its first call and then checked to be all zeros (not for the chunks, which
leave the output's end unwritten).
"""

import argparse
import ctypes

import torch

from convt3d.bench.protocol import time_cuda

BULK_SOURCE = r"""
#define OD 33
#define OH 65
#define OW 65
#define QD 16
#define QH 32
#define BH 8
#define COB 64
extern "C" __global__ void __launch_bounds__(256, 1) band_fill(float* y, int tiles, int mode) {
    extern __shared__ __align__(128) float zero_buf[];  // ZB floats of zeros
    for (int i = threadIdx.x; i < ZB; i += 256) zero_buf[i] = 0.f;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const unsigned zero_addr = (unsigned)__cvta_generic_to_shared(zero_buf);
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int qhb = tile % (QH / BH), qd = tile / (QH / BH) % QD, n = tile / (QH / BH) / QD;
        const int qh0 = qhb * BH;
        const int d0 = qd == 0 ? 0 : 1 + 2 * qd, d1 = qd == QD - 1 ? OD : 1 + 2 * (qd + 1);
        const int h0 = qh0 == 0 ? 0 : 1 + 2 * qh0, h1 = qh0 + BH >= QH ? OH : 1 + 2 * (qh0 + BH);
        const int span = (h1 - h0) * OW, planes = d1 - d0;
        for (int run = warp; run < COB * planes; run += 8) {
            const int c = run % COB, plane = d0 + run / COB;
            float* start = y + (((long long)n * COB + c) * OD + plane) * (OH * OW) + h0 * OW;
            const int mis = (int)(((unsigned long long)start >> 2) & 3);
            if (mode == 0) {
                const int groups = (mis + span + 3) / 4;
                for (int g = lane; g < groups; g += 32) {
                    const int first = 4 * g - mis;
                    if (first >= 0 && first + 4 <= span)
                        asm volatile("st.global.v4.f32 [%0], {%1, %1, %1, %1};\n" :: "l"(start + first), "f"(0.f) : "memory");
                    else for (int e = 0; e < 4; e++) if (first + e >= 0 && first + e < span) start[first + e] = 0.f;
                }
            } else {
                const int head = (4 - mis) & 3, body = (span - head) & ~3;
                if (lane < head) start[lane] = 0.f;
                if (lane >= 4 && lane - 4 < span - head - body) start[head + body + lane - 4] = 0.f;
                if (lane == 8) {
                    for (int off = 0; off < body; off += ZB) {
                        const int bytes = 4 * min(ZB, body - off);
                        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                                     :: "l"(start + head + off), "r"(zero_addr), "r"(bytes) : "memory");
                    }
                    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
                }
            }
        }
    }
    if (mode == 1 && lane == 8) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
"""

SHAPES_SOURCE = r"""
#define OD 33
#define OH 65
#define OW 65
#define QD 16
#define QH 32
#define COB 64
__device__ __forceinline__ void fill_run(float* start, int span, int lane, int lanes) {
    const int mis = (int)(((unsigned long long)start >> 2) & 3), groups = (mis + span + 3) / 4;
    for (int g = lane; g < groups; g += lanes) {
        const int first = 4 * g - mis;
        if (first >= 0 && first + 4 <= span)
            asm volatile("st.global.v4.f32 [%0], {%1, %1, %1, %1};\n" :: "l"(start + first), "f"(0.f) : "memory");
        else for (int e = 0; e < 4; e++) if (first + e >= 0 && first + e < span) start[first + e] = 0.f;
    }
}
// layout 0: bands of BH rows (tiles (n, qd, row block), runs (c, plane)); 1: whole planes (tiles (n, qd), runs (c,
// plane)); 2: plane pairs contiguous (tiles (n, qd), runs c: planes d0..d1 at once); 3: the output in contiguous
// chunks of 64 x 8450 floats (tiles), runs of 8450 floats; 4: as 0 with BH rows but each run padded to whole 16-byte
// groups (writes up to 3 floats of its neighbours: timing only)
extern "C" __global__ void __launch_bounds__(256, 1) shaped_fill(float* y, int layout, int BH) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row_blocks = (layout == 0 || layout == 4) ? QH / BH : 1;
    const int tiles = 16 * QD * row_blocks;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int qhb = tile % row_blocks, qd = tile / row_blocks % QD, n = tile / row_blocks / QD;
        const int qh0 = qhb * (QH / row_blocks);
        const int d0 = qd == 0 ? 0 : 1 + 2 * qd, d1 = qd == QD - 1 ? OD : 1 + 2 * (qd + 1);
        const int h0 = qh0 == 0 ? 0 : 1 + 2 * qh0, h1 = qh0 + QH / row_blocks >= QH ? OH : 1 + 2 * (qh0 + QH / row_blocks);
        const int span = (h1 - h0) * OW, planes = d1 - d0;
        if (layout == 2) {
            for (int c = warp; c < COB; c += 8)
                fill_run(y + (((long long)n * COB + c) * OD + d0) * (OH * OW), planes * OH * OW, lane, 32);
        } else if (layout == 3) {
            for (int c = warp; c < COB; c += 8)
                fill_run(y + (long long)tile * COB * 8450 + c * 8450, tile * COB * 8450 + c * 8450 + 8450 <= 16 * COB * OD * OH * OW ? 8450 : 0, lane, 32);
        } else {
            for (int run = warp; run < COB * planes; run += 8) {
                const int c = run % COB, plane = d0 + run / COB;
                float* start = y + (((long long)n * COB + c) * OD + plane) * (OH * OW) + h0 * OW;
                if (layout == 4) {
                    float* aligned = (float*)((unsigned long long)start & ~15ull);
                    fill_run(aligned, (span + 3) / 4 * 4, lane, 32);
                } else fill_run(start, span, lane, 32);
            }
        }
    }
}
"""


TEAMS_SOURCE = SHAPES_SOURCE.split("// layout 0:")[0] + r"""
// Tiles of every output channel, each run written by all 256 threads together, one run at a time.
// layout 0: plane pairs (tiles (n, qd), qd fastest), runs c in order; 1: the same, channels rotated by the tile;
// 2: plane pairs, tiles with n fastest; 3: bands of BH rows (tiles (n, qd, row block)), runs (c, plane), c outer.
extern "C" __global__ void __launch_bounds__(256, 1) team_fill(float* y, int layout, int BH) {
    const int row_blocks = layout == 3 ? QH / BH : 1;
    const int tiles = 16 * QD * row_blocks;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        int qhb = tile % row_blocks, qd = tile / row_blocks % QD, n = tile / row_blocks / QD;
        if (layout == 2) { qd = tile / 16; n = tile % 16; }
        const int qh0 = qhb * (QH / row_blocks);
        const int d0 = qd == 0 ? 0 : 1 + 2 * qd, d1 = qd == QD - 1 ? OD : 1 + 2 * (qd + 1);
        const int h0 = qh0 == 0 ? 0 : 1 + 2 * qh0, h1 = qh0 + QH / row_blocks >= QH ? OH : 1 + 2 * (qh0 + QH / row_blocks);
        const int span = (h1 - h0) * OW, planes = d1 - d0;
        if (layout == 3) {
            for (int run = 0; run < COB * planes; run++) {
                const int c = run / planes, plane = d0 + run % planes;
                fill_run(y + (((long long)n * COB + c) * OD + plane) * (OH * OW) + h0 * OW, span, threadIdx.x, 256);
            }
        } else {
            for (int k = 0; k < COB; k++) {
                const int c = layout == 1 ? (k + tile) % COB : k;
                fill_run(y + (((long long)n * COB + c) * OD + d0) * (OH * OW), planes * OH * OW, threadIdx.x, 256);
            }
        }
    }
}
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--form", choices=("bulk", "shapes", "teams"), required=True)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    rows = []
    y = torch.empty(16, 64, 33, 65, 65, device="cuda")

    def row(what, run, check=True):
        y.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        ok = bool((y == 0).all()) if check else "n/a"
        t = time_cuda(run, iters=args.iters)
        rows.append(f"| {what} | {t.mean_ms:.4f} | {t.min_ms:.4f} | all zero {ok} |")
        print(rows[-1], flush=True)

    if args.form == "bulk":
        for zb in (1024, 2048):
            kernel = torch.cuda._compile_kernel(f"#define ZB {zb}\n" + BULK_SOURCE, "band_fill",
                                                compute_capability="90a")
            kernel.set_shared_memory_config(4 * zb)
            for mode in (0, 1):
                for grid in (132, 264):
                    row(f"ZB {zb}, {'bulk' if mode else 'st.v4'}, grid {grid}",
                        lambda: kernel(grid=(grid, 1, 1), block=(256, 1, 1), args=[y, 1024, mode], shared_mem=4 * zb))
    elif args.form == "teams":
        kernel = torch.cuda._compile_kernel(TEAMS_SOURCE, "team_fill", compute_capability="90a")
        names = {0: "plane pairs, channels in order", 1: "plane pairs, channels rotated by the tile",
                 2: "plane pairs, tiles n fastest", 3: "bands"}
        for layout, rows_per_band in ((0, 32), (1, 32), (2, 32), (3, 8)):
            for grid in (132, 264) if layout < 3 else (132, 264, 1056):
                row(f"team per run: {names[layout]}, BH {rows_per_band}, grid {grid}",
                    lambda: kernel(grid=(grid, 1, 1), block=(256, 1, 1), args=[y, layout, rows_per_band]))
        shapes = torch.cuda._compile_kernel(SHAPES_SOURCE, "shaped_fill", compute_capability="90a")
        for grid in (132, 264):  # the thirty-ninth session's warp per run, for comparison in the same call
            row(f"warp per run: plane pairs, grid {grid}",
                lambda: shapes(grid=(grid, 1, 1), block=(256, 1, 1), args=[y, 2, 32]))
            row(f"warp per run: contiguous chunks, grid {grid}",
                lambda: shapes(grid=(grid, 1, 1), block=(256, 1, 1), args=[y, 3, 32]), False)
    else:
        kernel = torch.cuda._compile_kernel(SHAPES_SOURCE, "shaped_fill", compute_capability="90a")
        names = {0: "bands", 1: "whole planes", 2: "plane pairs, one run", 3: "contiguous chunks",
                 4: "bands, runs padded to 16 B"}
        for layout, rows_per_band in ((0, 8), (0, 16), (4, 8), (1, 32), (2, 32), (3, 32)):
            for grid in (132, 264, 1056):
                row(f"{names[layout]}, BH {rows_per_band}, grid {grid}",
                    lambda: kernel(grid=(grid, 1, 1), block=(256, 1, 1), args=[y, layout, rows_per_band]), layout != 3)
    row("zero_", y.zero_)
    row("the driver's cuMemsetD32Async", lambda: memset_d32(y))
    print("\n".join(rows))


def memset_d32(y):
    """y's elements set to the 32-bit pattern 0 by the driver's memset on the current stream."""
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuMemsetD32Async.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
    result = lib.cuMemsetD32Async(y.data_ptr(), 0, y.numel(), torch.cuda.current_stream().cuda_stream)
    if result:
        raise RuntimeError(f"cuMemsetD32Async: {result}")


if __name__ == "__main__":
    main()
