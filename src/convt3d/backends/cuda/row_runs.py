"""CUDA C++ source of the phase correlation over runs of whole window rows, for 32 input channels and whole blocks of
64 output channels in FP16 (TF32 mode) and 3xFP16 (TF32 off): phase_conv.py's contract (the same arguments, phases,
operands and results, for the forward's correlations and grad_input's alike), the MMA turned around.

phase_conv.py's kernel takes window positions as the MMA's M (A fragments loaded from shared memory into registers by
ldmatrix, four m64n64 MMAs a k-step) and the output channels as its N. This one takes the 64 output channels of a
block as M and a run of the window's positions as N, both operands read by the tensor cores from shared memory through
descriptors. A window plane's rows lie XW positions apart (the window is padded to whole tiles of 32 columns and the
taps' reach, cuda.window_extent), so ROWS of its rows are one run of ROWS x XW positions: the MMA's N, to a
multiple of 8 (m64n136k16 for problem 77, XW = 34). Each row's last XW - QW positions are outputs nobody reads (6% of
the MMAs on problem 77), and each tap (kh, kw) reads the run from position kh * DH * XW + kw * DW on: wgmma reads a
swizzled operand from any row. A grid of QW <= 32 columns, then, one column block.

A program (one warpgroup; two where a second one fills the output around the tile, FILL_WARPGROUP below) owns ROWS rows
of one qd plane and 64 output channels. Per depth tap it copies the weights of the tap's KH x KW taps into shared memory
(16-byte cp.async) and reads the window plane (ROWS + (KH - 1) * DH rows) into registers, scales and splits it into FP16
halves as phase_conv.py's split_plane does (the weight's channel order), and stores each position as a row: 64 bytes of
hi halves in FP16 (64-byte swizzle), 128 bytes of hi then lo halves in 3xFP16 (128-byte swizzle), as the weight's rows.
Then it issues every MMA of the depth tap without a wait between them (3xFP16: PROMOTE k-steps into a partial sum, then
a wait and the partial added, as phase_conv.py's). The tile is staged in shared memory and written row by row, each
warp's 32 lanes over 32 consecutive columns.

INPUT_DIRECT (the forward in FP16, on an input whose rows are contiguous: cuda.reads_input): the kernel reads each
plane from the input itself, (N, C, D, H, W) through its strides, zero outside it, rather than from the operand
pass's channels-last window, and the pass writes only the weight's halves and, unless the kernel finds each plane's
scale itself (OWN_MAXIMA, PLANE_MAXIMA below), the window's block maxima (window.correlation_operands' window=False,
maxima). The same values reach the MMAs, so the result is bitwise the window's;
the window's bytes (written by the pass, then read here) are saved. On the H200, problem 77's forward took 0.272-0.273
ms against 0.290 reading the window in FP16, but 0.354-0.360 against 0.350-0.354 in 3xFP16, which keeps the window
(benchmarks/diag_direct_input.py, sixty-eighth session). The input's sizes, strides and the window's start are
macros, so that its offsets fold into the loads: as kernel arguments (a pointer stepped along the channels; indexed,
the FP16 kernel spilled), FP16's forward took 0.281-0.286 ms.

Measured on the H200 for problem 77 (sixty-fourth session, benchmarks/RESULTS.md). benchmarks/diag_turned.py, where
this kernel was built, on the same operands: FP16 with three programs per multiprocessor, the compact correlation
0.096 ms against phase_conv.py's 0.108, into the output's lattice 0.134-0.143 against 0.162, bitwise the same result;
with a weight ring of one tap a stage (a wait and a barrier each tap) instead of a depth tap's weights at once, 0.106.
`python3 -m convt3d bench`, with this kernel and without (CONVT3D_ROW_RUNS=0) in alternating processes: the forward
0.2915-0.2987 ms against 0.3108-0.3114 in TF32 mode, 0.3483-0.3542 against 0.3658-0.3666 with TF32 off (3.1e-7 off
float64 against 2.2e-7: PROMOTE 4; with phase_conv.py's 2, no faster than phase_conv.py's kernel in diag_turned).
"""

from ... import environment
from .phase_conv import COPY_HELPERS, FP16_HELPERS, MAX_PHASES, PHASE_FIELDS, PHASE_HELPERS, TILE_HELPERS

ROWS = 4
# REGION_FILL in FP16: the segments' ends at sectors' edges (region_macros, SOURCE's sector_edge);
# CONVT3D_SECTOR_EDGES=0 leaves them where the rows fall. 3xFP16 always leaves them there: on the H200 problem 77's
# forward took 0.296-0.297 ms so against 0.299-0.300 with the edges, where FP16 took 0.221 with them against 0.224
# (an H100 had 3xFP16 1-3% faster with them; ninety-first and ninety-eighth sessions).
SECTOR_EDGES = environment.switch("CONVT3D_SECTOR_EDGES", True)
# FP16: each window plane scaled by its own largest magnitude, which the kernel finds in the values it loads, holding
# every load round of the plane (OWN_MAXIMA, up to MAX_HELD_ROUNDS rounds), rather than by the operand pass's block
# maxima of every plane a program reads; the pass reading the input itself then makes the weight's halves alone (64
# programs for problem 77 against 9,856 with the maxima). On an H100 problem 77's forward took 0.2698-0.2702 ms so
# (medians of three rounds) against 0.2773-0.2781, and 0.2669-0.2686 launched as the pass's dependent
# (cuda.DEPENDENT) too; the pass alone took 0.021 (benchmarks/diag_pass_share.py, ninety-third session).
# CONVT3D_PLANE_MAXIMA=0 takes the pass's maxima. Set before a layer's first call (its kernels are kept).
PLANE_MAXIMA = environment.switch("CONVT3D_PLANE_MAXIMA", True)
MAX_HELD_ROUNDS = 3
# 3xFP16: k-steps per partial sum (phase_conv.py's PROMOTE, which is 2 there).
PROMOTE = 4
# The largest N (positions per tile) per precision: 3xFP16 keeps a partial sum beside the sums (N / 2 floats a
# thread each); beyond 136, compiled here for sm_90a, ptxas spills. wgmma's N is at most 256.
MAX_POSITIONS = {2: 136, 3: 256}
THREADS = 128

# What a kernel of this kind needs beside its body (and benchmarks/diag_depth_ring.py's too): the tile's and plane's
# sizes, the rows' swizzle, the operands' descriptors and the MMA (mma_helpers puts its PTX in).
MMA_HELPERS = r"""
#define NP ((ROWS * XW + 7) / 8 * 8)          // positions per tile: the MMA's N
#define HH (ROWS + (KH - 1) * DH)              // window rows of a depth tap's plane
// The plane's rows in shared memory: as far as a tap's N positions reach (the phases' column offset is at most XW -
// 32 - (KW - 1) * DW); those past its HH * XW positions only for outputs nobody reads, and zero.
#define PLANE_POS ((NP + (KH - 1) * DH * XW + XW - 32 + 7) / 8 * 8)
#define COB 64                                 // output channels per program: the MMA's M
#define ROW (SPLIT == 2 ? 128 : 64)            // bytes of a weight or window row: hi and lo halves, or hi
#define CHUNKS (ROW / 16)
#define W_TAP_FLOATS (COB * ROW / 4)           // floats of a tap's weight rows in shared memory
#define PARTIALS (SPLIT == 2)
#define UNITS (2 * HH * XW)                    // (position, 16 channels) pairs of a plane
#define LOAD_ROUNDS ((UNITS + 2 * THREADS - 1) / (2 * THREADS))  // of a plane's loads, two units a thread each
#define HELD_ROUNDS (OWN_MAXIMA ? LOAD_ROUNDS : 1)  // load rounds whose values a thread holds at once
#define OCS (NP + 4)                           // a channel's floats in the staged output tile
// The 16-byte chunk c of row r as the swizzle mode stores it (128-byte: XOR with r % 8; 64-byte: with r / 2 % 4).
#define SWIZZLE(c, r) ((c) ^ (ROW == 128 ? ((r) & 7) : (((r) >> 1) & 3)))

// OWN_MAXIMA: |value| where finite, else 0, as the operand pass's block maxima count it (inf and NaN pass through the
// scaled MMAs as they are).
__device__ __forceinline__ float finite_magnitude(float value) {
    const float magnitude = fabsf(value);
    return magnitude <= 3.4028234663852886e38f ? magnitude : 0.f;
}

// Shared-memory matrix descriptor: K-major rows of ROW bytes, ROW-byte swizzle, 8-row groups 8 * ROW bytes apart.
__device__ __forceinline__ unsigned long long row_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(8 * ROW >> 4) << 32)
           | ((ROW == 128 ? 1ull : 2ull) << 62);
}

// d = A (64 x 16, through desc_a) x B (16 x NP, through desc_b), plus d unless accumulate is 0.
__device__ __forceinline__ void wgmma_ss(float* d, unsigned long long desc_a, unsigned long long desc_b,
                                         int accumulate = 1) {
    WGMMA_SS
}
"""

# REGION_FILL's helper: a warp's value over a contiguous run of floats, 16-byte stores between a head and a tail of
# single floats; STREAMED: as evict-first stores (st.global.cs), for values that nobody reads or writes again.
REGION_HELPERS = r"""
template <bool STREAMED, typename T> __device__ __forceinline__ void put(T* p, T value) {
    if (STREAMED) __stcs(p, value);
    else *p = value;
}
template <bool STREAMED> __device__ __forceinline__ void fill_run(float* p, int count, float value, int lane) {
    const int head = min((int)((16 - ((unsigned long long)p & 15)) & 15) >> 2, count);
    const int quads = (count - head) >> 2, tail = (count - head) & 3;
    float4* at = (float4*)(p + head);
    if (lane < head) put<STREAMED>(p + lane, value);
#if SPLIT == 2
    // (Not unrolled in 3xFP16, so that its fill warpgroup's 40 registers hold it: FILL_REGISTERS. One store every few
    // instructions is still far more than the DRAM takes.)
    #pragma unroll 1
#else
    // (By four in FP16: on an H100 problem 77's forward took about 1% less so than as NVRTC unrolls it unasked, the
    // lower median in 17 of 20 rounds and the faster fastest call in all 20: benchmarks/diag_fused_parts.py,
    // eighty-first and eighty-second sessions.)
    #pragma unroll 4
#endif
    for (int i = lane; i < quads; i += 32) put<STREAMED>(at + i, make_float4(value, value, value, value));
    if (lane < tail) put<STREAMED>(p + head + 4 * quads + lane, value);
}
"""

SOURCE = r"""
// The computing warpgroup's barrier: beside a fill warpgroup (FILL_WARPGROUP), which never waits there, barrier 1 of
// its THREADS threads.
__device__ __forceinline__ void compute_sync() {
#if FILL_WARPGROUP
    asm volatile("bar.sync 1, %0;\n" :: "n"(THREADS) : "memory");
#else
    __syncthreads();
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS * (1 + FILL_WARPGROUP), MIN_BLOCKS)
phase_conv_rows(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ w_lo,
                const float* __restrict__ bias, const float* __restrict__ block_max,
                const float* __restrict__ w_inverse, float* __restrict__ y, int XD, int XH, int XW_, int KHF, int KWF,
                int QD, int QH, int QW, int qh_blocks, int qw_blocks, int max_block, int max_blocks, int phase_count,
                long long syn, long long syc, long long syd, long long syh, long long syw, const Phases phases)
{
    // (XW_: the window's width, XW here a macro; qw_blocks, max_block: 1 and the block maxima's columns, unused.
    // INPUT_DIRECT: x is the input (N, C_IN, X_D, X_H, X_W) with strides X_SN, X_SC, X_SD, X_SH and rows contiguous,
    // and window position (a, b, c) is its position (a + START_D, b + START_H, c + START_W).)
    extern __shared__ __align__(1024) float4 smem4[];
    float* weights = (float*)smem4;                          // [KH * KW][COB][ROW / 4 floats], swizzled
    unsigned* plane = (unsigned*)(weights + KH * KW * W_TAP_FLOATS);  // [PLANE_POS][ROW / 4 words], swizzled
    const int tid = threadIdx.x % THREADS, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    // Programs as phase_conv.py's: output-channel blocks fastest, then phases, rows, depth, sample (one column block).
    int tile = blockIdx.x;
    const int ob = tile % (C_OUT / COB); tile /= C_OUT / COB;
    TAKE_PHASE(tile % phase_count);
    tile /= phase_count;
    const int qh0 = (tile % qh_blocks) * ROWS; tile /= qh_blocks;
    const int qd = tile % QD, n = tile / QD;
    const long long first_row = ((long long)n * XD + qd + off_d) * XH + qh0 + off_h;  // of plane 0's row 0
#if !INPUT_DIRECT
    const float* plane0 = x + first_row * XW * C_IN;
#endif
    const float* w_block = w + (long long)ob * COB * 32;
    // A tap's weight rows: (C_OUT, 64 halves) each, 32 hi then 32 lo (window._weight_halves).
    #define W_TAP(tap) ((long long)(((td0 + ((tap) / (KH * KW)) * tds) * KHF + th0 + ((tap) / KW % KH) * ths) * KWF \
                                    + tw0 + ((tap) % KW) * tws) * C_OUT * 32)
    // Depth tap kd's weights: each row's first ROW bytes (FP16: the hi halves). Three taps a loop step: with one,
    // each step's copies waited for the step before to free its address registers (Nsight Compute, seventy-third
    // session); fully unrolled, ptxas spilled.
    auto copy_weights = [&](int kd) {
        #pragma unroll 3
        for (int tap = 0; tap < KH * KW; tap++) {
            const float* src = w_block + W_TAP(kd * KH * KW + tap);
            #pragma unroll
            for (int e = tid; e < COB * CHUNKS; e += THREADS) {
                const int oc = e / CHUNKS, c = e % CHUNKS;
                cp_async16(weights + tap * W_TAP_FLOATS + oc * (ROW / 4) + (SWIZZLE(c, oc) << 2),
                           src + oc * 32 + c * 4);
            }
        }
        cp_commit();
    };
#if REGION_FILL
    // The output around this program's lattice tile, filled with the bias (or zero): planes STRIDE_D qd on to
    // STRIDE_D (qd + 1) (to the last, by the last qd), rows STRIDE_H qh0 on to STRIDE_H (qh0 + ROWS) (to the last, by
    // the last row block), every column, the block's channels; every output element lies in one program's region, and
    // the layer's only phase is this one. Segment s: channel s % COB of the region's plane s / COB, the planes without
    // lattice points first, by evict-first stores, the lattice plane last, by plain ones, so that write_tile's stores
    // may find its sectors in the L2 (on the H200 problem 77's forward took 0.318-0.323 ms so against 0.336-0.342 with
    // plain stores throughout, TF32 off: benchmarks/diag_region_fill.py, seventy-sixth session); the barriers before
    // write_tile order them after every thread's fill.
    // FILL_BESIDE_LOADS: in KD x LOAD_ROUNDS parts, each while a round of the window plane's loads is in flight, so
    // that the next plane's loads do not queue behind a depth tap's whole part; else in KD parts, part kd while the
    // tensor cores run depth tap kd's MMAs. On an H100 (seventy-eighth session) problem 77's forward took 0.348-0.361
    // ms beside the loads (ten rounds of 100 calls) against 0.368-0.375 after the MMAs (five of six; the sixth 0.445)
    // in 3xFP16, reading the window; in FP16, reading the input by 16 scalar loads a unit, it was slower beside the
    // loads in each of six rounds (0.375-0.460 against 0.352-0.390). The FP16 kernel on the window is untimed.
    // FILL_WARPGROUP (fill_warpgroup()): the program is two warpgroups, the second filling the region while the
    // first computes, which then fills nothing; the planes without lattice points at once, the lattice plane once the
    // first warpgroup begins its last depth tap (barrier 3: so that its zeros are still in the L2 when write_tile's
    // stores come), then barrier 2, which the first waits at before write_tile. Two such programs a multiprocessor
    // (FP16: instead of three of one). Problem 77's forward in FP16 (benchmarks/diag_region_fill.py) took
    // 0.2933-0.2944 ms so on an H100 against 0.3384-0.3436 with a fill first and 0.352 with the fill in the computing
    // warps (seventy-ninth session); on the H200 (eightieth session, a noisy machine) 0.240-0.320 mean (0.233-0.235
    // fastest call) against 0.263-0.328 (0.256-0.261) and 0.284-0.409 (0.275-0.284). In 3xFP16 (eightieth session)
    // it took 0.3417-0.3440 ms (median) on an H100 against 0.3494-0.3500 in the computing warps and 0.410-0.415 with a
    // fill first; on the H200 a form with fill_run's loop unrolled and 8 bytes spilled had medians of 0.307-0.330 ms
    // (fastest 0.289-0.314) against 0.326-0.399 (0.298-0.335) in the computing warps. With the lattice plane filled at
    // once (its zeros gone from the L2 when write_tile's stores came) FP16's took 0.302-0.309 against 0.2508-0.2521
    // on the H200.
    #define FILL_BESIDE_LOADS (!INPUT_DIRECT)
    #define FILL_PARTS (FILL_BESIDE_LOADS ? KD * LOAD_ROUNDS : KD)
    float* const out = y - phase[9];
    const long long plane_floats = syd / STRIDE_D, row_floats = syh / STRIDE_H;
    const int row0 = STRIDE_H * qh0, region_rows = (qh0 + ROWS >= QH ? OUT_H : STRIDE_H * (qh0 + ROWS)) - row0;
    const int region_planes = (qd == QD - 1 ? OUT_D : STRIDE_D * (qd + 1)) - STRIDE_D * qd;
    const int segments = COB * region_planes;
    // SECTOR_EDGES: each segment's ends moved to the edges of the 32-byte sectors they cut, so that no sector is
    // written by two programs: a sector that one program writes part of, after the L2 has let go of the other's
    // part, is read back from DRAM. The sector around the boundary p before row `row` of plane d (row OUT_H: before
    // the next plane) goes to the program whose lattice values lie in it, to the earlier segment's where neither's
    // do, and stays cut where both's do and between channels (whose biases differ). The two programs beside a
    // boundary work its edge out alike, so that the segments still cover every output element once. Lattice points
    // here are every column of the lattice's residue in every row of its residue (a superset). Problem 77's output
    // filled in this pattern, and nothing else, took 0.189 ms on an H100 against 0.225 with the ends where they
    // fall (zero_(): 0.176; benchmarks/diag_region_pattern.py, ninety-first session).
    auto sector_edge = [&](float* p, int d, int row) -> float* {
        if (row == OUT_H) { d++; row = 0; }
        const int cut = (int)(((unsigned long long)p & 31) >> 2);  // the sector's floats before p
        if (!SECTOR_EDGES || cut == 0 || d == OUT_D || (d == 0 && row == 0)) return p;
        const int d_before = row == 0 ? d - 1 : d, row_before = row == 0 ? OUT_H - 1 : row - 1;
        // Lattice values in the sector after p (the first 8 - cut columns of the row) and before it (the last cut
        // columns of the row before).
        const bool after = d % STRIDE_D == LATTICE_D && row % STRIDE_H == LATTICE_H && LATTICE_W < 8 - cut;
        const bool before = d_before % STRIDE_D == LATTICE_D && row_before % STRIDE_H == LATTICE_H
                            && LAST_LATTICE_W >= OUT_W - cut;
        // (One offset: with a pointer per case 3xFP16's fill warpgroup spilled 16 bytes in its 40 registers.)
        return p + (after && before ? 0 : after ? -cut : 8 - cut);
    };
    auto fill_segments = [&](int first, int end) {
        for (int s = first + warp; s < end; s += THREADS / 32) {
            const int k = s / COB, c = s % COB;
            const int d = STRIDE_D * qd + (k == region_planes - 1 ? LATTICE_D : k + (k >= LATTICE_D));
            float* const at = out + n * syn + (long long)(ob * COB + c) * syc + d * plane_floats + row0 * row_floats;
            float* const from = sector_edge(at, d, row0);
            const int count = (int)(sector_edge(at + region_rows * OUT_W, d, row0 + region_rows) - from);
            const float value = HAS_BIAS ? bias[ob * COB + c] : 0.f;
            if (k == region_planes - 1) fill_run<false>(from, count, value, lane);
            else fill_run<true>(from, count, value, lane);
        }
    };
    auto fill_part = [&](int part) {  // (the computing warpgroup's: none beside a fill warpgroup)
        if (!FILL_WARPGROUP) fill_segments(segments * part / FILL_PARTS, segments * (part + 1) / FILL_PARTS);
    };
#if FILL_WARPGROUP
    // The fill warpgroup gives up registers to the computing one (FILL_REGISTERS, COMPUTE_REGISTERS): at the 128 a
    // thread that two programs of 256 threads a multiprocessor launch with, ptxas spilled up to 144 bytes.
    if (threadIdx.x >= THREADS) {  // the fill warpgroup
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(FILL_REGISTERS));
        fill_segments(0, segments - COB);  // the planes without lattice points
        asm volatile("bar.sync 3, %0;\n" :: "n"(2 * THREADS) : "memory");  // the last depth tap begun
        fill_segments(segments - COB, segments);  // the lattice plane
        __threadfence_block();
        asm volatile("bar.arrive 2, %0;\n" :: "n"(2 * THREADS) : "memory");
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(COMPUTE_REGISTERS));
#endif
#endif
    // Launched as the operand pass's dependent (cuda.DEPENDENT), the pass's writes (the weight's halves, the block
    // maxima) are visible from here on; launched otherwise, this returns at once. (The fill warpgroup reads none.)
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    copy_weights(0);
    for (int e = HH * XW * (ROW / 4) + tid; e < PLANE_POS * (ROW / 4); e += THREADS) plane[e] = 0u;

    float d[NP / 2];
    float partial[PARTIALS ? NP / 2 : 1];  // (one element without partial sums, so that its code compiles)
    #pragma unroll
    for (int k = 0; k < NP / 2; k++) {
        d[k] = 0.f;
        if (PARTIALS) partial[PARTIALS ? k : 0] = 0.f;
    }
    // As phase_conv.py: FP16 one scale for every plane the program reads, 3xFP16 one per plane (its partial sums
    // times the inverse of the plane they came from).
    float a_scale = 1.f, a_inverse = 1.f, partial_inverse = 0.f;
    auto add_partial = [&]() {
        #pragma unroll
        for (int k = 0; k < NP / 2; k++) d[k] += partial[PARTIALS ? k : 0] * partial_inverse;
    };
    if (SPLIT == 3 && !OWN_MAXIMA) {
        a_scale = pow2_scale(planes_max(block_max, first_row, KD, (long long)DD * XH, HH, 0, max_blocks, max_blocks,
                                        lane), a_inverse);
    }
    const unsigned weights_addr = smem_addr(weights), plane_addr = smem_addr((float*)plane);
#if OWN_MAXIMA
    __shared__ float plane_maxima[THREADS / 32];  // each warp's largest magnitude in the plane
#endif

    #pragma unroll 1
    for (int kd = 0; kd < KD; kd++) {
#if FILL_WARPGROUP
        if (kd == KD - 1)  // the fill warpgroup's turn for the lattice plane
            asm volatile("bar.arrive 3, %0;\n" :: "n"(2 * THREADS) : "memory");
#endif
        if (kd > 0) {
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            compute_sync();  // every MMA reading the previous depth tap's plane and weights is done
            copy_weights(kd);
        }
        if (SPLIT == 2)
            a_scale = pow2_scale(plane_max(block_max, first_row + (long long)kd * DD * XH, HH, 0, max_blocks,
                                           max_blocks, lane), a_inverse);
        // The plane by (position, 16 channels): all loads of HELD_ROUNDS rounds first (one round, or with OWN_MAXIMA
        // every round of the plane), then the splits and stores. Channel c of 16 goes to k = (c & 8) | (c & 3) * 2 |
        // (c >> 2) & 1, as the weight's operand pass orders them: the hi halves in the row's 16-byte chunks 2 c16 and
        // 2 c16 + 1, the lo halves in chunks 4 + 2 c16 and 5 + 2 c16.
#if INPUT_DIRECT
        // Unit u: channels 16 c16 on of plane position p, 16 loads of one channel each, lanes along the input's rows
        // (coalesced); zero outside the input, as the window is.
        const int x_d = qd + off_d + kd * DD + START_D;
        const bool depth_inside = x_d >= 0 && x_d < X_D;
        const float* x_plane = x + (long long)n * X_SN + (long long)x_d * X_SD;
#else
        const float4* src = (const float4*)(plane0 + (long long)kd * DD * XH * XW * C_IN);
#endif
        #pragma unroll
        for (int base = 0; base < UNITS; base += 2 * THREADS * HELD_ROUNDS) {
            float v[HELD_ROUNDS][2][16];
            #pragma unroll
            for (int r = 0; r < HELD_ROUNDS; r++) {
                #pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int u = base + 2 * THREADS * r + h * THREADS + tid;
#if INPUT_DIRECT
                    const int c16 = u / (HH * XW), p = u % (HH * XW);
                    const int x_h = qh0 + off_h + p / XW + START_H, x_w = p % XW + START_W;
                    const bool inside = u < UNITS && depth_inside && x_h >= 0 && x_h < X_H && x_w >= 0 && x_w < X_W;
                    const float* at = x_plane + (long long)(16 * c16) * X_SC + (long long)x_h * X_SH + x_w;
                    #pragma unroll
                    for (int j = 0; j < 16; j++) v[r][h][j] = inside ? at[(long long)j * X_SC] : 0.f;
#else
                    #pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const float4 quad = u < UNITS ? src[u * 4 + q] : make_float4(0.f, 0.f, 0.f, 0.f);
                        v[r][h][4 * q] = quad.x, v[r][h][4 * q + 1] = quad.y;
                        v[r][h][4 * q + 2] = quad.z, v[r][h][4 * q + 3] = quad.w;
                    }
#endif
                }
#if REGION_FILL && FILL_BESIDE_LOADS
                fill_part(kd * LOAD_ROUNDS + base / (2 * THREADS) + r);
#endif
            }
#if OWN_MAXIMA
            // The plane's scale: the power of two that takes its largest finite magnitude (across the warpgroup)
            // into [2^14, 2^15), or the sums' where smaller; where this one is smaller, the sums are scaled to it
            // by their ratio, a power of two (exact while a sum stays in float32's normal range, which it leaves only
            // where the planes lie so far apart that the pass's one scale for every plane would have rounded the
            // smaller one's values away too).
            float amax = 0.f;
            #pragma unroll
            for (int r = 0; r < HELD_ROUNDS; r++)
                #pragma unroll
                for (int h = 0; h < 2; h++)
                    #pragma unroll
                    for (int j = 0; j < 16; j++) amax = fmaxf(amax, finite_magnitude(v[r][h][j]));
            for (int offset = 16; offset > 0; offset >>= 1)
                amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
            if (lane == 0) plane_maxima[warp] = amax;
            compute_sync();  // (the last reads of plane_maxima were before the previous depth tap's MMAs)
            #pragma unroll
            for (int w = 0; w < THREADS / 32; w++) amax = fmaxf(amax, plane_maxima[w]);
            float inverse;
            const float scale = pow2_scale(amax, inverse);
            if (kd == 0 || scale < a_scale) {
                const float ratio = scale * a_inverse;
                #pragma unroll
                for (int k = 0; k < NP / 2; k++) d[k] *= ratio;  // (zeros at kd 0)
                a_scale = scale;
                a_inverse = inverse;
            }
#endif
            #pragma unroll
            for (int r = 0; r < HELD_ROUNDS; r++) {
                #pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int u = base + 2 * THREADS * r + h * THREADS + tid;
                    if (u >= UNITS) continue;
#if INPUT_DIRECT
                    const int c16 = u / (HH * XW), p = u % (HH * XW);
#else
                    const int p = u / 2, c16 = u % 2;
#endif
                    const float* f = v[r][h];
                    unsigned hi[8], lo[8];
                    #pragma unroll
                    for (int e = 0; e < 4; e++) {
                        if (SPLIT == 2) {
                            split_half2(f[e], f[e + 4], a_scale, hi[e], lo[e]);
                            split_half2(f[e + 8], f[e + 12], a_scale, hi[e + 4], lo[e + 4]);
                        } else {
                            hi[e] = to_half2(f[e], f[e + 4], a_scale);
                            hi[e + 4] = to_half2(f[e + 8], f[e + 12], a_scale);
                        }
                    }
                    uint4* row = (uint4*)(plane + p * (ROW / 4));
                    row[SWIZZLE(2 * c16, p)] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
                    row[SWIZZLE(2 * c16 + 1, p)] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
                    if (SPLIT == 2) {
                        row[SWIZZLE(4 + 2 * c16, p)] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
                        row[SWIZZLE(5 + 2 * c16, p)] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
                    }
                }
            }
        }
        cp_wait<0>();  // this depth tap's weights
        // The plane's stores and the copies visible to the tensor cores.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        compute_sync();
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        #pragma unroll
        for (int tap = 0; tap < KH * KW; tap++) {
            const int kh = tap / KW, kw = tap % KW;
            const unsigned a_at = weights_addr + 4 * tap * W_TAP_FLOATS;
            const unsigned b_at = plane_addr + (off_w + kh * DH * XW + kw * DW) * ROW;
            #pragma unroll
            for (int ks = 0; ks < 2; ks++) {  // 16 channels a k-step: hi halves 32 bytes on, lo 64 further
                const int step = tap * 2 + ks;  // (counted from the depth tap's first: one plane, one scale)
                if (PARTIALS && step % PROMOTE == 0) {  // the partial into the sums, once its MMAs are done
                    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                    add_partial();
                    partial_inverse = a_inverse;
                    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
                }
                const unsigned long long a_hi = row_desc(a_at + 32 * ks), b_hi = row_desc(b_at + 32 * ks);
                if (!PARTIALS) {
                    wgmma_ss(d, a_hi, b_hi);
                } else {
                    const unsigned long long a_lo = row_desc(a_at + 64 + 32 * ks);
                    const unsigned long long b_lo = row_desc(b_at + 64 + 32 * ks);
                    wgmma_ss(partial, a_hi, b_hi, step % PROMOTE != 0);  // from zero after a promotion
                    wgmma_ss(partial, a_lo, b_hi);
                    wgmma_ss(partial, a_hi, b_lo);
                }
            }
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#if REGION_FILL && !FILL_BESIDE_LOADS
        fill_part(kd);
#endif
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    if (PARTIALS) add_partial();  // the last partial
    compute_sync();  // shared memory free: the tile goes there

    // d[4 j + e]: output channel 16 warp + g + 8 (e / 2) of the block, position 8 j + 2 t + e % 2. Staged as
    // [channel][position], the bias added and the sums scaled back (FP16's two inverses multiplied apart: their
    // product can leave float32's range where the result does not).
    float* staged = (float*)smem4;
    #pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int o = 16 * warp + g + 8 * hf;
        const float b = HAS_BIAS ? bias[ob * COB + o] : 0.f;
        const float s = w_inverse[ob * COB + o];
        const float a_unit = SPLIT == 3 ? a_inverse : 1.f;
        #pragma unroll
        for (int j = 0; j < NP / 8; j++) {
            staged[o * OCS + 8 * j + 2 * t] = d[4 * j + 2 * hf] * s * a_unit + b;
            staged[o * OCS + 8 * j + 2 * t + 1] = d[4 * j + 2 * hf + 1] * s * a_unit + b;
        }
    }
#if FILL_WARPGROUP
    asm volatile("bar.sync 2, %0;\n" :: "n"(2 * THREADS) : "memory");  // and the fill warpgroup's stores done
#else
    __syncthreads();
#endif
    float* y_tile = y + n * syn + (long long)(ob * COB) * syc + qd * syd + (long long)lane * syw;
    write_tile<ROWS, COB, THREADS>(staged, OCS, XW, y_tile, syc, syh, qh0, QH, lane < QW, warp, lane);
}
"""


def own_maxima(split: int, taps, dilation, window_columns: int) -> bool:
    """Whether the kernel finds its planes' scales itself (OWN_MAXIMA): FP16, PLANE_MAXIMA, a plane's loads in
    MAX_HELD_ROUNDS rounds or fewer and N up to 136, so that the held loads (32 floats a round) fit beside the sums (N
    / 2 floats): compiled here for sm_90a, at N = 256 ptxas spilled 12 bytes on a 3 x 3 x 3 correlation."""
    (_, kh, _), (_, dh, _) = taps, dilation
    units = 2 * (ROWS + (kh - 1) * dh) * window_columns
    return (PLANE_MAXIMA and split == 3 and -(-units // (2 * THREADS)) <= MAX_HELD_ROUNDS
            and positions(window_columns) <= MAX_POSITIONS[2])


def positions(window_columns: int) -> int:
    """The MMA's N for a window XW positions wide: ROWS rows, to a multiple of 8."""
    return -(-ROWS * window_columns // 8) * 8


def wgmma_ss_asm(n: int) -> str:
    """The inline PTX of wgmma m64n{n}k16 FP16 -> float32, both operands K-major in shared memory, into d."""
    regs = n // 2
    acc = ", ".join(f"%{k}" for k in range(regs))
    outs = ", ".join(f'"+f"(d[{k}])' for k in range(regs))
    # scale-d is a predicate operand (true: d += A B; false: d = A B), set from a register (accumulate).
    return (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n'
            f'wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16 {{{acc}}}, %{regs}, %{regs + 1}, p, 1, 1, 0, 0;'
            f'\\n}}\\n" : {outs} : "l"(desc_a), "l"(desc_b), "r"(accumulate));')


def plane_positions(taps, dilation, window_columns: int) -> int:
    """The rows of a window plane in shared memory (PLANE_POS)."""
    (_, kh, _), (_, dh, _) = taps, dilation
    return -(-(positions(window_columns) + (kh - 1) * dh * window_columns + window_columns - 32) // 8) * 8


def shared_bytes(taps, dilation, window_columns: int, split: int) -> int:
    """Dynamic shared memory of one program: a depth tap's weights and the window plane, or the staged tile."""
    (_, kh, kw), _ = taps, dilation
    row = 128 if split == 2 else 64
    return max(kh * kw * 64 * row + plane_positions(taps, dilation, window_columns) * row,
               4 * 64 * (positions(window_columns) + 4))


# With a fill warpgroup (FILL_WARPGROUP) two programs of 2 x THREADS threads a multiprocessor are launched with
# 65536 / (4 THREADS) = 128 registers a thread; the fill warpgroup keeps FILL_REGISTERS (per precision, split) and
# gives the rest to the computing warpgroup (setmaxnreg), which in 3xFP16 needs about 243 without a limit. Compiled
# here for sm_90a, neither spills on any correlation the kernel serves (tests/test_cuda_compile.py); in 3xFP16 only
# with fill_run's loop not unrolled (unrolled, the fill warpgroup spilled up to 100 bytes at 40; not unrolled, 16 on
# problem 77's at 32). In FP16, 40 / 216 with the loop not unrolled took 0.2957-0.2962 ms (median) on an H100
# against 0.2941-0.2944 at 56 / 200 unrolled (benchmarks/diag_region_fill.py, eightieth session).
FILL_REGISTERS = {3: 56, 2: 40}
COMPUTE_REGISTERS = {split: 2 * (65536 // (4 * THREADS)) - registers for split, registers in FILL_REGISTERS.items()}


def fill_warpgroup(split: int, window_columns: int, region, input_geometry=None) -> bool:
    """Whether a program that fills its region (REGION_FILL: region given) has a second warpgroup to do it
    (FILL_WARPGROUP): up to N = 136 (3xFP16's MAX_POSITIONS), in which the computing warpgroup's COMPUTE_REGISTERS
    registers a thread hold it without spills; in 3xFP16 reading the window only (reading the input itself, which the
    library does in FP16 only, cuda.reads_input, it spilled 156 bytes on problem 77)."""
    return (region is not None and positions(window_columns) <= MAX_POSITIONS[2]
            and (split == 3 or input_geometry is None))


def block_threads(split: int, window_columns: int, region=None, input_geometry=None) -> int:
    """A program's threads: one warpgroup, or two with a fill warpgroup."""
    return THREADS * (2 if fill_warpgroup(split, window_columns, region, input_geometry) else 1)


def programs_per_multiprocessor(split: int, window_columns: int, region=None, input_geometry=None) -> int:
    """The programs a multiprocessor holds (as __launch_bounds__ tells ptxas): FP16 three up to N = 136 (its N / 2 sums
    within 170 registers a thread), else two; two with a fill warpgroup. On the H200 (sixty-fourth session) problem
    77's FP16 correlation took 0.096 ms with three, 0.104 with two."""
    if fill_warpgroup(split, window_columns, region, input_geometry):
        return 2
    return 3 if split == 3 and positions(window_columns) <= 136 else 2


def source(c_out: int, taps, dilation, window_columns: int, has_bias: bool, split: int,
           input_geometry=None, region=None) -> str:
    """The kernel's source for one configuration: 32 input channels, c_out a multiple of 64, split 2 (3xFP16) or 3
    (FP16), a window window_columns (XW) wide, read from the window or, given input_geometry (the input's spatial
    sizes, the window's start in it, its strides N, C, D, H in elements: its rows contiguous), from the input itself;
    sizes as macros, so that every loop unrolls and the input's offsets fold into its loads (INPUT_DIRECT above).
    region (REGION_FILL), where given: ((D, H, W) of an output whose planes and rows are contiguous, the lattice's
    steps (D, H, W) and its first position), for a launch of the layer's only phase that fills the output itself;
    the kernel then runs in blocks of block_threads()."""
    (kd, kh, kw), (dd, dh, dw) = taps, dilation
    input_defines = input_macros(input_geometry) if input_geometry is not None else {}
    region_defines = region_macros(region, split) if region is not None else {}
    defines = dict(C_IN=32, C_OUT=c_out, KD=kd, KH=kh, KW=kw, DD=dd, DH=dh, DW=dw, XW=window_columns, ROWS=ROWS,
                   HAS_BIAS=int(has_bias), SPLIT=int(split), INPUT_DIRECT=int(input_geometry is not None),
                   **input_defines, REGION_FILL=int(region is not None), **region_defines,
                   FILL_WARPGROUP=int(fill_warpgroup(split, window_columns, region, input_geometry)),
                   OWN_MAXIMA=int(own_maxima(split, taps, dilation, window_columns)),
                   FILL_REGISTERS=FILL_REGISTERS[split], COMPUTE_REGISTERS=COMPUTE_REGISTERS[split], PROMOTE=PROMOTE,
                   THREADS=THREADS,
                   MIN_BLOCKS=programs_per_multiprocessor(split, window_columns, region, input_geometry),
                   MAX_PHASES=MAX_PHASES, PHASE_FIELDS=PHASE_FIELDS)
    head = "".join(f"#define {name} {value}\n" for name, value in defines.items())
    return (head + COPY_HELPERS + FP16_HELPERS + TILE_HELPERS + PHASE_HELPERS + REGION_HELPERS
            + mma_helpers(window_columns) + SOURCE)


def region_macros(region, split: int) -> dict:
    """REGION_FILL's macros: the output's sizes, the lattice's steps, its first plane and its rows' and columns'
    residues, and whether the segments' ends move to sectors' edges (SECTOR_EDGES: FP16, where rows are 16 floats or
    more, so that a sector holds parts of two rows at most and each segment keeps some floats)."""
    (out_d, out_h, out_w), (stride_d, stride_h, stride_w), (lattice_d, lattice_h, lattice_w) = region
    last_column = lattice_w % stride_w + (out_w - 1 - lattice_w % stride_w) // stride_w * stride_w
    return dict(OUT_D=out_d, OUT_H=out_h, OUT_W=out_w, STRIDE_D=stride_d, STRIDE_H=stride_h, STRIDE_W=stride_w,
                LATTICE_D=lattice_d, LATTICE_H=lattice_h % stride_h, LATTICE_W=lattice_w % stride_w,
                LAST_LATTICE_W=last_column, SECTOR_EDGES=int(SECTOR_EDGES and split == 3 and out_w >= 16))


def input_macros(input_geometry) -> dict:
    """The macros of an input read by the kernel itself (INPUT_DIRECT): its spatial sizes, the window's start in it
    and its strides N, C, D, H."""
    sizes, start, strides = input_geometry
    names = ("X_D", "X_H", "X_W", "START_D", "START_H", "START_W", "X_SN", "X_SC", "X_SD", "X_SH")
    return {name: f"({value})" for name, value in zip(names, (*sizes, *start, *strides))}


def mma_helpers(window_columns: int) -> str:
    """MMA_HELPERS with the MMA of a window window_columns wide."""
    return MMA_HELPERS.replace("WGMMA_SS", wgmma_ss_asm(positions(window_columns)))
