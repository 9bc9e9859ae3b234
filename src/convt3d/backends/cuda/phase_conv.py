"""CUDA C++ source of the phase correlation on Hopper's tensor cores (wgmma, TF32 or FP16), compiled at run time by
NVRTC.

A phase of conv_transpose3d is a stride-1 correlation on its compact grid (plan.py), and so is each phase's part of
grad_input. This kernel computes

    y[n, o, q] = bias[o] + sum over taps k and channels i of window[n, q + offset + k * dil, i] * w[tap(k), o, i]

with q = (qd, qh, qw) over the grid (QD, QH, QW), k = (kd, kh, kw) < (KD, KH, KW), the window channels-last,
zero-padded so that every tile's reads lie inside it (backends/triton/window.py makes it), and the weight as
(kernel taps, C_OUT, C_IN); tap(k) = ((td0 + kd*tds) * KHF + th0 + kh*ths) * KWF + tw0 +
kw*tws picks the phase's taps among the kernel's KDF x KHF x KWF. y is written through any 64-bit strides: the
output's lattice of the phase, so that no copy follows. One launch computes up to MAX_PHASES phases of the same grid,
tap counts and dilation (a k4 s2 p1 layer's eight, a k2 s2 layer's eight), each with its own offsets, taps and
lattice, passed by value: one launch's host time instead of eight.

Four precisions. In TF32 mode (cuda.TF32_SPLIT):
- FP16 (SPLIT 3, the default): 3xFP16's operands and scales (below), the hi parts alone: one MMA (m64nNk16) per
  k-step of 16 channels, at twice TF32's rate. Scaled by powers of two, a float32 value rounds to FP16 as it rounds
  to TF32 (11 significant bits, to nearest; ties to even where the TF32 conversion rounds them away from zero)
  wherever it lies within 2^29 of the largest magnitude in its scale's range: the weight's output channel, and here
  every window plane a program reads, so that one scale serves all its k-steps and the MMAs add into the sums
  directly, as TF32's do. Smaller values lose bits (FP16's subnormals), and those below 2^-40 of that largest
  become zero.
- TF32 (SPLIT 0, CONVT3D_TF32_AS_FP16=0): window and weight TF32-rounded beforehand, one MMA (m64nNk8) per k-step
  of 8 channels.
For float32 with TF32 off, two splits that leave out only a_lo b_lo (about 2^-22 of a product):
- 3xTF32 (SPLIT 1): the window as it is and the weight as two TF32 parts, hi + lo (hi = tf32(w), lo = tf32(w - hi));
  each A fragment is split the same way in registers, and three MMAs add a_hi b_hi + a_hi b_lo + a_lo b_hi.
- 3xFP16 (SPLIT 2, the default, cuda.SPLIT): the same three products of FP16 parts, hi = f16(v s) and lo = f16(v s -
  hi), on 16 channels per k-step (m64nNk16, which takes as long as m64nNk8 in TF32): half the MMAs of 3xTF32. FP16
  keeps TF32's 11 significant bits but spans only 2^-24 to 65504, so each operand is scaled by a power of
  two s that takes its largest magnitude into [2^14, 2^15) (pow2_scale): the weight per output channel (the operand
  pass makes its parts, 1 / s per channel multiplies the sums at the end), the window per program and depth tap,
  from the operand pass's block maxima over the plane that the depth tap copies (1 / s multiplies each partial
  sum, below, as it is added). The A fragments are loaded as float32 and split in registers; the channels (t, t + 4,
  t + 8, t + 12) that a lane holds after ldmatrix become the FP16 fragment's k = (2t, 2t + 1, 2t + 8, 2t + 9), and
  the operand pass orders the weight's channels the same way. With PRESPLIT_TAPS (kh, kw) taps or more, the plane
  is split in shared memory instead, once per depth tap, into the same parts in the same k order (split_plane). Each
  32 channels' weight row holds its hi halves, then its lo halves: 128 bytes, one swizzle atom, as TF32's 32
  channels.
The tensor cores truncate as they add to their accumulator (problem 77 in 3xTF32, every k-step into one
accumulator: 5.6e-6 off float64), so the MMAs of PROMOTE k-steps start from zero in a partial accumulator, which
ordinary float32 adds then add to the sums. The adds wait for every MMA in flight: ptxas serializes all MMAs if any
instruction reads accumulators while one is in flight.

A program (one warpgroup, 128 threads) owns BH rows x 32 columns of one qd plane and COB output channels. Per depth
tap it copies the window plane its positions read into shared memory once (rows padded to C_IN + 4 floats, so that
ldmatrix reads them without bank conflicts), and every (kh, kw) tap reads its A fragments there at the tap's
offset: the input tile is loaded once per depth tap, not once per tap. The weight streams through a four-stage
ring two units ahead (16-byte cp.async), a unit being a tap's UC input channels (all C_IN, or with 128 a half or a
quarter, so that the ring fits beside the plane), stored K-major in 128-byte-swizzled rows that wgmma reads through
a descriptor. The A fragments of each k-step are loaded from shared memory (ldmatrix) while the previous k-step's
MMAs run. After the MMAs the tile is staged in shared memory and written row by row, each warp's 32 lanes over 32
consecutive columns.

Measured on the H200 for problem 77's phase (eleventh session, benchmarks/diag_conv_cuda.py, which this grew out of):
129 us under Nsight Compute against 154 for the same with mma.sync and 142 for cuDNN's kernel. Twenty-third session
(benchmarks/RESULTS.md): loading the A fragments a k-step ahead and writing the tile in runs of 8 channels took the
compact correlation from 0.154 to 0.134 ms (0.435 to 0.395 in 3xTF32); Nsight Compute had put the warps' most
frequent stall on shared-memory loads, the MMAs' fragments' and the tile's. Twenty-fifth session: 3xFP16 took it to
0.230 ms (the correlation into the output's lattice 0.421 -> 0.261, the forward 0.565 -> 0.409, grad_input 0.588 ->
0.373), 2.3e-7 off float64 as 3xTF32. Twenty-sixth: the plane split in shared memory (PRESPLIT_TAPS) took the
correlation into the lattice to 0.240 ms and grad_input to 0.334. Thirty-first: FP16 in TF32 mode took the compact
correlation from 0.137 to 0.115 ms, into the lattice 0.184 -> 0.167, grad_input 0.284 -> 0.271, 2.9e-4 off float64
as TF32 (benchmarks/diag_phase_conv.py).
"""

# What the wgmma kernels (this one, row_runs.py's and grad_weight.py's) use: shared-memory addresses, cp.async groups
# and the weight-side descriptor.
COPY_HELPERS = r"""
__device__ __forceinline__ unsigned smem_addr(const float* p) { return (unsigned)__cvta_generic_to_shared(p); }

// cp.async groups; "memory": shared-memory reads after a wait stay after it.
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ unsigned long long b_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32)
           | (1ull << 62);
}
__device__ __forceinline__ void cp_async16(float* dst, const float* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(smem_addr(dst)), "l"(src));
}
"""

# ... and the MMA with A from registers (this kernel's and grad_weight.py's; WGMMA_ASM is replaced by wgmma_asm(N)).
WGMMA_HELPERS = COPY_HELPERS + r"""
// d = A (64 x 8, from registers) x B (8 x COB, shared memory through desc), plus d unless accumulate is 0.
__device__ __forceinline__ void wgmma(float* d, const unsigned* a, unsigned long long desc, int accumulate = 1) {
    WGMMA_ASM
}

"""

# The phases of one launch, as both phase correlations (this one and row_runs.py's) take them: PHASE_FIELDS values
# each, the window's offsets (d, h, w) of grid position 0, the first kernel tap and the step between taps per axis
# (d, h, w), and y's element offset of the phase's lattice (cuda._phase_table). TAKE_PHASE(index) declares phase
# index's fields as a kernel's locals (off_d, td0, tds, ...) and moves y to its lattice.
PHASE_HELPERS = r"""
struct Phases { long long at[MAX_PHASES][PHASE_FIELDS]; };
#define TAKE_PHASE(index) \
    const long long* phase = phases.at[index]; \
    const int off_d = (int)phase[0], off_h = (int)phase[1], off_w = (int)phase[2]; \
    const int td0 = (int)phase[3], th0 = (int)phase[4], tw0 = (int)phase[5]; \
    const int tds = (int)phase[6], ths = (int)phase[7], tws = (int)phase[8]; \
    y += phase[9]
"""

# What both phase correlations (this one and row_runs.py's) use to write their tile: staged in shared memory as
# [channel][position], channels ocs floats apart, tile row r's 32 columns from r * row_pitch on, and written in runs of
# OC_RUN channels of one row, lane l at column l (every load of a run before its stores: one load, then its store, a
# row at a time, left each warp waiting on every load). y_tile: the tile's first channel, row 0 and column lane;
# column_inside: whether the lane's column lies in the grid.
TILE_HELPERS = r"""
#define OC_RUN 8                            // channels a warp writes per row in one go (COB is a multiple of 8)
template <int ROWS_, int COB_, int THREADS_>
__device__ __forceinline__ void write_tile(const float* staged, int ocs, int row_pitch, float* y_tile, long long syc,
                                           long long syh, int qh0, int QH, bool column_inside, int warp, int lane) {
    #pragma unroll 1
    for (int job = warp; job < ROWS_ * (COB_ / OC_RUN); job += THREADS_ / 32) {
        const int r = job % ROWS_, oc0 = job / ROWS_ * OC_RUN, qh = qh0 + r;
        if (qh >= QH) continue;  // (the same for the whole warp)
        const float* src = staged + oc0 * ocs + r * row_pitch + lane;
        float v[OC_RUN];
        #pragma unroll
        for (int k = 0; k < OC_RUN; k++) v[k] = src[k * ocs];
        float* out = y_tile + (long long)oc0 * syc + (long long)qh * syh;
        #pragma unroll
        for (int k = 0; k < OC_RUN; k++)
            if (column_inside) out[k * syc] = v[k];
    }
}
"""

# What both phase correlations (this one and row_runs.py's) use to scale and split the window in FP16: the splits,
# the power-of-two scales and the largest magnitude of a window plane (or of several).
FP16_HELPERS = r"""
// FP16 (SPLIT 3): x and y times scale as a pair of halves (x in the low half), rounding to nearest.
__device__ __forceinline__ unsigned to_half2(float x, float y, float scale) {
    unsigned h;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(h) : "f"(y * scale), "f"(x * scale));
    return h;
}

// 3xFP16 (SPLIT 2): x and y times scale as hi + lo, each a pair of halves (x in the low half): hi = f16(x s),
// lo = f16(x s - hi), rounding to nearest.
__device__ __forceinline__ void split_half2(float x, float y, float scale, unsigned& hi, unsigned& lo) {
    x *= scale;
    y *= scale;
    hi = to_half2(x, y, 1.f);  // (x and y scaled already)
    float hx, hy;
    asm("{\n.reg .f16 l, u;\nmov.b32 {l, u}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, u;\n}\n"
        : "=f"(hx), "=f"(hy) : "r"(hi));
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(lo) : "f"(y - hy), "f"(x - hx));
}

// The power of two that takes amax (at least every |value| it scales) into [2^14, 2^15) (the exponent clamped so
// that the scale and its inverse are normal floats), and its inverse. FP16's largest value is 65504.
__device__ __forceinline__ float pow2_scale(float amax, float& inverse) {
    const int exponent = min(max(268 - ((__float_as_int(amax) >> 23) & 0xFF), 1), 253);
    inverse = __int_as_float((254 - exponent) << 23);
    return __int_as_float(exponent << 23);
}

// The largest magnitude in a window plane, the largest of the block maxima over its rows rows from first_row on
// (rows of the window, (n * XD + depth) * XH + row) and blocks column blocks from first_block on (max_blocks a row).
__device__ __forceinline__ float plane_max(const float* block_max, long long first_row, int rows, int first_block,
                                           int blocks, int max_blocks, int lane) {
    float amax = 0.f;
    for (int e = lane; e < rows * blocks; e += 32)
        amax = fmaxf(amax, block_max[(first_row + e / blocks) * max_blocks + first_block + e % blocks]);
    for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    return amax;
}

// plane_max over planes window planes plane_step rows apart (FP16's one scale for every plane a program reads), in one
// round of loads, lanes over (plane, row, column block). Read plane by plane, each round waited for its loads: on the
// H200 row_runs.py's problem 77 and phase_conv.py's k3s1p1 took about 1% and 2.5% longer (seventy-third and
// seventy-fourth sessions, benchmarks/diag_row_runs_latency.py and diag_fp16_scale_rounds.py).
__device__ __forceinline__ float planes_max(const float* block_max, long long first_row, int planes,
                                            long long plane_step, int rows, int first_block, int blocks,
                                            int max_blocks, int lane) {
    float amax = 0.f;
    for (int e = lane; e < planes * rows * blocks; e += 32) {
        const int plane = e / (rows * blocks), r = e % (rows * blocks);
        amax = fmaxf(amax, block_max[(first_row + plane * plane_step + r / blocks) * max_blocks + first_block
                                     + r % blocks]);
    }
    for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    return amax;
}
"""

SOURCE = r"""
#define BW 32
#define HH (BH + (KH - 1) * DH)
#define HW (BW + (KW - 1) * DW)
#define PLANE (HH * HW)
#define THREADS 128
#define U (C_IN / UC)                       // weight units per tap, UC channels each: a ring stage each
#define HALF (SPLIT >= 2)                   // FP16 MMAs: 3xFP16 (SPLIT 2) or FP16 (3)
#define PARTIALS (SPLIT == 1 || SPLIT == 2) // the splits' partial sums (below)
#define K_STEP (HALF ? 16 : 8)              // channels per k-step: m64nNk8 (TF32) or m64nNk16 (FP16)
#define KS (UC / K_STEP)                    // k-steps per unit
#define KPA (32 / K_STEP)                   // k-steps per 32-channel block (a 128-byte row of the weight's)
// A slab's A registers a k-step: TF32's; 3xFP16's hi and lo; FP16's as loaded (float32), then its halves.
#define A_REGS (SPLIT == 2 || (SPLIT == 3 && !PRESPLIT) ? 8 : 4)
#define CPA (C_IN + 4)                      // a window position's floats in shared memory
#define SLABS (BH * BW / 64)                // M = 64 positions per wgmma
#define KB (UC / 32)                        // 32-channel blocks: one 128-byte swizzle atom wide
#define B_PART (KB * COB * 32)              // floats of a unit's weight block (one of its parts with SPLIT)
#define B_STAGE (B_PART * (1 + (SPLIT == 1))) // floats per weight stage: the block, or (3xTF32) its hi and lo parts
#define STAGES 4                            // the stage refilled at unit u was read by unit u - 2's MMAs
#define OCS (BH * BW + 4)                   // a channel's floats in the staged output tile

// Four 8 x (4 floats) matrices, one row address per lane: lane l gets element (l / 4, l % 4) of each, the A
// fragment layout of a TF32 MMA with 16 rows and 8 channels when lanes address the rows accordingly.
__device__ __forceinline__ void ldmatrix4(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// To TF32, rounding to nearest (ties away from zero) as the operand pass rounds: two integer instructions, where
// cvt.rna.tf32.f32 compiles to about ten on sm_90.
__device__ __forceinline__ unsigned to_tf32(float x) { return (__float_as_uint(x) + 0x1000u) & 0xFFFFE000u; }

// The window plane one depth tap reads for a tile: HH rows of HW positions of C_IN channels, each row contiguous
// in the window. Warps take rows, lanes the row's 16-byte chunks.
#define ROW_CHUNKS (HW * C_IN / 4)
__device__ __forceinline__ void copy_plane(float* halo, const float* plane, long long row_floats, int warp, int lane) {
    for (int r = warp; r < HH; r += THREADS / 32) {
        const float* src = plane + r * row_floats + lane * 4;
        float* dst = halo + (r * HW + lane / (C_IN / 4)) * CPA + (lane % (C_IN / 4)) * 4;
        #pragma unroll
        for (int m = 0; m < (ROW_CHUNKS + 31) / 32; m++)
            if (m * 32 + lane < ROW_CHUNKS) cp_async16(dst + m * (32 / (C_IN / 4)) * CPA, src + m * 128);
    }
}

// A unit's COB x UC weight block (w_tap: its first channel of the tap's rows), K-major: 32-channel blocks of COB
// rows of 128 bytes, whose 16-byte chunks are swizzled by (row & 7), as wgmma's 128-byte swizzle mode reads them.
// With SPLIT the lo part follows the hi part in the stage.
__device__ __forceinline__ void copy_weight(float* stage, const float* w_tap, const float* w_lo_tap, int tid) {
    #pragma unroll
    for (int e = tid; e < COB * UC / 4; e += THREADS) {
        const int oc = e / (UC / 4), c4 = e % (UC / 4), kb = c4 / 8, c = c4 % 8;
        float* dst = stage + (kb * COB + oc) * 32 + ((c ^ (oc & 7)) << 2);
        cp_async16(dst, w_tap + (long long)oc * C_IN + c4 * 4);
        if (SPLIT == 1) cp_async16(dst + B_PART, w_lo_tap + (long long)oc * C_IN + c4 * 4);
    }
}

// The A fragments of k-step g of a depth tap's plane, g = ((kh * KW + kw) * U + unit) * KS + ks: for each slab of 64
// positions, the K_STEP channels unit * UC + K_STEP * ks.. of the positions shifted by the tap (kh, kw), as float32
// (8 channels per ldmatrix4).
__device__ __forceinline__ void load_a(unsigned (&r)[SLABS][A_REGS], unsigned a_lane, int g) {
    const int ks = g % KS, unit = g / KS % U, kw = g / (KS * U) % KW, kh = g / (KS * U * KW);
    #pragma unroll
    for (int s = 0; s < SLABS; s++)
        #pragma unroll
        for (int h = 0; h < A_REGS / 4; h++)
            ldmatrix4(r[s] + 4 * h, a_lane + 4 * (((2 * s + kh * DH) * HW + kw * DW) * CPA + unit * UC + K_STEP * ks
                                                  + 8 * h));
}

// FP16 with PRESPLIT: the plane's float32 channels, in place, as their parts split_half2 makes (times scale): each 16
// channels' 64 bytes become 32 bytes of hi halves, then 32 of lo halves, in the order of an A fragment's k (k = 2t,
// 2t + 1, 2t + 8, 2t + 9 hold channels t, t + 4, t + 8, t + 12, as the weight's), so that load_a's two ldmatrix4 of
// a k-step load the hi and the lo fragments as they are. Once per depth tap, not once per (kh, kw) tap.
__device__ __forceinline__ void split_plane(float* halo, float scale, int tid) {
    #pragma unroll 1
    for (int e = tid; e < PLANE * (C_IN / 16); e += THREADS) {
        float4* group = (float4*)(halo + (e / (C_IN / 16)) * CPA + (e % (C_IN / 16)) * 16);
        float v[16];
        #pragma unroll
        for (int q = 0; q < 4; q++) {
            const float4 f = group[q];
            v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
        }
        unsigned hi[8], lo[8];
        #pragma unroll
        for (int t = 0; t < 4; t++) {
            split_half2(v[t], v[t + 4], scale, hi[t], lo[t]);
            split_half2(v[t + 8], v[t + 12], scale, hi[t + 4], lo[t + 4]);
        }
        uint4* parts = (uint4*)group;
        parts[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        parts[1] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
        if (SPLIT == 2) {  // (FP16 reads the hi halves only)
            parts[2] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
            parts[3] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
phase_conv(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ w_lo,
           const float* __restrict__ bias, const float* __restrict__ block_max, const float* __restrict__ w_inverse,
           float* __restrict__ y, int XD, int XH, int XW, int KHF, int KWF,
           int QD, int QH, int QW, int qh_blocks, int qw_blocks, int max_block, int max_blocks, int phase_count,
           long long syn, long long syc, long long syd, long long syh, long long syw, const Phases phases)
{
    extern __shared__ __align__(1024) float4 smem4[];
    float* ring = (float*)smem4;                      // [STAGES][KB][COB][32], swizzled
    float* halo = ring + STAGES * B_STAGE;            // [PLANE][CPA]
    // threadIdx.x % THREADS (the block has THREADS threads) tells the compiler that warp < THREADS / 32, so that the
    // loops over rows and jobs that start at warp unroll. On the H200 (thirty-ninth session, benchmarks/RESULTS.md;
    // measured as the known_threads option of bda9193's form of this kernel) it took the correlation of vae_k4s2p1
    // from 0.149 to 0.119 ms (0.190 to 0.143 with TF32 off), k3s1p1's from 0.053 to 0.041 and problem 77's from
    // 0.163 to 0.158 (0.234 to 0.213), the results bitwise the same.
    const int tid = threadIdx.x % THREADS, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    // Programs: output-channel blocks fastest (they share the input tile in L2), then phases (they read about the
    // same tile, and write the same sectors of y), columns, rows, depth, sample.
    int tile = blockIdx.x;
    const int ob = tile % (C_OUT / COB); tile /= C_OUT / COB;
    TAKE_PHASE(tile % phase_count);
    tile /= phase_count;
    const int qw0 = (tile % qw_blocks) * BW; tile /= qw_blocks;
    const int qh0 = (tile % qh_blocks) * BH; tile /= qh_blocks;
    const int qd = tile % QD, n = tile / QD;
    const long long row_floats = (long long)XW * C_IN;
    const float* plane0 = x + (((long long)n * XD + qd + off_d) * XH + qh0 + off_h) * row_floats
                          + (long long)(qw0 + off_w) * C_IN;
    const long long w_block = (long long)ob * COB * C_IN;
    #define W_TAP(tap) (w_block + (long long)(((td0 + ((tap) / (KH * KW)) * tds) * KHF + th0 \
        + ((tap) / KW % KH) * ths) * KWF + tw0 + ((tap) % KW) * tws) * C_OUT * C_IN)
    #define UNIT(u) (W_TAP((u) / U) + (u) % U * UC)  // unit u = tap * U + (its channels) / UC
    #define COPY_WEIGHT(stage, u) copy_weight(stage, w + UNIT(u), w_lo + UNIT(u), tid)

    COPY_WEIGHT(ring, 0);
    cp_commit();
    if (KD * KH * KW * U > 1) COPY_WEIGHT(ring + B_STAGE, 1);
    cp_commit();
    copy_plane(halo, plane0, row_floats, warp, lane);
    cp_commit();

    // ldmatrix row addresses: warp v reads positions 16v..16v+15 of each slab of 64 (tile rows 2s and 2s + 1).
    const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1), a_k = 4 * (lane >> 4);
    const int p = 16 * warp + a_row;
    const unsigned a_lane = smem_addr(halo + ((p / BW) * HW + p % BW) * CPA + a_k);
    const unsigned ring_addr = smem_addr(ring);
    float d[SLABS][COB / 2];                          // with PARTIALS: the sum of the partials added so far
    unsigned a[3][SLABS][A_REGS];                     // 3xTF32: the hi parts; 3xFP16: hi, then lo; FP16: hi
    // The splits' arrays: one element without them, so that their code, indexed [PARTIALS ? i : 0] (3xTF32's lo parts:
    // [SPLIT == 1 ? i : 0]), compiles and drops out.
    unsigned a_lo[3][SLABS][SPLIT == 1 ? 4 : 1];
    float partial[PARTIALS ? SLABS : 1][PARTIALS ? COB / 2 : 1];
    #pragma unroll
    for (int s = 0; s < SLABS; s++)
        #pragma unroll
        for (int k = 0; k < COB / 2; k++) {
            d[s][k] = 0.f;
            if (PARTIALS) partial[PARTIALS ? s : 0][PARTIALS ? k : 0] = 0.f;
        }
    // FP16: the window plane's scale (3xFP16) or the program's (FP16) and its inverse, and the inverse that the
    // partial sums' MMAs were scaled by.
    float a_scale = 1.f, a_inverse = 1.f, partial_inverse = 0.f;
    // With PARTIALS: the partial sums into the sums (3xFP16: times the inverse scale of the plane they came from).
    auto add_partial = [&]() {
        #pragma unroll
        for (int s = 0; s < SLABS; s++)
            #pragma unroll
            for (int k = 0; k < COB / 2; k++)
                d[s][k] += SPLIT == 2 ? partial[PARTIALS ? s : 0][PARTIALS ? k : 0] * partial_inverse
                                      : partial[PARTIALS ? s : 0][PARTIALS ? k : 0];
    };
    // FP16: the window row of plane 0's first row, and the planes' column blocks in block_max.
    const long long first_row = ((long long)n * XD + qd + off_d) * XH + qh0 + off_h;
    const int first_block = HALF ? (qw0 + off_w) / max_block : 0;
    const int blocks = HALF ? (qw0 + off_w + HW - 1) / max_block - first_block + 1 : 0;
    // FP16: one scale for every plane the program reads, so that its MMAs add into the sums directly (a scale per
    // plane would need 3xFP16's partial sums).
    if (SPLIT == 3) {
        a_scale = pow2_scale(planes_max(block_max, first_row, KD, (long long)DD * XH, HH, first_block, blocks,
                                        max_blocks, lane), a_inverse);
    }

    #pragma unroll 1
    for (int kd = 0; kd < KD; kd++) {
        if (kd > 0) {
            __syncthreads();  // every warp's fragment loads from the previous plane are done
            copy_plane(halo, plane0 + (long long)kd * DD * XH * row_floats, row_floats, warp, lane);
            cp_commit();
        }
        if (SPLIT == 2)
            a_scale = pow2_scale(plane_max(block_max, first_row + (long long)kd * DD * XH, HH, first_block, blocks,
                                           max_blocks, lane), a_inverse);
        #pragma unroll
        for (int kh = 0; kh < KH; kh++)
            #pragma unroll
            for (int kw = 0; kw < KW; kw++)
                #pragma unroll
                for (int unit = 0; unit < U; unit++) {
                    const int step = ((kd * KH + kh) * KW + kw) * U + unit;
                    // One group of MMAs per k-step, with one group (the previous k-step's) left in flight: at a
                    // unit's start that frees the stage unit - 2 read, which this unit refills. At a plane's start
                    // none: the A fragments' buffers start over there (below).
                    if (kh == 0 && kw == 0 && unit == 0) {
                        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                        cp_wait<0>();
                    } else {
                        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                        cp_wait<1>();
                    }
                    // The copies visible to the tensor cores.
                    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                    __syncthreads();
                    if (step + 2 < KD * KH * KW * U) COPY_WEIGHT(ring + ((step + 2) % STAGES) * B_STAGE, step + 2);
                    cp_commit();
                    if (HALF && PRESPLIT && kh == 0 && kw == 0 && unit == 0) {  // the plane has arrived
                        split_plane(halo, a_scale, tid);
                        __syncthreads();
                    }
                    const unsigned stage = ring_addr + 4 * (step % STAGES) * B_STAGE;
                    #pragma unroll
                    for (int ks = 0; ks < KS; ks++) {
                        if (ks > 0) asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                        // The A fragments of k-step g of the plane are in buffer g % 3, loaded after the previous
                        // k-step's MMAs were issued (below), so that the fence before this k-step's MMAs, which waits
                        // for every register write in flight, does not wait for ldmatrix.
                        const int g = ((kh * KW + kw) * U + unit) * KS + ks, buf = g % 3;
                        if (g == 0) load_a(a[0], a_lane, 0);
                        // FP16 in registers: channels (t, t + 4, t + 8, t + 12) as k (2t, 2t + 1, 2t + 8, 2t + 9); the
                        // hi halves in r[0..3], 3xFP16's lo halves in r[4..7]
                        if (HALF && !PRESPLIT) {
                            #pragma unroll
                            for (int s = 0; s < SLABS; s++) {
                                unsigned* r = a[buf][s];
                                float v[8];
                                #pragma unroll
                                for (int e = 0; e < 8; e++) v[e] = __uint_as_float(r[e]);
                                // Register pair j holds (v[e], v[e + 2]): (0, 2), (1, 3), (4, 6), (5, 7).
                                #pragma unroll
                                for (int j = 0; j < 4; j++) {
                                    const int e = j / 2 * 4 + j % 2;
                                    if (SPLIT == 2) split_half2(v[e], v[e + 2], a_scale, r[j], r[A_REGS / 2 + j]);
                                    else r[j] = to_half2(v[e], v[e + 2], a_scale);
                                }
                            }
                        }
                        if (SPLIT == 1) {
                            #pragma unroll
                            for (int s = 0; s < SLABS; s++)
                                #pragma unroll
                                for (int e = 0; e < 4; e++) {
                                    const float value = __uint_as_float(a[buf][s][e]);
                                    const unsigned hi = to_tf32(value);
                                    a_lo[buf][s][SPLIT ? e : 0] = to_tf32(value - __uint_as_float(hi));
                                    a[buf][s][e] = hi;
                                }
                        }
                        if (PARTIALS && g % PROMOTE == 0) {  // the partial into the sums, once its MMAs are done
                            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                            add_partial();
                            partial_inverse = a_inverse;
                        }
                        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
                        const unsigned b_at = stage + 4 * ((ks / KPA) * COB * 32 + (ks % KPA) * 8);
                        const unsigned long long desc = b_desc(b_at);
                        if (!PARTIALS) {
                            #pragma unroll
                            for (int s = 0; s < SLABS; s++) wgmma(d[s], a[buf][s], desc);
                        } else {
                            // The lo parts: 3xTF32's after the hi parts' block; FP16's in the same rows, 64 bytes on.
                            const unsigned long long desc_lo = b_desc(b_at + (SPLIT == 1 ? 4 * B_PART : 64));
                            #pragma unroll
                            for (int s = 0; s < SLABS; s++) {
                                float* sums = partial[PARTIALS ? s : 0];
                                const unsigned* a_low = SPLIT == 1 ? a_lo[buf][s] : a[buf][s] + 4;
                                wgmma(sums, a[buf][s], desc, g % PROMOTE != 0);  // from zero after a promotion
                                wgmma(sums, a[buf][s], desc_lo);
                                wgmma(sums, a_low, desc);
                            }
                        }
                        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                        // The next k-step's fragments, into the buffer k-step g - 2 read: its group is done (one
                        // group was left in flight before this k-step's).
                        if (g + 1 < KH * KW * U * KS) load_a(a[(g + 1) % 3], a_lane, g + 1);
                    }
                }
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    if (PARTIALS) add_partial();  // the last partial
    cp_wait<0>();
    __syncthreads();  // shared memory free: the tile goes there

    // The tile staged as [channel][position], channels OCS floats apart (the fragments' stores hit 32 banks), the
    // bias added here (each thread's channels 8j + 2t and 8j + 2t + 1), then written out (write_tile).
    float* staged = (float*)smem4;
    #pragma unroll
    for (int j = 0; j < COB / 8; j++) {
        const float b0 = HAS_BIAS ? bias[ob * COB + 8 * j + 2 * t] : 0.f;
        const float b1 = HAS_BIAS ? bias[ob * COB + 8 * j + 2 * t + 1] : 0.f;
        // FP16: the sums are in units of the weight's per-channel scale (and FP16's, of the program's window scale,
        // multiplied apart: the two inverses' product can leave float32's range where the result does not).
        const float s0 = HALF ? w_inverse[ob * COB + 8 * j + 2 * t] : 1.f;
        const float s1 = HALF ? w_inverse[ob * COB + 8 * j + 2 * t + 1] : 1.f;
        const float a_unit = SPLIT == 3 ? a_inverse : 1.f;
        #pragma unroll
        for (int s = 0; s < SLABS; s++)
            #pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int pos = 64 * s + 16 * warp + g + 8 * hf;
                staged[(8 * j + 2 * t) * OCS + pos] = d[s][4 * j + 2 * hf] * s0 * a_unit + b0;
                staged[(8 * j + 2 * t + 1) * OCS + pos] = d[s][4 * j + 2 * hf + 1] * s1 * a_unit + b1;
            }
    }
    __syncthreads();
    const int qw = qw0 + lane;
    float* y_tile = y + n * syn + (long long)(ob * COB) * syc + qd * syd + (long long)qw * syw;
    write_tile<BH, COB, THREADS>(staged, OCS, BW, y_tile, syc, syh, qh0, QH, qw < QW, warp, lane);
}
"""


# k-steps per partial sum (the docstring above), counted from each depth tap's first: a window plane's scale holds
# within one. On the H200, problem 77's forward correlation took 0.487 / 0.434 / 0.422 ms in 3xTF32 with 1 / 2 / 4,
# 2.3e-7 / 2.3e-7 / 3.3e-7 off float64 (fourteenth session); into the output's lattice in 3xFP16 0.261 / 0.255 /
# 0.249 / 0.248 / 0.246 ms with 2 / 3 / 4 / 6 / 9, 2.3e-7 / 2.7e-7 / 3.1e-7 / 4.2e-7 / 5.5e-7 off float64, the
# whole forward within noise of 0.41 (benchmarks/RESULTS.md, twenty-fifth session).
PROMOTE = 2
# Phases per launch, and the values that describe each (the kernel's struct Phases).
MAX_PHASES = 8
PHASE_FIELDS = 10
# 3xFP16: from this many (kh, kw) taps on, the window plane is split into its FP16 parts once per depth tap in shared
# memory (split_plane), not each k-step's A fragments in registers, once per (kh, kw) tap. The split in shared memory
# runs while no MMA does; the split in registers, beside the previous k-step's MMAs. On the H200 (twenty-sixth
# session, benchmarks/RESULTS.md), TF32 off, the same results bitwise: with 3 x 3 taps problem 77's forward
# correlation into the lattice took 0.240 ms against 0.259, its grad_input 0.334-0.338 against 0.380-0.389, k3s1p1's
# forward 0.111-0.115 against 0.112-0.129; with 2 x 2 taps or fewer, slower (vae_k4s2p1's forward 0.310-0.316 against
# 0.272-0.279, unet3d_k2s2's 0.194-0.207 against 0.175-0.187).
PRESPLIT_TAPS = 9


def wgmma_asm(n: int, half: bool = False) -> str:
    """The inline PTX of wgmma m64n{n}k8 TF32 (half: m64n{n}k16 FP16, the weight K-major) with A from registers,
    accumulating into d: n / 2 floats a thread."""
    regs = n // 2
    acc = ", ".join(f"%{k}" for k in range(regs))
    a = ", ".join(f"%{regs + k}" for k in range(4))
    outs = ", ".join(f'"+f"(d[{k}])' for k in range(regs))
    # scale-d is a predicate operand (true: d += A B; false: d = A B), set from a register (accumulate).
    return (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 5}, 0;\\n'
            f'wgmma.mma_async.sync.aligned.m64n{n}{"k16.f32.f16.f16" if half else "k8.f32.tf32.tf32"} {{{acc}}}, '
            f'{{{a}}}, %{regs + 4}, p, 1, 1{", 0" if half else ""};\\n}}\\n"'
            f' : {outs} : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));')


def source(c_in: int, c_out: int, cob: int, taps, dilation, bh: int, has_bias: bool, split: int = 0,
           unit: int | None = None) -> str:
    """The kernel's source for one configuration: sizes as macros, so that every loop unrolls; split: 0 (TF32), 1
    (3xTF32) or 2 (3xFP16); unit: the input channels per weight stage (a multiple of 32 dividing c_in; None: c_in)."""
    (kd, kh, kw), (dd, dh, dw) = taps, dilation
    defines = dict(C_IN=c_in, C_OUT=c_out, COB=cob, KD=kd, KH=kh, KW=kw, DD=dd, DH=dh, DW=dw, BH=bh,
                   UC=unit or c_in, HAS_BIAS=int(has_bias), SPLIT=int(split), PROMOTE=PROMOTE,
                   MAX_PHASES=MAX_PHASES, PHASE_FIELDS=PHASE_FIELDS,
                   PRESPLIT=int(split >= 2 and kh * kw >= PRESPLIT_TAPS))
    head = "".join(f"#define {name} {value}\n" for name, value in defines.items())
    return head + (WGMMA_HELPERS + FP16_HELPERS + TILE_HELPERS + PHASE_HELPERS + SOURCE).replace(
        "WGMMA_ASM", wgmma_asm(cob, split >= 2))


def shared_bytes(c_in: int, cob: int, taps, dilation, bh: int, split: int = 0, unit: int | None = None) -> int:
    """Dynamic shared memory of one program: the weight ring (4 stages of unit input channels) and the window plane,
    or the staged output tile."""
    (_, kh, kw), (_, dh, dw) = taps, dilation
    ring = 4 * (unit or c_in) * cob * (2 if split == 1 else 1)
    plane = (bh + (kh - 1) * dh) * (32 + (kw - 1) * dw) * (c_in + 4)
    return 4 * max(ring + plane, cob * (bh * 32 + 4))
