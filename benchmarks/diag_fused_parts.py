"""Problem 77's forward with the fill warpgroup (row_runs.py's FILL_WARPGROUP, the library's in both precision modes)
taken apart: what each part of the one kernel costs when the others are left out. (GPU)

    PYTHONPATH=src:tests python3 benchmarks/diag_fused_parts.py [--iters 100] [--rounds 2]
    PYTHONPATH=src:tests python3 benchmarks/diag_fused_parts.py --registers   # on a CPU with NVRTC: ptxas's report

Why: on the H200 the library's forward took 0.236-0.26 ms in TF32 mode (eightieth session) where writing the output
alone takes 0.125 and the correlation into a filled output's lattice alone 0.132 (seventieth session): the fill
warpgroup's stores and the computing warpgroup's work overlap by little. If the computing warpgroup alone (no fill)
takes about what the whole kernel takes, the correlation is the critical path and the fill is hidden; if the fill
alone does, the stores are; if each alone is well under the whole, they contend for something (the DRAM, the L2, the
multiprocessor's memory pipeline).

Forms:
- the library's kernel;
- what-ifs (wrong results, timed only): no fill (the fill warpgroup keeps its barriers but stores nothing); fill only
  (the computing warpgroup skips every depth tap: no plane loads, weights or MMAs, and writes its tile of bias
  values); no tile write (the computing warpgroup computes but does not write its lattice tile); the region fill alone
  (both of the last two);
- the fill warpgroup's stores done other ways (right results, checked): plain stores throughout (the library's are
  evict-first for the planes without lattice points); the warpgroup's 128 threads over one segment at a time (the
  library's: each warp its own segment, four channels' runs at once); fill_run's store loop unrolled by 4 (FP16 only:
  3xFP16's is not unrolled, so that its 40 registers hold it); the planes without lattice points by bulk copies of
  zeros from shared memory (the tensor memory accelerator's stores); the lattice plane by the computing warpgroup
  once it has issued its last MMAs; the fill in grid order (GRID_FILL below: the programs that run together write
  neighbouring memory, the lattice rows left to the computing warpgroup, which writes them whole) and, as a what-if,
  that fill alone (prepared in the eighty-first session, not run: no device time was left);
- the output's zero_() alone (the floor in this process).

What it found (eighty-first session, an H100, five calls of three rounds, benchmarks/RESULTS.md; medians in ms, FP16 /
3xFP16, a few rounds' outliers left out): the library's 0.293-0.295 / 0.342-0.346; no fill 0.171-0.173 / 0.262-0.268;
the region fill alone 0.228-0.229 / 0.243-0.244, against zero_()'s 0.176; fill only 0.270-0.272 / 0.284-0.286; no
tile write 0.263 / 0.305-0.307. So the kernel takes about what its fill and its tile write take, and the fill alone
takes 30% more than zero_() writing the whole output. Every other way of the fill was slower: plain stores 0.321-0.324
/ 0.385-0.390, a segment at a time 0.333-0.394 / 0.378-0.444, bulk copies 0.330-0.406 / 0.401-0.404, the lattice plane
by the computing warpgroup 0.303-0.368 / 0.358-0.419. FP16's loop unrolled by 4 had the lower median in 10 of 12
rounds (0.2906-0.3022 against 0.2933-0.3347) and the faster fastest call in all 12 (0.2875-0.2896 against
0.2901-0.2919): about 1%, not in the library yet (not measured on an H200).

Rows: bench.protocol.time_cuda's mean, median and minimum in ms (L2 flushed before each call), the forms taking turns
per round, in FP16 (TF32 mode, reading the input) and 3xFP16 (TF32 off, reading the window).
"""

from convt3d.backends.cuda import row_runs
from p77_correlation import (LIBRARY_DIRECT_INPUT, LIBRARY_ROW_RUNS_KERNEL, P77, Timings, arguments, modes,
                             patched_row_runs, patched_row_runs_source, problem_77, use_row_runs)

NO_FILL = (("fill_segments(0, segments - COB);  // the planes", "// the planes"),
           ("fill_segments(segments - COB, segments);  // the lattice plane", "// the lattice plane"))
FILL_ONLY = (('asm volatile("bar.arrive 3, %0;\\n" :: "n"(2 * THREADS) : "memory");\n#endif\n',
              'asm volatile("bar.arrive 3, %0;\\n" :: "n"(2 * THREADS) : "memory");\n#endif\n        continue;\n'),)
NO_TILE_WRITE = (("    write_tile<ROWS, COB, THREADS>(staged", "    if (0) write_tile<ROWS, COB, THREADS>(staged"),)
PLAIN_STORES = (("else fill_run<true>(at, region_rows * OUT_W, value, lane);",
                 "else fill_run<false>(at, region_rows * OUT_W, value, lane);"),)
WARPGROUP_SEGMENTS = (("for (int s = first + warp; s < end; s += THREADS / 32) {",
                       "for (int s = first; s < end; s++) {"),
                      ("for (int i = lane; i < quads; i += 32)", "for (int i = lane; i < quads; i += THREADS)"),
                      ("fill_run<false>(at, region_rows * OUT_W, value, lane);",
                       "fill_run<false>(at, region_rows * OUT_W, value, tid);"),
                      ("fill_run<true>(at, region_rows * OUT_W, value, lane);",
                       "fill_run<true>(at, region_rows * OUT_W, value, tid);"))
# The lattice plane's fill by the computing warpgroup, once it has issued its last depth tap's MMAs (while they run),
# the fill warpgroup's by the other planes alone: the two warpgroups' shares nearer even.
LATTICE_PLANE_BY_COMPUTING_WARPS = (
    ('        asm volatile("bar.sync 3, %0;\\n" :: "n"(2 * THREADS) : "memory");  // the last depth tap begun\n'
     '        fill_segments(segments - COB, segments);  // the lattice plane\n', ''),
    ('        if (kd == KD - 1)  // the fill warpgroup\'s turn for the lattice plane\n'
     '            asm volatile("bar.arrive 3, %0;\\n" :: "n"(2 * THREADS) : "memory");\n', ''),
    ('#if REGION_FILL && !FILL_BESIDE_LOADS\n        fill_part(kd);\n',
     '        if (kd == KD - 1) fill_segments(segments - COB, segments);\n#if REGION_FILL && !FILL_BESIDE_LOADS\n'
     '        fill_part(kd);\n'),
)
# The fill warpgroup's planes without lattice points by bulk copies (cp.async.bulk.global.shared::cta, the tensor
# memory accelerator's stores, not the warps': one instruction a segment) from a run of zeros in shared memory beyond
# the rest (no bias: with one, the warps' stores); the lattice plane keeps the warps' stores. The copies' reads of
# shared memory are waited for before the fill warpgroup ends.
BULK_HEAD = r"""
#define ZERO_AT (((KH * KW * W_TAP_FLOATS + PLANE_POS * (ROW / 4) > COB * OCS ? \
                   KH * KW * W_TAP_FLOATS + PLANE_POS * (ROW / 4) : COB * OCS) + 3) / 4 * 4)
#define ZERO_FLOATS (STRIDE_H * (ROWS + 1) * OUT_W)
__device__ __forceinline__ void fill_run_bulk(float* p, int count, unsigned zeros_addr, int lane) {
    const int head = min((int)((16 - ((unsigned long long)p & 15)) & 15) >> 2, count);
    const int body = (count - head) & ~3, tail = count - head - body;
    if (lane < head) __stcs(p + lane, 0.f);
    if (lane == 0 && body > 0)
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                     :: "l"(p + head), "r"(zeros_addr), "r"(4 * body) : "memory");
    if (lane < tail) __stcs(p + head + body + lane, 0.f);
}
"""
BULK = (
    ("    const int segments = COB * region_planes;\n",
     "    const int segments = COB * region_planes;\n"
     "    const unsigned zeros_addr = smem_addr((float*)smem4 + ZERO_AT);\n"),
    ("            else fill_run<true>(at, region_rows * OUT_W, value, lane);",
     "            else if (HAS_BIAS) fill_run<true>(at, region_rows * OUT_W, value, lane);\n"
     "            else fill_run_bulk(at, region_rows * OUT_W, zeros_addr, lane);"),
    ("        fill_segments(0, segments - COB);  // the planes without lattice points\n",
     "        for (int e = tid; e < ZERO_FLOATS; e += THREADS) ((float*)smem4)[ZERO_AT + e] = 0.f;\n"
     '        asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");\n'
     '        asm volatile("bar.sync 4, %0;\\n" :: "n"(THREADS) : "memory");\n'
     "        fill_segments(0, segments - COB);  // the planes without lattice points\n"
     '        if (lane == 0) asm volatile("cp.async.bulk.commit_group;\\n" ::: "memory");\n'),
    ("        __threadfence_block();\n",
     '        if (lane == 0) asm volatile("cp.async.bulk.wait_group.read 0;\\n" ::: "memory");\n'
     "        __threadfence_block();\n"),
)


def bulk_shared_bytes(taps, dilation, window_columns, split):
    """row_runs.shared_bytes and BULK's run of zeros (problem 77's: 2 x 5 rows of 65 floats) after it."""
    return -(-row_runs.shared_bytes(taps, dilation, window_columns, split) // 16) * 16 + 4 * 2 * 5 * 65


# The fill warpgroup's fill in grid order (problem 77's lattice only, no bias; prepared in the eighty-first session,
# not run): units of 8 output rows, unit 4 b + w + 4 G i for warp w of program b (G programs), so that the programs
# that run together write neighbouring memory as zero_() does (diag_region_pattern.py: 0.194 ms in grid order against
# 0.225 in the region pattern, the fill alone on an H100); the lattice rows (odd rows of odd planes) left out, and with
# each the ends of its neighbour rows up to the 32-byte sectors it shares with them. The computing warpgroup writes
# each lattice row whole instead (its values at the odd columns, zeros between), from its first sector's start to its
# last sector's end. So every sector is written by one warp (or by two neighbouring units' warps at about the same
# time), and no warpgroup waits for the other: no barriers between them. GRID_COMPUTE 0: the fill alone (the
# computing warpgroup skips its depth taps and writes nothing; wrong results).
GRID_HEAD = "#define LATTICE_H 1\n#define LATTICE_W 1\n#define STRIDE_W 2\n"
GRID_FILL_WARPGROUP = r"""        fill_segments(0, segments - COB);  // the planes without lattice points
        asm volatile("bar.sync 3, %0;\n" :: "n"(2 * THREADS) : "memory");  // the last depth tap begun
        fill_segments(segments - COB, segments);  // the lattice plane
        __threadfence_block();
        asm volatile("bar.arrive 2, %0;\n" :: "n"(2 * THREADS) : "memory");
"""
GRID_FILL_WARPGROUP_NEW = r"""        const int batch = gridDim.x / (C_OUT / COB * phase_count * qh_blocks * QD);
        const int rows_total = batch * C_OUT * OUT_D * OUT_H;  // (rows, not floats: within an int)
        auto lattice_row = [&](int r) {
            const int plane_row = r % (OUT_D * OUT_H), d = plane_row / OUT_H, h = plane_row % OUT_H;
            return d % STRIDE_D == LATTICE_D && d / STRIDE_D < QD && h % STRIDE_H == LATTICE_H && h / STRIDE_H < QH;
        };
        for (int unit = 4 * blockIdx.x + warp; unit < (rows_total + 7) / 8; unit += 4 * gridDim.x) {
            long long run = -1;  // the open run's first float
            const int end_row = min(8 * unit + 8, rows_total);
            #pragma unroll 1
            for (int r = 8 * unit; r < end_row; r++) {
                const long long start = (long long)r * OUT_W;
                if (lattice_row(r)) {  // the run ends at the lattice row's first sector
                    if (run >= 0) fill_run<true>(out + run, (int)((start & ~7LL) - run), 0.f, lane);
                    run = -1;
                } else if (run < 0) {  // a run begins, after the last sector of a lattice row before it
                    run = r > 0 && lattice_row(r - 1) ? (start + 7) & ~7LL : start;
                }
            }
            if (run >= 0) {
                const long long end = (long long)end_row * OUT_W;
                const bool before_lattice = end_row < rows_total && lattice_row(end_row);
                fill_run<true>(out + run, (int)((before_lattice ? end & ~7LL : end) - run), 0.f, lane);
            }
        }
"""
GRID_LATTICE_TURN = r"""#if FILL_WARPGROUP
        if (kd == KD - 1)  // the fill warpgroup's turn for the lattice plane
            asm volatile("bar.arrive 3, %0;\n" :: "n"(2 * THREADS) : "memory");
#endif
"""
GRID_LATTICE_TURN_NEW = "#if !GRID_COMPUTE\n        continue;\n#endif\n"
GRID_WRITE = ('    asm volatile("bar.sync 2, %0;\\n" :: "n"(2 * THREADS) : "memory");'
              "  // and the fill warpgroup's stores done\n")
GRID_WRITE_NEW = r"""    compute_sync();
    for (int job = warp; GRID_COMPUTE && job < ROWS * COB; job += THREADS / 32) {
        const int r = job % ROWS, o = job / ROWS, qh = qh0 + r;
        if (qh >= QH) continue;  // (the same for the whole warp)
        const long long f0 = n * syn + (long long)(ob * COB + o) * syc
                             + (long long)(STRIDE_D * qd + LATTICE_D) * plane_floats
                             + (long long)(STRIDE_H * qh + LATTICE_H) * row_floats;  // the row's first float
        const float* tile_row = staged + o * OCS + r * XW;
        float* const from = out + (f0 & ~7LL);  // the row's first sector
        const int lead = (int)(f0 & 7), span = (lead + OUT_W + 7) & ~7;
        #pragma unroll 1
        for (int i = lane; i < span / 4; i += 32) {  // 16-byte stores: one a lane, 18-20 lanes a row
            float v[4];
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = 4 * i + e - lead, q = (col - LATTICE_W) / STRIDE_W;
                const bool on = col >= LATTICE_W && col < OUT_W && (col - LATTICE_W) % STRIDE_W == 0 && q < QW;
                v[e] = on ? tile_row[q] : 0.f;
            }
            ((float4*)from)[i] = make_float4(v[0], v[1], v[2], v[3]);
        }
    }
    return;
"""
GRID_FILL = ((GRID_FILL_WARPGROUP, GRID_FILL_WARPGROUP_NEW), (GRID_LATTICE_TURN, GRID_LATTICE_TURN_NEW),
             (GRID_WRITE, GRID_WRITE_NEW))
UNROLLED_4 = (("    for (int i = lane; i < quads; i += 32)",
               "    #pragma unroll 4\n    for (int i = lane; i < quads; i += 32)"),)
# (name, patches, checked: whether its result is right, the one precision (split) it serves or None for both, the
# head put before its source)
FORMS = (
    ("the library's", (), True, None, ""),
    ("what-if: no fill", NO_FILL, False, None, ""),
    ("what-if: fill only (and the tile of bias values)", FILL_ONLY, False, None, ""),
    ("what-if: no tile write", NO_TILE_WRITE, False, None, ""),
    ("what-if: the region fill alone (no correlation, no tile write)", FILL_ONLY + NO_TILE_WRITE, False, None, ""),
    ("fill: plain stores throughout", PLAIN_STORES, True, None, ""),
    ("fill: the warpgroup over one segment at a time", WARPGROUP_SEGMENTS, True, None, ""),
    ("fill: its store loop unrolled by 4", UNROLLED_4, True, 3, ""),
    ("fill: bulk copies of zeros for the planes without lattice points", BULK, True, None, BULK_HEAD),
    ("fill: the lattice plane by the computing warpgroup after its last MMAs", LATTICE_PLANE_BY_COMPUTING_WARPS, True,
     None, ""),
    ("fill: in grid order, the lattice rows whole by the computing warpgroup", GRID_FILL, True, None,
     GRID_HEAD + "#define GRID_COMPUTE 1\n"),
    ("what-if: the grid-order fill alone", GRID_FILL, False, None, GRID_HEAD + "#define GRID_COMPUTE 0\n"),
)


def builder(patches, head):
    if not patches:
        return LIBRARY_ROW_RUNS_KERNEL
    return patched_row_runs(*patches, head=head, exactly_once=True, threads=2 * row_runs.THREADS,
                            shared_bytes=bulk_shared_bytes if patches is BULK else None)


def registers() -> None:
    """ptxas's registers and spills per form and precision for problem 77 (NVRTC on this machine)."""
    from test_cuda_compile import P77_INPUT, P77_REGION, registers_and_spills
    for split, geometry, mode in ((3, P77_INPUT, "FP16, input"), (2, None, "3xFP16, window")):
        for name, patches, _, only, head in FORMS:
            if only not in (None, split):
                continue
            text = patched_row_runs_source(patches, split=split, input_geometry=geometry, region=P77_REGION,
                                           head=head, exactly_once=True)
            print(f"{mode}, {name}: (registers, spilled bytes) {registers_and_spills(text)}")


def main():
    args = arguments(2, registers)
    import convt3d
    from convt3d.backends import cuda
    from diag_overlap import checked

    x, w, _, _ = problem_77()
    forward = lambda: convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
    builders = [(name, builder(patches, head), right, only) for name, patches, right, only, head in FORMS]
    timings = Timings(args.iters)
    library_region_fill = cuda.REGION_FILL
    cuda.REGION_FILL = True
    try:
        for mode, split, reference, eager in modes(x, w):
            direct_input = split == 3  # as the library reads them (cuda.reads_input)
            use_row_runs(LIBRARY_ROW_RUNS_KERNEL, direct_input=direct_input)
            expected = forward()
            for round_ in range(args.rounds):
                for name, build, right, only in builders:
                    if only not in (None, split):
                        continue
                    use_row_runs(build, direct_input=direct_input)
                    check = checked(forward, expected, reference, eager) if round_ == 0 and right else ""
                    timings.row(mode, f"{name} (round {round_ + 1})", forward, check)
                timings.row(mode, f"zero_() of the output alone (round {round_ + 1})", expected.zero_)
    finally:
        cuda.REGION_FILL = library_region_fill
        use_row_runs(LIBRARY_ROW_RUNS_KERNEL, direct_input=LIBRARY_DIRECT_INPUT)
    print(timings.table())


if __name__ == "__main__":
    main()
