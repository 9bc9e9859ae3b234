"""Problem 77's output filled in the region fill's pattern by programs that do nothing else: does the pattern, or the
few warps of the correlation's programs, keep the fill from the DRAM's rate? (GPU)

    PYTHONPATH=src python3 benchmarks/diag_region_pattern.py [--iters 100] [--rounds 2]
    PYTHONPATH=src:tests python3 benchmarks/diag_region_pattern.py --registers   # on a CPU with NVRTC: ptxas's report

Why: with the region fill (row_runs.py's REGION_FILL) the correlation kernel moves its 630-760 MB at 1.7-2.1 TB/s on
the H100 and 2.0-2.6 on the H200, about half the DRAM's rate, and in FP16 its time is about the correlation's alone
plus a whole fill's (seventy-sixth and seventy-eighth sessions, benchmarks/RESULTS.md). Three things could hold the
fill back: its pattern (each program writes 64 channels x 2 planes of 8 rows, runs of 2,080 bytes 557 KB apart),
its few warps (three programs of four warps a multiprocessor, held there by the correlation's registers and shared
memory), or the correlation beside it. This script times the fill alone, with the correlation's grid and
programs and fill_run<STREAMED> of row_runs.py's REGION_HELPERS (evict-first off the lattice plane) but no MMAs,
loads or lattice stores, in these patterns:

- "region pattern": the library's, each program's region by runs of a row block (2,080 bytes);
- "whole planes": the planes without lattice points by whole planes (16.9 KB runs), a depth's eight programs sharing
  its 64 channels' planes, the lattice plane by the program's own rows as before (in the kernel: diag_region_fill.py's
  "by whole planes" form of the seventy-ninth session, since removed);
- "contiguous": one contiguous chunk of the output a program, in pieces of a row block's floats, the warps taking
  turns: the same code, grid and stores without the pattern's jumps;
- the region pattern with each run's ends moved to the next edge of a 32-byte sector or a 128-byte line (ALIGN), so
  that no sector (line) is written in parts by two programs;
- bulk copies (cp.async.bulk from shared memory, the copy engine's stores; PATTERN 5 to 7): the region pattern in
  whole sectors and the grid-stride order, each run one copy of zeros from shared memory issued by a lane of each
  warp, and the region pattern by persistent programs (one or two a multiprocessor, each going through its tiles
  without a wait), so as to see whether stores that leave the multiprocessor as whole runs come nearer zero_().

"3 a multiprocessor" has the correlation's occupancy, its FP16 shared memory reserved (row_runs.shared_bytes) and
compiled for three programs; "16 a multiprocessor" has no shared memory and as many programs as fit. `out.zero_()`,
PyTorch's fill, is the floor. Each form's output, NaN-poisoned before the call, must be all zeros.

What it found (seventy-ninth session, H100, benchmarks/RESULTS.md): the order of the stores, not the warps, holds
the fill back. At 3 a multiprocessor the region pattern took 0.225 ms (2.54 TB/s, 78% of zero_()'s 0.176), with
plain stores 0.227, at 16 a multiprocessor 0.249-0.289; whole planes 0.221; contiguous chunks 0.201 (0.221 at 16);
the whole output in grid-stride order (program b every gridDim.x-th row block from b on) 0.194 (2.95 TB/s). With the
lattice planes' rows left to their programs, as row_runs.py needs, the grid-stride order for the other planes took
0.228: no gain. In the kernel neither whole planes nor the grid order was faster (diag_region_fill.py's forms of
the seventy-ninth session, removed since; benchmarks/RESULTS.md). Ninety-first session (H100): the region pattern in
whole sectors took 0.189 ms (3.01 TB/s, 93% of zero_()'s rate), in whole lines 0.188, against 0.225 as it falls: the
sectors that two programs write in parts, not the order, cost most of it. row_runs.py's fill now ends its runs at
sectors' edges (SECTOR_EDGES). Ninety-fourth session (H100): bulk copies of the region pattern in whole sectors took
0.1855 ms at 3 a multiprocessor (3.08 TB/s, 95% of zero_()'s 0.1759) against 0.1892 by the warps' 16-byte stores,
0.1893 at 16 a multiprocessor, 0.1872-0.1875 persistent; the grid-stride order by bulk copies 0.1856. So even a
fill that does nothing else stays 5% above zero_() in this pattern, whichever unit stores it.
"""

import argparse

import torch

from convt3d.backends.cuda import row_runs
from convt3d.bench.protocol import time_cuda
from convt3d.bench.report import markdown_table

OUT_SHAPE = (16, 64, 33, 65, 65)  # problem 77's output
LATTICE = (16, 32, 32)  # its lattice (odd depths, rows and columns): the correlation's grid (QD, QH, QW)
SOURCE = r"""
#define COB 64
extern "C" __global__ void __launch_bounds__(128, MIN_BLOCKS)
region_pattern(float* __restrict__ out, int QD, int QH, int qh_blocks, long long syn, long long syc, long long syd,
               long long syh, long long total)
{
    // Programs as row_runs.py's (one phase, one column block): output-channel blocks fastest, then rows, depth,
    // sample. PATTERN 0 (the region): each fills the region that row_runs.py's REGION_FILL gives it, in the same
    // segments and order, with zeros; 1 (whole planes): the planes without lattice points of its depth's region,
    // COB x (region_planes - 1) planes, split among its depth's qh_blocks programs, each taking whole planes of
    // consecutive channels, its warps consecutive row blocks of a plane, then its own rows of the lattice plane as in
    // 0; 2 (contiguous): the output cut into one contiguous chunk a program, in segments of a row block's floats.
    // syd, syh: the output's plane and row strides.
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int tile = blockIdx.x;
    const int ob = tile % (C_OUT / COB); tile /= C_OUT / COB;
    const int qhb = tile % qh_blocks, qh0 = qhb * ROWS; tile /= qh_blocks;
    const int qd = tile % QD, n = tile / QD;
    const int row0 = STRIDE_H * qh0, region_rows = (qh0 + ROWS >= QH ? OUT_H : STRIDE_H * (qh0 + ROWS)) - row0;
    const int region_planes = (qd == QD - 1 ? OUT_D : STRIDE_D * (qd + 1)) - STRIDE_D * qd;
    float* const block = out + n * syn + (long long)ob * COB * syc;
    const long long piece_floats = STRIDE_H * ROWS * OUT_W;
#if PATTERN == 5 || PATTERN == 6 || PATTERN == 7
    // 5: the region pattern in whole sectors (ALIGN 8), 6: the grid-stride order, 7: 5 by persistent programs (the
    // program's tiles b, b + G, ... for G programs, no wait between them), each run a bulk copy (cp.async.bulk, the
    // copy engine's store of shared memory into global memory) of BULK_ZEROS zeros in shared memory, issued by lane 0
    // of each warp, so that the stores leave the multiprocessor as whole runs, not as 16-byte stores.
    __shared__ __align__(128) float4 zeros[BULK_ZEROS / 4];
    for (int i = tid; i < BULK_ZEROS / 4; i += 128) zeros[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const unsigned zeros_at = (unsigned)__cvta_generic_to_shared(zeros);
    auto bulk_run = [&](long long from, long long to) {  // floats [from, to) of out, 16-byte aligned ends
        for (long long at = from; at < to; at += BULK_ZEROS) {
            const unsigned bytes = (unsigned)(4 * min((long long)BULK_ZEROS, to - at));
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                         :: "l"(out + at), "r"(zeros_at), "r"(bytes) : "memory");
        }
    };
    if (lane == 0) {
#if PATTERN == 5 || PATTERN == 7
        const int tiles = PATTERN == 7 ? (int)(total / syn) * QD * qh_blocks * (C_OUT / COB) : 1;
        for (int t = PATTERN == 7 ? blockIdx.x : 0; t < tiles; t += PATTERN == 7 ? gridDim.x : 1) {
            int tile = PATTERN == 7 ? t : blockIdx.x;
            const int ob = tile % (C_OUT / COB); tile /= C_OUT / COB;
            const int qh0 = tile % qh_blocks * ROWS; tile /= qh_blocks;
            const int qd = tile % QD, n = tile / QD;
            const int row0 = STRIDE_H * qh0;
            const int region_rows = (qh0 + ROWS >= QH ? OUT_H : STRIDE_H * (qh0 + ROWS)) - row0;
            const int region_planes = (qd == QD - 1 ? OUT_D : STRIDE_D * (qd + 1)) - STRIDE_D * qd;
            float* const block = out + n * syn + (long long)ob * COB * syc;
            for (int s = warp; s < COB * region_planes; s += 4) {
                const int k = s / COB, c = s % COB;
                const int d = STRIDE_D * qd + (k == region_planes - 1 ? LATTICE_D : k + (k >= LATTICE_D));
                const long long nominal = block + c * syc + d * syd + row0 * syh - out;
                bulk_run((nominal + 7) / 8 * 8, min((nominal + region_rows * OUT_W + 7) / 8 * 8, total));
            }
        }
#else
        for (long long at = (blockIdx.x + (long long)warp * gridDim.x) * piece_floats; at < total;
             at += 4LL * gridDim.x * piece_floats)
            bulk_run((at + 7) / 8 * 8, min((at + piece_floats + 7) / 8 * 8, total));
#endif
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // the zeros read before the program ends
    }
#elif PATTERN == 2 || PATTERN == 3
    // 2: this program's chunk; 3: every gridDim.x-th piece from its own on.
    const long long chunk = (total + gridDim.x - 1) / gridDim.x, start = PATTERN == 2 ? chunk * blockIdx.x : 0;
    const long long end = PATTERN == 2 ? min(start + chunk, total) : total;
    const long long first = PATTERN == 2 ? start + warp * piece_floats
                                         : (blockIdx.x + (long long)warp * gridDim.x) * piece_floats;
    const long long step = PATTERN == 2 ? 4 * piece_floats : 4LL * gridDim.x * piece_floats;
    for (long long at = first; at < end; at += step)
        fill_run<EVICT_FIRST != 0>(out + at, (int)min(piece_floats, end - at), 0.f, lane);
#else
#if PATTERN == 1
    const int pieces = COB * (region_planes - 1) * qh_blocks;  // (channel, plane without lattice points, row block)
    const int first = pieces * qhb / qh_blocks, own = pieces * (qhb + 1) / qh_blocks - first;
#elif PATTERN == 4
    // Every plane without lattice points of the output, (sample, channel, plane, row block) in memory order, cut in
    // row blocks: this program's are every gridDim.x-th from its own on.
    const int zero_planes = OUT_D - QD;
    const long long samples = gridDim.x / (QD * qh_blocks * (C_OUT / COB));
    const long long pieces = samples * C_OUT * zero_planes * qh_blocks;
    const int own = (int)max(0LL, (pieces - blockIdx.x + gridDim.x - 1) / gridDim.x);
#else
    const int own = 0, first = 0;
#endif
    const int segments = own + COB * (PATTERN == 0 ? region_planes : 1);
    for (int s = warp; s < segments; s += 4) {
#if PATTERN == 4
        if (s < own) {
            long long piece = (long long)s * gridDim.x + blockIdx.x;
            const int rb = piece % qh_blocks; piece /= qh_blocks;
            const int z = piece % zero_planes; piece /= zero_planes;
            const int c = piece % C_OUT, qz = min(z / (STRIDE_D - 1), QD - 1), k = z - qz * (STRIDE_D - 1);
            const int r0 = STRIDE_H * ROWS * rb, rows = (rb == qh_blocks - 1 ? OUT_H : STRIDE_H * ROWS * (rb + 1)) - r0;
            const int d = STRIDE_D * qz + k + (k >= LATTICE_D);
            float* const at = out + piece / C_OUT * syn + c * syc + d * syd + r0 * syh;
            fill_run<EVICT_FIRST != 0>(at, rows * OUT_W, 0.f, lane);
            continue;
        }
#else
        if (s < own) {
            const int piece = first + s, rb = piece % qh_blocks, k = piece / qh_blocks % (region_planes - 1);
            const int c = piece / qh_blocks / (region_planes - 1), r0 = STRIDE_H * ROWS * rb;
            const int rows = (rb == qh_blocks - 1 ? OUT_H : STRIDE_H * ROWS * (rb + 1)) - r0;
            const int d = STRIDE_D * qd + k + (k >= LATTICE_D);
            fill_run<EVICT_FIRST != 0>(block + c * syc + d * syd + r0 * syh, rows * OUT_W, 0.f, lane);
            continue;
        }
#endif
        const int k = PATTERN != 0 ? region_planes - 1 : (s - own) / COB, c = (s - own) % COB;
        const int d = STRIDE_D * qd + (k == region_planes - 1 ? LATTICE_D : k + (k >= LATTICE_D));
        // ALIGN > 1: the segment's ends moved up to whole ALIGN-float units of the output (a segment's first unit
        // shared with the segment before is that one's), so that no 32-byte sector (ALIGN 8) or 128-byte line (32)
        // has two writers.
        const long long nominal = block + c * syc + d * syd + row0 * syh - out;
        const long long from = (nominal + ALIGN - 1) / ALIGN * ALIGN;
        const long long to = min((nominal + region_rows * OUT_W + ALIGN - 1) / ALIGN * ALIGN, total);
        float* const at = out + from;
        if (k == region_planes - 1 || !EVICT_FIRST) fill_run<false>(at, (int)(to - from), 0.f, lane);
        else fill_run<true>(at, (int)(to - from), 0.f, lane);
    }
#endif
}
"""
# (name, programs a multiprocessor, shared memory reserved, evict-first stores off the lattice plane, PATTERN[,
# ALIGN])
FORMS = (
    ("region pattern, 3 a multiprocessor", 3, True, True, 0),
    ("region pattern, segments in whole sectors, 3 a multiprocessor", 3, True, True, 0, 8),
    ("region pattern, segments in whole lines, 3 a multiprocessor", 3, True, True, 0, 32),
    ("whole planes, 3 a multiprocessor", 3, True, True, 1),
    ("contiguous, 3 a multiprocessor", 3, True, True, 2),
    ("contiguous, 16 a multiprocessor", 16, False, True, 2),
    ("grid-stride, 3 a multiprocessor", 3, True, True, 3),
    ("grid-stride planes without lattice points, own lattice rows, 3 a multiprocessor", 3, True, True, 4),
    ("bulk copies, region pattern in whole sectors, 3 a multiprocessor", 3, True, True, 5),
    ("bulk copies, region pattern in whole sectors, 16 a multiprocessor", 16, False, True, 5),
    ("bulk copies, grid-stride, 3 a multiprocessor", 3, True, True, 6),
    ("bulk copies, region pattern in whole sectors, persistent, 1 a multiprocessor", 1, False, True, 7),
    ("bulk copies, region pattern in whole sectors, persistent, 2 a multiprocessor", 2, False, True, 7),
)


def source(min_blocks: int, streamed: bool, pattern: int, align: int = 1) -> str:
    (_, c_out, out_d, out_h, out_w) = OUT_SHAPE
    defines = dict(C_OUT=c_out, ROWS=row_runs.ROWS, OUT_D=out_d, OUT_H=out_h, OUT_W=out_w, STRIDE_D=2, STRIDE_H=2,
                   LATTICE_D=1, MIN_BLOCKS=min_blocks, EVICT_FIRST=int(streamed), PATTERN=pattern, ALIGN=align,
                   BULK_ZEROS=1024)
    return "".join(f"#define {k} {v}\n" for k, v in defines.items()) + row_runs.REGION_HELPERS + SOURCE


def correlation_shared_bytes() -> int:
    """row_runs.py's FP16 kernel's shared memory on problem 77 (taps 3 x 3 x 3 at the phase's dilation 1, XW 34)."""
    return row_runs.shared_bytes((3, 3, 3), (1, 1, 1), 34, 3)


def registers() -> None:
    from test_cuda_compile import registers_and_spills
    for name, blocks, _, streamed, *pattern in FORMS:
        print(f"{name}: (registers, spilled bytes) {registers_and_spills(source(blocks, streamed, *pattern))}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--registers", action="store_true", help="only ptxas's report, on a CPU with NVRTC")
    parser.add_argument("--forms", default="",
                        help="only the forms whose names hold one of these comma-separated words")
    args = parser.parse_args()
    if args.registers:
        registers()
        return
    from convt3d.backends import cuda
    from diag_programs_per_sm import occupancy

    out = torch.empty(OUT_SHAPE, device="cuda")
    qd, qh, _ = LATTICE
    qh_blocks = -(-qh // row_runs.ROWS)
    programs = OUT_SHAPE[0] * qd * qh_blocks * (OUT_SHAPE[1] // 64)
    stream = torch.cuda.current_stream().cuda_stream
    forms = []
    words = [w for w in args.forms.split(",") if w]
    for name, blocks, reserve, streamed, *pattern in FORMS:
        if words and not any(w in name for w in words):
            continue
        kernel = cuda._Kernel(source(blocks, streamed, *pattern), "region_pattern",
                              correlation_shared_bytes() if reserve else 0, 128)
        grid = (torch.cuda.get_device_properties(0).multi_processor_count * blocks if pattern[0] == 7
                else programs)  # (persistent programs: as many as the multiprocessors hold)
        launch = (lambda k, g: lambda: k.launch(g, (out.data_ptr(),), (qd, qh, qh_blocks),
                                                tuple(out.stride()[:4]) + (out.numel(),), stream))(kernel, grid)
        forms.append((f"{name} ({occupancy(kernel)} held)", launch))
    forms.append(("out.zero_()", out.zero_))
    rows = []
    for round_ in range(args.rounds):
        for name, launch in forms:
            check = ""
            if round_ == 0:
                out.fill_(float("nan"))
                launch()
                torch.cuda.synchronize()
                check = f"all zeros {bool((out == 0).all())}"
            t = time_cuda(launch, iters=args.iters)
            rows.append((f"{name} (round {round_ + 1})", f"{t.mean_ms:.4f}", f"{t.min_ms:.4f}",
                         f"{out.numel() * 4 / t.mean_ms / 1e9:.2f}", check))
            print(rows[-1], flush=True)
    print(markdown_table(["what", "mean ms", "min ms", "TB/s by the mean", "check"], rows))


if __name__ == "__main__":
    main()
