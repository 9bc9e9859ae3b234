"""CUDA C++ source of a phase's weight gradient on Hopper's tensor cores (wgmma, TF32), compiled at run time by NVRTC.

Within a phase the forward is the correlation y[n, o, q] = sum over taps k and channels i of x[n, i, start + q + k *
dil] * w[tap(k), o, i] (phase_conv.py), so the phase's slice of grad_weight is one GEMM,

    grad[i, o, k] = sum over n and q of x[n, i, start + q + k * dil] * g[n, o, q],

with g grad_output's lattice of the phase. Rows of the GEMM are (tap k, channel i), columns the COB output channels
of a block, and the reduction runs over every position q of the phase's grid: 864 x 64 x 262144 for problem 77.
Both operands are read in place: x from the input (any strides, zero outside it) and g from grad_output (the
lattice's strides), TF32-rounded to nearest as they are staged in shared memory. No copy of either is made.

A program is two warpgroups (256 threads); each owns up to MT tiles of 64 rows, accumulated in registers, and the
program walks its share of the reduction one grid row (n, qd, qh, 32 columns) at a time. Per row it stages g's
row (COB x 32, K-major, 128-byte swizzled: wgmma's B operand through a descriptor, as phase_conv.py's weight) and
one new row of x per depth tap it needs (C_IN channels x the HW columns of the taps' reach, in a ring of R rows per
depth tap, so that the KH taps of a row reuse what earlier rows loaded). The A fragments come from the ring by
32-bit loads at each tap's offset: odd offsets (a tap dilation of 1) rule out wider loads and descriptors, and a
row pitch P = 4 x odd (mod 32) makes the fragment loads free of bank conflicts. Copies run AHEAD rows ahead by
cp.async (x in 16-byte chunks: the input's rows must be contiguous and 16-byte aligned; g 4 bytes at a time, its
lattice's columns being strided), spread over a row's k-steps, each element rounded in place once arrived.

On the H200, problem 77: 0.25 ms against 0.33 for the Triton path (its operand copies, 0.225 ms for its kernel).
Per row a thread runs about 380 instructions at 2 warps per scheduler (one program per multiprocessor: 239
registers a thread), and shared memory moves about 1,450 wavefronts a row against the MMAs' 1,024 cycles: those
two bound it now (Nsight Compute: tensor pipe 30% busy; benchmarks/RESULTS.md, thirteenth session).

A program's reduction share is a contiguous run of grid rows; its partial sums go to partial[split] in the phase's
slice layout (C_in, C_out, taps ascending: the phase stores taps descending, so index T - 1 - k per axis), summed
over splits afterwards in a fixed order: deterministic.
"""

from .phase_conv import WGMMA_HELPERS, wgmma_asm

SOURCE = r"""
#define THREADS 256
#define BW 32
#define HW (BW + (KW - 1) * DW)                // x columns a 32-column row reads
#define CHUNKS ((HW + 3 + 3) / 4)              // 16-byte chunks that cover them from a 16-byte boundary
#define SPAN ((KH - 1) * DH + 1)               // x rows one grid row reads per depth tap
#define ROWF (C_IN * P)                        // one x row in the ring: C_IN channels of P floats
#define PLANEF (R * ROWF)                      // one depth tap's ring
#define TAPS (KD * KH * KW)
#define TILES ((TAPS * C_IN + 63) / 64)
#define G_STAGE (COB * 32)                     // floats of one staged g row
#define G_STAGES (AHEAD + 2)                   // rows i - 1 .. i + AHEAD in use at row i
#define X_CHUNKS (NPL * C_IN * CHUNKS)         // x chunks of one ring row (every depth tap's)
#define X_PER_THREAD ((X_CHUNKS + THREADS - 1) / THREADS)
#define G_PER_THREAD (COB / 8)                 // g elements of one row per thread

// 16 (x) or 4 (g) bytes from global to shared memory, asynchronously, the first `bytes` of them read and the rest
// zero-filled (nothing is read where bytes is 0).
__device__ __forceinline__ void cp_async16(float* dst, const float* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool inside) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(inside ? 4 : 0));
}

__device__ __forceinline__ float round_tf32(float v) {  // to nearest, ties away from zero (cvt.rna.tf32.f32)
    return __uint_as_float((__float_as_uint(v) + 0x1000u) & 0xFFFFE000u);
}
__device__ __forceinline__ void round_tf32_in_place(float4* at) {
    float4 v = *at;
    *at = make_float4(round_tf32(v.x), round_tf32(v.y), round_tf32(v.z), round_tf32(v.w));
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
phase_grad_weight(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ partial,
                  int XD, int XH, int XW, int start_d, int start_h, int start_w, int QD, int QH, int QW,
                  int qw_blocks, int tiles_per_program, int splits, int sxc, int sxd, int sxh,
                  int sgc, int sgd, int sgh, int sgw, long long rows_total, long long sxn, long long sgn)
{
    extern __shared__ __align__(1024) float4 smem4[];
    float* g_ring = (float*)smem4;                  // [G_STAGES][COB][32], swizzled
    float* x_ring = g_ring + G_STAGES * G_STAGE;    // [NPL][R][C_IN][P]
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, gr = lane >> 2, t = lane & 3;
    // Programs: output-channel blocks fastest, then tile groups (together they share the same rows in L2), splits.
    int program = blockIdx.x;
    const int cb = program % (C_OUT / COB); program /= C_OUT / COB;
    const int groups = (TILES + tiles_per_program - 1) / tiles_per_program;
    const int tile_group = program % groups, split = program / groups;
    const int first_tile = tile_group * tiles_per_program;
    const int end_tile = min(first_tile + tiles_per_program, TILES);
    const int kd_first = first_tile * 64 / C_IN / (KH * KW);  // the program's first depth tap: ring 0
    // x is copied in 16-byte chunks from the one that holds the first column a row reads (w = start_w + qw0, qw0 a
    // multiple of 32), so that column lies `shift` floats into its ring row.
    const int shift = start_w & 3;

    // Per tile of this warpgroup: the fragment's offset in the rings (depth tap's ring, channel, column) and its
    // row tap's kh * DH. Rows past the program's last tap (tiles past its last, the last tile's padding) read that
    // tap, in the program's rings, and are not stored.
    const int last_tap = min((end_tile * 64 - 1) / C_IN, TAPS - 1);
    int a_offset[MT], kh_rows[MT];
    #pragma unroll
    for (int m = 0; m < MT; m++) {
        const int row = (first_tile + wg * MT + m) * 64 + 16 * warp;
        const int tap = min(row / C_IN, last_tap), ci = row % C_IN + gr;
        a_offset[m] = (tap / (KH * KW) - kd_first) * PLANEF + ci * P + shift + (tap % KW) * DW + t;
        kh_rows[m] = (tap / KW % KH) * DH;
    }
    float d[MT][COB / 2];
    #pragma unroll
    for (int m = 0; m < MT; m++)
        #pragma unroll
        for (int k = 0; k < COB / 2; k++) d[m][k] = 0.f;
    unsigned a[2][MT][4];

    // The copies. x: ring row chunks, flat over the threads (thread tid takes chunks tid, tid + THREADS, ...: (depth
    // tap's ring, channel, chunk), their places and sources computed once), read whole where inside the input, zero
    // outside, the partial chunk at the right edge zero-filled past it. g: warp v takes output channels v, v + 8,
    // ..., its lanes the 32 columns, 4 bytes each (the lattice's columns are not contiguous). Offsets inside a sample
    // are 32-bit (the launcher checks). Once arrived, each thread rounds what it copied, in place. Part `part` (of 4)
    // of each, so that the copies and roundings of a row spread over its four k-steps' MMAs. Threads past the last x
    // chunk copy and round the last chunk again (a branch would make the compiler serialize the MMAs): the same
    // bytes, and rounding twice rounds once, in whatever order the two threads' copies land and roundings run, each
    // after its own copy.
    const int warp8 = tid >> 5;
    float* const g_lane = g_ring + warp8 * 32 + ((((lane >> 2) ^ warp8) & 7) << 2) + (lane & 3);  // (oc & 7 == warp8)
    int x_place[X_PER_THREAD], x_source[X_PER_THREAD], x_bytes[X_PER_THREAD];  // (x_bytes: per segment)
    #pragma unroll
    for (int j = 0; j < X_PER_THREAD; j++) {  // chunk (depth tap's ring, channel, chunk): its place and source
        const int e = min(tid + j * THREADS, X_CHUNKS - 1), chunk = e % CHUNKS;
        const int plane = e / CHUNKS / C_IN, ci = e / CHUNKS % C_IN;
        x_place[j] = plane * PLANEF + ci * P + 4 * chunk;
        x_source[j] = ci * sxc + plane * DD * sxd + 4 * chunk;
    }
    #define COPY_X(hx, part, enabled)                                                                               \
        {                                                                                                           \
            const int xh = start_h + (hx);                                                                          \
            const bool row_inside = (enabled) && xh >= 0 && xh < XH;                                                \
            const float* const x_row = x_segment + xh * sxh;                                                        \
            _Pragma("unroll") for (int j = 0; j < X_PER_THREAD; j++)                                                \
                if (j % 4 == (part))                                                                                \
                    cp_async16(x_ring + ((hx) & (R - 1)) * ROWF + x_place[j],                                        \
                               row_inside && x_bytes[j] ? x_row + x_source[j] : x, row_inside ? x_bytes[j] : 0);     \
        }
    #define ROUND_X(hx, part)                                                                                       \
        _Pragma("unroll") for (int j = 0; j < X_PER_THREAD; j++)                                                    \
            if (j % 4 == (part)) round_tf32_in_place((float4*)(x_ring + ((hx) & (R - 1)) * ROWF + x_place[j]));
    #define COPY_G(qh, stage, part, enabled)                                                                        \
        _Pragma("unroll") for (int k = 0; k < G_PER_THREAD; k++)                                                    \
            if (k % 4 == (part))                                                                                    \
                cp_async4(g_lane + (stage) * G_STAGE + 8 * k * 32, g_inside && (enabled)                            \
                          ? g_n + (g_first + 8 * k * sgc + (qh) * sgh) : g_n, g_inside && (enabled));
    #define ROUND_G(stage, part)                                                                                    \
        _Pragma("unroll") for (int k = 0; k < G_PER_THREAD; k++)                                                    \
            if (k % 4 == (part)) {                                                                                  \
                float* const at = g_lane + (stage) * G_STAGE + 8 * k * 32;                                          \
                *at = round_tf32(*at);                                                                              \
            }
    #define ALL_PARTS(step) step(0) step(1) step(2) step(3)
    // (The macros' own names, xh, row_inside, x_row, j, k and at, must not appear in their arguments.)

    const long long first_row = rows_total * split / splits, end_row = rows_total * (split + 1) / splits;
    for (long long row = first_row; row < end_row;) {
        // A segment: rows h0 .. h1 - 1 of one (n, qd, column block), and its bases: the sample's and this thread's
        // g offset in it.
        long long plane_index = row / QH;
        const int h0 = (int)(row % QH), h1 = (int)min((long long)QH, h0 + (end_row - row));
        const int qw0 = (int)(plane_index % qw_blocks) * BW;
        plane_index /= qw_blocks;
        const int qd = (int)(plane_index % QD);
        const long long n = plane_index / QD;
        const float* g_n = g + n * sgn;
        const int d_first = start_d + qd + kd_first * DD, w_first = start_w + qw0;
        // x chunk j's first column lies at w_first - shift + 4 chunk: the bytes of it inside the input.
        const float* const x_segment = x + n * sxn + (long long)d_first * sxd + (w_first - shift);
        #pragma unroll
        for (int j = 0; j < X_PER_THREAD; j++) {
            const int e = min(tid + j * THREADS, X_CHUNKS - 1), xd = d_first + e / CHUNKS / C_IN * DD;
            const int xw = w_first - shift + 4 * (e % CHUNKS);
            x_bytes[j] = xd >= 0 && xd < XD && xw >= 0 && xw < XW ? 4 * min(4, XW - xw) : 0;
        }
        const int g_first = (cb * COB + warp8) * sgc + qd * sgd + (qw0 + lane) * sgw;
        const bool g_inside = qw0 + lane < QW;

        // Once everything before is done with shared memory (the MMAs, and the zero-filling copies past the last
        // segment's end): the first row's SPAN x rows and its g row (copy group 0), and the new rows of the next
        // AHEAD - 1 grid rows (one group each, empty past the segment), all in flight at once; group 0 rounded once
        // arrived.
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        cp_wait<0>();
        __syncthreads();
        for (int hx = h0; hx < h0 + SPAN; hx++) {
            #define STEP(part) COPY_X(hx, part, true)
            ALL_PARTS(STEP)
            #undef STEP
        }
        #define STEP(part) COPY_G(h0, 0, part, true)
        ALL_PARTS(STEP)
        #undef STEP
        cp_commit();
        for (int ahead = 1; ahead < AHEAD; ahead++) {
            if (h0 + ahead < h1) {
                #define STEP(part) COPY_X(h0 + SPAN - 1 + ahead, part, true) COPY_G(h0 + ahead, ahead, part, true)
                ALL_PARTS(STEP)
                #undef STEP
            }
            cp_commit();
        }
        cp_wait<AHEAD - 1>();
        for (int hx = h0; hx < h0 + SPAN; hx++) {
            #define STEP(part) ROUND_X(hx, part)
            ALL_PARTS(STEP)
            #undef STEP
        }
        #define STEP(part) ROUND_G(0, part)
        ALL_PARTS(STEP)
        #undef STEP
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // stores visible to the tensor cores
        __syncthreads();

        for (int qh = h0; qh < h1; qh++) {
            const int i = qh - h0;
            // Row qh + 1's copies (committed AHEAD - 1 rows ago) have arrived once at most the AHEAD - 2 groups
            // after them are in flight.
            cp_wait<AHEAD - 2>();
            const unsigned stage = smem_addr(g_ring + (i % G_STAGES) * G_STAGE);
            #pragma unroll
            for (int ks = 0; ks < BW / 8; ks++) {
                // A fragments double-buffered: buffer ks & 1 was read by the group before last, done once at most
                // one group (the previous k-step's) is in flight.
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                // While that group runs: a quarter of row qh + AHEAD's copies and of row qh + 1's rounding. Row
                // qh + AHEAD's new x row takes ring row qh - 1's, whose loads every thread finished before the last
                // barrier (the rows in use span qh .. qh + SPAN + AHEAD - 2, R >= SPAN + AHEAD); its g stage (i +
                // AHEAD) % (AHEAD + 2) is row i - 2's, whose MMAs are done. Without branches (a branch here makes
                // the compiler serialize the MMAs): past the segment's end the copies write zeros and the rounding
                // rounds what is there, in places no row of the segment reads.
                COPY_X(qh + SPAN - 1 + AHEAD, ks, qh + AHEAD < h1)
                COPY_G(qh + AHEAD, (i + AHEAD) % G_STAGES, ks, qh + AHEAD < h1)
                ROUND_X(qh + SPAN, ks)
                ROUND_G((i + 1) % G_STAGES, ks)
                #pragma unroll
                for (int m = 0; m < MT; m++) {
                    const float* at = x_ring + a_offset[m] + ((qh + kh_rows[m]) & (R - 1)) * ROWF + 8 * ks;
                    a[ks & 1][m][0] = __float_as_uint(at[0]);
                    a[ks & 1][m][1] = __float_as_uint(at[8 * P]);
                    a[ks & 1][m][2] = __float_as_uint(at[4]);
                    a[ks & 1][m][3] = __float_as_uint(at[8 * P + 4]);
                }
                asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
                const unsigned long long desc = b_desc(stage + 4 * 8 * ks);
                // Every tile, also those past the program's last (they read the last tap and are not stored): a
                // condition around wgmma makes the compiler serialize them.
                #pragma unroll
                for (int m = 0; m < MT; m++) wgmma(d[m], a[ks & 1][m], desc);
                asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            }
            cp_commit();
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the roundings visible to the tensor cores
            __syncthreads();
        }
        row += h1 - h0;
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");

    // Accumulator element (row 16 * warp + gr (+ 8), column 8 j + 2 t (+ 1)) of each tile.
    #pragma unroll
    for (int m = 0; m < MT; m++) {
        const int tile = first_tile + wg * MT + m;
        if (tile >= end_tile) continue;  // (a warpgroup-uniform condition: no MMA follows)
        #pragma unroll
        for (int half = 0; half < 2; half++) {
            const int r = tile * 64 + 16 * warp + gr + 8 * half, tap = r / C_IN, ci = r % C_IN;
            if (tap >= TAPS) continue;
            const int ascending = ((KD - 1 - tap / (KH * KW)) * KH + KH - 1 - tap / KW % KH) * KW + KW - 1 - tap % KW;
            float* out = partial + (((long long)split * C_IN + ci) * C_OUT + cb * COB + 2 * t) * TAPS + ascending;
            #pragma unroll
            for (int j = 0; j < COB / 8; j++) {
                out[(8 * j) * TAPS] = d[m][4 * j + 2 * half];
                out[(8 * j + 1) * TAPS] = d[m][4 * j + 2 * half + 1];
            }
        }
    }
}
"""

THREADS = 256
MAX_TILES_PER_WARPGROUP = 4  # MT: 4 tiles of 64 x 64 are 128 accumulator registers a thread
AHEAD = 4  # grid rows whose copies are in flight while a row's MMAs run


def ring_rows(kh: int, dh: int) -> int:
    """R: the x rows a ring holds, those of a grid row and of the AHEAD rows after it, rounded up to a power of two
    (the ring index is then a mask)."""
    return 1 << ((kh - 1) * dh + AHEAD).bit_length()


def row_pitch(c_in: int, kw: int, dw: int) -> int:
    """P: the floats of one channel's x row in the ring: at least the 16-byte chunks that cover the HW columns a grid
    row reads from a 16-byte boundary, and 4 times an odd number (mod 32), so that the 8 x 4 A-fragment loads of a
    warp (8 channels, 4 columns) hit 32 different banks."""
    columns = 4 * ((32 + (kw - 1) * dw + 3 + 3) // 4)
    return next(p for p in range(columns, columns + 32) if p % 8 == 4)


def shared_bytes(c_in: int, cob: int, taps, dilation, planes: int) -> int:
    (_, kh, kw), (_, dh, dw) = taps, dilation
    return 4 * ((AHEAD + 2) * cob * 32 + planes * ring_rows(kh, dh) * c_in * row_pitch(c_in, kw, dw))


def source(c_in: int, c_out: int, cob: int, taps, dilation, tiles_per_program: int, planes: int) -> str:
    """The kernel's source for one configuration: sizes as macros, so that every loop unrolls. Each warpgroup
    takes half the program's tiles (rounded up)."""
    (kd, kh, kw), (dd, dh, dw) = taps, dilation
    defines = dict(C_IN=c_in, C_OUT=c_out, COB=cob, KD=kd, KH=kh, KW=kw, DD=dd, DH=dh, DW=dw, NPL=planes,
                   MT=-(-tiles_per_program // 2), AHEAD=AHEAD, R=ring_rows(kh, dh), P=row_pitch(c_in, kw, dw))
    head = "".join(f"#define {name} {value}\n" for name, value in defines.items())
    return head + (WGMMA_HELPERS + SOURCE).replace("WGMMA_ASM", wgmma_asm(cob))
