"""Problem 77's phase correlation turned around: output channels as the MMA's M (the weight from shared memory through a
descriptor) and window positions as its N, several window rows at once (the window plane from shared memory through a
descriptor too), against the library's correlation on the same operands.

    PYTHONPATH=src python3 benchmarks/diag_turned.py [--iters 100] [--rounds 2]

Why: the library's correlation (backends/cuda/phase_conv.py) takes window positions as M from registers: four
m64n64 MMAs per k-step, each with A fragments loaded by ldmatrix, and Nsight Compute put its warps' stalls on
shared-memory loads. The fifty-sixth-odd sessions' note (benchmarks/RESULTS.md, "The MMAs' ceiling") dismissed
turning it around because N would be one tile row (32 positions, m64n32 at 246 TFLOP/s). But N need not stop at a
row: the window's rows lie XW = 34 positions apart, so R rows of it are one run of R x XW positions, of which each
row's last XW - 32 are outputs nobody needs (6% extra MMA work). Each tap (kh, kw) reads that run from position
kh * XW + kw on, and the previous sessions found wgmma reads a 128-byte-swizzled operand from any row. So one
m64n136k16 MMA (R = 4) per k-step and split, neither operand through registers.

The kernel here: one warpgroup per program, R = 4 rows x 32 columns of one qd plane x 64 output channels. Per depth
tap the window plane (R + 2 rows of XW positions) is read from global memory into registers, scaled and split into
FP16 halves as the library's split_plane makes them (the same channel order as the weight's operand pass), and stored
as 128-byte rows (hi halves, then lo halves) swizzled as wgmma's 128-byte mode reads them. The weight streams through
a four-stage ring (one tap a stage), as the library's. The tile is staged in shared memory and written row by row.
FP16 (TF32 mode, split 3) and 3xFP16 (TF32 off, split 2, with the library's partial sums every PROMOTE k-steps).

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call). The compact results are
compared with the library's and with float64; the forwards (zero_, operand pass, correlation into the lattice) are
checked against float64 and eager (KernelBench's check) into NaN-poisoned memory.
"""

import argparse

import torch
import torch.nn.functional as F

import convt3d
from convt3d.backends import cuda
from convt3d.backends.cuda import phase_conv
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.torch_phase import _lattice_geometry, _regions
from convt3d.backends.triton.launch import _current_stream
from convt3d.backends.triton.window import correlation_operands
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.plan import make_plan

P77 = dict(stride=2, padding=1, dilation=2)
THREADS = 128

# The library's helpers this kernel shares (FP16 splits, scales, plane maxima), copied from phase_conv.SOURCE, where
# they sit among macros of that kernel.
HELPERS = r"""
__device__ __forceinline__ unsigned to_half2(float x, float y, float scale) {
    unsigned h;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(h) : "f"(y * scale), "f"(x * scale));
    return h;
}
__device__ __forceinline__ void split_half2(float x, float y, float scale, unsigned& hi, unsigned& lo) {
    x *= scale;
    y *= scale;
    hi = to_half2(x, y, 1.f);
    float hx, hy;
    asm("{\n.reg .f16 l, u;\nmov.b32 {l, u}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, u;\n}\n"
        : "=f"(hx), "=f"(hy) : "r"(hi));
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(lo) : "f"(y - hy), "f"(x - hx));
}
__device__ __forceinline__ float pow2_scale(float amax, float& inverse) {
    const int exponent = min(max(268 - ((__float_as_int(amax) >> 23) & 0xFF), 1), 253);
    inverse = __int_as_float((254 - exponent) << 23);
    return __int_as_float(exponent << 23);
}
__device__ __forceinline__ float plane_max(const float* block_max, long long first_row, int max_blocks, int lane) {
    float amax = 0.f;
    for (int e = lane; e < HH * max_blocks; e += 32) amax = fmaxf(amax, block_max[first_row * max_blocks + e]);
    for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    return amax;
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}
"""

SOURCE = r"""
#define NP ((R * XW + 7) / 8 * 8)       // positions per tile, the MMA's N: R rows of XW, to a multiple of 8
#define PLANE_POS ((NP + (KH - 1) * XW + KW - 1 + 7) / 8 * 8)  // the most a tap's N positions reach
#define TAPS (KD * KH * KW)
#define W_STAGE (C_OUT * 32)            // floats: a tap's C_OUT rows of 128 bytes (32 hi, 32 lo halves)
#define OCS (NP + 4)
#define OC_RUN 8
#define PARTIALS (SPLIT == 2)
#define UNITS (2 * HH * XW)             // (position, 16 channels) pairs of a plane

// d (+)= A (64 x 16, shared memory through desc_a) x B (16 x NP, through desc_b), both K-major.
__device__ __forceinline__ void wgmma_ss(float* d, unsigned long long desc_a, unsigned long long desc_b,
                                         int accumulate = 1) {
    WGMMA_SS
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
turned(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
       const float* __restrict__ block_max, const float* __restrict__ w_inverse, float* __restrict__ y,
       int XD, int XH, int QD, int QH, int QW, int qh_blocks, int max_blocks, int off_d, int off_h,
       int td0, int th0, int tw0, int tds, int ths, int tws, int KHF, int KWF,
       long long syn, long long syc, long long syd, long long syh, long long syw)
{
    extern __shared__ __align__(1024) float4 smem4[];
    float* ring = (float*)smem4;                                  // [STAGES][C_OUT][32], swizzled
    unsigned* plane = (unsigned*)(ring + STAGES * W_STAGE);      // [PLANE_POS][32 words], swizzled
    const int tid = threadIdx.x % THREADS, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    int tile = blockIdx.x;
    const int qh0 = (tile % qh_blocks) * R; tile /= qh_blocks;
    const int qd = tile % QD, n = tile / QD;
    const long long first_row = ((long long)n * XD + qd + off_d) * XH + qh0 + off_h;  // window row of plane 0's row 0
    const float* plane0 = x + first_row * XW * C_IN;
    #define W_TAP(tap) ((long long)(((td0 + ((tap) / (KH * KW)) * tds) * KHF + th0 + ((tap) / KW % KH) * ths) * KWF \
                                    + tw0 + ((tap) % KW) * tws) * C_OUT * 32)
    auto copy_weight = [&](int stage, int tap) {
        const float* src = w + W_TAP(tap);
        float* dst = ring + stage * W_STAGE;
        // FP16 reads the hi halves alone: the first 4 of a row's 8 chunks.
        #define CHUNKS (SPLIT == 2 ? 8 : 4)
        #pragma unroll
        for (int e = tid; e < C_OUT * CHUNKS; e += THREADS) {
            const int oc = e / CHUNKS, c = e % CHUNKS;
            cp_async16(dst + oc * 32 + ((c ^ (oc & 7)) << 2), src + oc * 32 + c * 4);
        }
    };
    #pragma unroll
    for (int tap = 0; tap < AHEAD; tap++) {
        copy_weight(tap, tap);
        cp_commit();
    }
    // The plane's rows past its positions: read only for the outputs of a row's last XW - 32 columns, not written.
    for (int e = HH * XW * 32 + tid; e < PLANE_POS * 32; e += THREADS) plane[e] = 0u;

    float d[NP / 2];
    float partial[PARTIALS ? NP / 2 : 1];
    #pragma unroll
    for (int k = 0; k < NP / 2; k++) {
        d[k] = 0.f;
        if (PARTIALS) partial[PARTIALS ? k : 0] = 0.f;
    }
    float a_scale = 1.f, a_inverse = 1.f, partial_inverse = 0.f;
    auto add_partial = [&]() {
        #pragma unroll
        for (int k = 0; k < NP / 2; k++) d[k] += partial[PARTIALS ? k : 0] * partial_inverse;
    };
    if (SPLIT == 3) {
        float amax = 0.f;
        for (int kd = 0; kd < KD; kd++)
            amax = fmaxf(amax, plane_max(block_max, first_row + (long long)kd * XH, max_blocks, lane));
        a_scale = pow2_scale(amax, a_inverse);
    }
    const unsigned ring_addr = smem_addr(ring), plane_addr = smem_addr((float*)plane);

    #pragma unroll 1
    for (int kd = 0; kd < KD; kd++) {
        if (kd > 0) {
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            __syncthreads();  // every MMA reading the previous plane is done
        }
        if (WHAT_IF == 1 && kd > 0) goto taps;  // (what-if: the plane of kd = 0 reused, results wrong)
        if (SPLIT == 2)
            a_scale = pow2_scale(plane_max(block_max, first_row + (long long)kd * XH, max_blocks, lane), a_inverse);
        // The plane: (position, 16 channels) units, loaded first, then split and stored, 128-byte rows swizzled:
        // the hi halves of channels 16 c16.. in 16-byte chunks 2 c16 and 2 c16 + 1, the lo halves 4 further.
        const float4* src = (const float4*)(plane0 + (long long)kd * XH * XW * C_IN);
        #pragma unroll
        for (int base = 0; base < UNITS; base += 2 * THREADS) {
            float4 v[2][4];
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const int u = base + h * THREADS + tid;
                #pragma unroll
                for (int q = 0; q < 4; q++) v[h][q] = u < UNITS ? src[u * 4 + q] : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const int u = base + h * THREADS + tid;
                if (u >= UNITS) continue;
                const int p = u / 2, c16 = u % 2;
                float f[16];
                #pragma unroll
                for (int q = 0; q < 4; q++)
                    f[4 * q] = v[h][q].x, f[4 * q + 1] = v[h][q].y, f[4 * q + 2] = v[h][q].z, f[4 * q + 3] = v[h][q].w;
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
                uint4* row = (uint4*)(plane + p * 32);
                row[(2 * c16) ^ (p & 7)] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
                row[(2 * c16 + 1) ^ (p & 7)] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
                if (SPLIT == 2) {
                    row[(4 + 2 * c16) ^ (p & 7)] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
                    row[(4 + 2 * c16 + 1) ^ (p & 7)] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
                }
            }
        }
    taps:
        #pragma unroll 1
        for (int tap9 = 0; tap9 < KH * KW; tap9++) {
            const int kh = tap9 / KW, kw = tap9 % KW, step = kd * KH * KW + tap9;
            // The stage refilled here was read by tap step + AHEAD - STAGES (at most step - 2): its MMAs are done
            // once only the previous tap's last group may be in flight.
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            cp_wait<AHEAD - 1>();  // this tap's weight (AHEAD groups were committed before tap 0, one a tap since)
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the plane's stores and the copies
            __syncthreads();
            if (step + AHEAD < TAPS) copy_weight((step + AHEAD) % STAGES, step + AHEAD);
            cp_commit();
            const unsigned a_at = ring_addr + 4 * (step % STAGES) * W_STAGE;
            const unsigned b_at = plane_addr + (kh * XW + kw) * 128;
            #pragma unroll
            for (int ks = 0; ks < 2; ks++) {
                const int gstep = tap9 * 2 + ks;  // k-steps of this plane
                if (PARTIALS && gstep % PROMOTE == 0) {
                    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                    add_partial();
                    partial_inverse = a_inverse;
                }
                asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
                const unsigned long long a_hi = b_desc(a_at + 32 * ks), b_hi = b_desc(b_at + 32 * ks);
                if (!PARTIALS) {
                    wgmma_ss(d, a_hi, b_hi);
                } else {
                    const unsigned long long a_lo = b_desc(a_at + 64 + 32 * ks), b_lo = b_desc(b_at + 64 + 32 * ks);
                    wgmma_ss(partial, a_hi, b_hi, gstep % PROMOTE != 0);
                    wgmma_ss(partial, a_lo, b_hi);
                    wgmma_ss(partial, a_hi, b_lo);
                }
                asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            }
        }
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    if (PARTIALS) add_partial();
    cp_wait<0>();
    __syncthreads();

    if (WHAT_IF == 2 && d[0] != 12345.f) return;  // (what-if: no output written)
    // d[4 j + e]: output channel 16 warp + g + 8 (e / 2), position 8 j + 2 t + e % 2.
    float* staged = (float*)smem4;  // [C_OUT][OCS]
    #pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int o = 16 * warp + g + 8 * hf;
        const float b = HAS_BIAS ? bias[o] : 0.f;
        const float s = w_inverse[o] * (SPLIT == 3 ? a_inverse : 1.f);
        #pragma unroll
        for (int j = 0; j < NP / 8; j++) {
            staged[o * OCS + 8 * j + 2 * t] = d[4 * j + 2 * hf] * s + b;
            staged[o * OCS + 8 * j + 2 * t + 1] = d[4 * j + 2 * hf + 1] * s + b;
        }
    }
    __syncthreads();
    float* y_tile = y + n * syn + qd * syd + (long long)lane * syw;
    #pragma unroll 1
    for (int job = warp; job < R * (C_OUT / OC_RUN); job += THREADS / 32) {
        const int r = job % R, oc0 = job / R * OC_RUN, qh = qh0 + r;
        if (qh >= QH) continue;
        const float* from = staged + oc0 * OCS + r * XW + lane;
        float v[OC_RUN];
        #pragma unroll
        for (int k = 0; k < OC_RUN; k++) v[k] = from[k * OCS];
        float* out = y_tile + (long long)oc0 * syc + (long long)qh * syh;
        #pragma unroll
        for (int k = 0; k < OC_RUN; k++)
            if (lane < QW) out[k * syc] = v[k];
    }
}
"""


# The same MMAs, a depth tap's weights at a time: per depth tap the weights of its KH x KW taps (WBUF = 2: copied
# during the previous depth tap's MMAs) and the window plane into shared memory, then every MMA of the depth tap issued
# without a wait or barrier between (3xFP16: a wait for the partial sums every PROMOTE k-steps). ROW: bytes of a
# weight or window row in shared memory, 128 (hi and lo halves, 128-byte swizzle) or, FP16 only, 64 (hi halves,
# 64-byte swizzle).
SOURCE_KD = r"""
#define NP ((R * XW + 7) / 8 * 8)
#define PLANE_POS ((NP + (KH - 1) * XW + KW - 1 + 7) / 8 * 8)
#define TAPS9 (KH * KW)
#define W_ROWS (C_OUT * ROW / 4)                 // floats of a tap's weight rows
#define W_KD (TAPS9 * W_ROWS)                    // floats of a depth tap's weights
#define CHUNKS (ROW / 16)
#define OCS (NP + 4)
#define OC_RUN 8
#define PARTIALS (SPLIT == 2)
#define UNITS (2 * HH * XW)
// The 16-byte chunk c of row r as the swizzle mode stores it.
#define SWIZZLE(c, r) ((c) ^ (ROW == 128 ? ((r) & 7) : (((r) >> 1) & 3)))

__device__ __forceinline__ unsigned long long desc_of(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(8 * ROW >> 4) << 32)
           | ((ROW == 128 ? 1ull : 2ull) << 62);
}

__device__ __forceinline__ void wgmma_ss(float* d, unsigned long long desc_a, unsigned long long desc_b,
                                         int accumulate = 1) {
    WGMMA_SS
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
turned(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
       const float* __restrict__ block_max, const float* __restrict__ w_inverse, float* __restrict__ y,
       int XD, int XH, int QD, int QH, int QW, int qh_blocks, int max_blocks, int off_d, int off_h,
       int td0, int th0, int tw0, int tds, int ths, int tws, int KHF, int KWF,
       long long syn, long long syc, long long syd, long long syh, long long syw)
{
    extern __shared__ __align__(1024) float4 smem4[];
    float* weights = (float*)smem4;                              // [WBUF][TAPS9][C_OUT][ROW / 4], swizzled
    unsigned* plane = (unsigned*)(weights + WBUF * W_KD);        // [PLANE_POS][ROW / 4 words], swizzled
    float* staging = (float*)(plane + PLANE_POS * (ROW / 4));    // PREFETCH: the next plane as it is, [HH * XW][C_IN]
    const int tid = threadIdx.x % THREADS, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    int tile = blockIdx.x;
    const int qh0 = (tile % qh_blocks) * R; tile /= qh_blocks;
    const int qd = tile % QD, n = tile / QD;
    const long long first_row = ((long long)n * XD + qd + off_d) * XH + qh0 + off_h;
    const float* plane0 = x + first_row * XW * C_IN;
    #define W_TAP(tap) ((long long)(((td0 + ((tap) / (KH * KW)) * tds) * KHF + th0 + ((tap) / KW % KH) * ths) * KWF \
                                    + tw0 + ((tap) % KW) * tws) * C_OUT * 32)
    // Depth tap kd's weights into buffer kd % WBUF: each row's first ROW bytes (FP16 with 64: the hi halves).
    auto copy_weights = [&](int kd) {
        float* dst = weights + (kd % WBUF) * W_KD;
        #pragma unroll 1
        for (int tap9 = 0; tap9 < TAPS9; tap9++) {
            const float* src = w + W_TAP(kd * TAPS9 + tap9);
            #pragma unroll
            for (int e = tid; e < C_OUT * CHUNKS; e += THREADS) {
                const int oc = e / CHUNKS, c = e % CHUNKS;
                cp_async16(dst + tap9 * W_ROWS + oc * (ROW / 4) + (SWIZZLE(c, oc) << 2), src + oc * 32 + c * 4);
            }
        }
        cp_commit();
    };
    for (int e = HH * XW * (ROW / 4) + tid; e < PLANE_POS * (ROW / 4); e += THREADS) plane[e] = 0u;

    float d[NP / 2];
    float partial[PARTIALS ? NP / 2 : 1];
    #pragma unroll
    for (int k = 0; k < NP / 2; k++) {
        d[k] = 0.f;
        if (PARTIALS) partial[PARTIALS ? k : 0] = 0.f;
    }
    float a_scale = 1.f, a_inverse = 1.f, partial_inverse = 0.f;
    auto add_partial = [&]() {
        #pragma unroll
        for (int k = 0; k < NP / 2; k++) d[k] += partial[PARTIALS ? k : 0] * partial_inverse;
    };
    if (SPLIT == 3) {
        float amax = 0.f;
        for (int kd = 0; kd < KD; kd++)
            amax = fmaxf(amax, plane_max(block_max, first_row + (long long)kd * XH, max_blocks, lane));
        a_scale = pow2_scale(amax, a_inverse);
    }
    const unsigned weights_addr = smem_addr(weights), plane_addr = smem_addr((float*)plane);
    // PREFETCH: depth tap kd's plane copied into staging during kd - 1's MMAs, split from there.
    auto copy_plane = [&](int kd) {
        const float* src = plane0 + (long long)kd * XH * XW * C_IN;
        #pragma unroll 4
        for (int e = tid; e < HH * XW * C_IN / 4; e += THREADS) cp_async16(staging + e * 4, src + e * 4);
        cp_commit();
    };
    if (PREFETCH) copy_plane(0);
    copy_weights(0);

    #pragma unroll 1
    for (int kd = 0; kd < KD; kd++) {
        if (kd > 0) {
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            __syncthreads();  // every MMA reading the plane and the weights of kd - 1 is done
            if (WBUF == 1) copy_weights(kd);
        }
        if (WBUF == 2 && kd + 1 < KD) copy_weights(kd + 1);  // into the buffer kd - 1's MMAs read
        if (SPLIT == 2)
            a_scale = pow2_scale(plane_max(block_max, first_row + (long long)kd * XH, max_blocks, lane), a_inverse);
        const float4* src = (const float4*)(plane0 + (long long)kd * XH * XW * C_IN);
        if (PREFETCH) {
            cp_wait<1>();  // the plane (the weights' copies, committed after it, may still run)
            __syncthreads();
            src = (const float4*)staging;
        }
        #pragma unroll
        for (int base = 0; base < UNITS; base += 2 * THREADS) {
            float4 v[2][4];
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const int u = base + h * THREADS + tid;
                #pragma unroll
                for (int q = 0; q < 4; q++) v[h][q] = u < UNITS ? src[u * 4 + q] : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const int u = base + h * THREADS + tid;
                if (u >= UNITS) continue;
                const int p = u / 2, c16 = u % 2;
                float f[16];
                #pragma unroll
                for (int q = 0; q < 4; q++)
                    f[4 * q] = v[h][q].x, f[4 * q + 1] = v[h][q].y, f[4 * q + 2] = v[h][q].z, f[4 * q + 3] = v[h][q].w;
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
                    row[SWIZZLE(4 + 2 * c16 + 1, p)] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
                }
            }
        }
        if (PREFETCH && kd + 1 < KD) {
            __syncthreads();  // staging read
            copy_plane(kd + 1);
        }
        if ((WBUF == 2 || PREFETCH) && kd + 1 < KD) cp_wait<1>(); else cp_wait<0>();  // kd's weights
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        const unsigned w_kd = weights_addr + 4 * (kd % WBUF) * W_KD;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        #pragma unroll
        for (int tap9 = 0; tap9 < TAPS9; tap9++) {
            const int kh = tap9 / KW, kw = tap9 % KW;
            const unsigned a_at = w_kd + 4 * tap9 * W_ROWS, b_at = plane_addr + (kh * XW + kw) * ROW;
            #pragma unroll
            for (int ks = 0; ks < 2; ks++) {
                const int gstep = tap9 * 2 + ks;
                if (PARTIALS && gstep % PROMOTE == 0) {
                    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                    add_partial();
                    partial_inverse = a_inverse;
                    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
                }
                const unsigned long long a_hi = desc_of(a_at + 32 * ks), b_hi = desc_of(b_at + 32 * ks);
                if (!PARTIALS) {
                    wgmma_ss(d, a_hi, b_hi);
                } else {
                    const unsigned long long a_lo = desc_of(a_at + 64 + 32 * ks), b_lo = desc_of(b_at + 64 + 32 * ks);
                    wgmma_ss(partial, a_hi, b_hi, gstep % PROMOTE != 0);
                    wgmma_ss(partial, a_lo, b_hi);
                    wgmma_ss(partial, a_hi, b_lo);
                }
            }
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    if (PARTIALS) add_partial();
    __syncthreads();

    float* staged = (float*)smem4;  // [C_OUT][OCS]
    #pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int o = 16 * warp + g + 8 * hf;
        const float b = HAS_BIAS ? bias[o] : 0.f;
        const float s = w_inverse[o] * (SPLIT == 3 ? a_inverse : 1.f);
        #pragma unroll
        for (int j = 0; j < NP / 8; j++) {
            staged[o * OCS + 8 * j + 2 * t] = d[4 * j + 2 * hf] * s + b;
            staged[o * OCS + 8 * j + 2 * t + 1] = d[4 * j + 2 * hf + 1] * s + b;
        }
    }
    __syncthreads();
    float* y_tile = y + n * syn + qd * syd + (long long)lane * syw;
    #pragma unroll 1
    for (int job = warp; job < R * (C_OUT / OC_RUN); job += THREADS / 32) {
        const int r = job % R, oc0 = job / R * OC_RUN, qh = qh0 + r;
        if (qh >= QH) continue;
        const float* from = staged + oc0 * OCS + r * XW + lane;
        float v[OC_RUN];
        #pragma unroll
        for (int k = 0; k < OC_RUN; k++) v[k] = from[k * OCS];
        float* out = y_tile + (long long)oc0 * syc + (long long)qh * syh;
        #pragma unroll
        for (int k = 0; k < OC_RUN; k++)
            if (lane < QW) out[k * syc] = v[k];
    }
}
"""


def source_kd(rows: int, xw: int, split: int, has_bias: bool, wbuf: int, row_bytes: int, promote: int,
              min_blocks: int, prefetch: int = 0) -> str:
    defines = dict(C_IN=32, C_OUT=64, KD=3, KH=3, KW=3, R=rows, HH=rows + 2, XW=xw, SPLIT=split,
                   HAS_BIAS=int(has_bias), PROMOTE=promote, THREADS=THREADS, WBUF=wbuf, ROW=row_bytes,
                   MIN_BLOCKS=min_blocks, PREFETCH=prefetch)
    head = "".join(f"#define {name} {value}\n" for name, value in defines.items())
    return head + phase_conv.WGMMA_HELPERS.replace("WGMMA_ASM", "") + HELPERS + SOURCE_KD.replace(
        "WGMMA_SS", wgmma_ss_asm(positions(rows, xw)))


def shared_bytes_kd(rows: int, xw: int, wbuf: int, row_bytes: int, prefetch: int = 0) -> int:
    plane_pos = -(-(positions(rows, xw) + 2 * xw + 2) // 8) * 8
    staging = 4 * (rows + 2) * xw * 32 if prefetch else 0
    return max(wbuf * 9 * 64 * row_bytes + row_bytes * plane_pos + staging, 4 * 64 * (positions(rows, xw) + 4))

def wgmma_ss_asm(n: int) -> str:
    """wgmma m64n{n}k16 FP16 -> float32 with both operands K-major in shared memory, accumulating into d."""
    regs = n // 2
    acc = ", ".join(f"%{k}" for k in range(regs))
    outs = ", ".join(f'"+f"(d[{k}])' for k in range(regs))
    return (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n'
            f'wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16 {{{acc}}}, %{regs}, %{regs + 1}, p, 1, 1, 0, 0;'
            f'\\n}}\\n" : {outs} : "l"(desc_a), "l"(desc_b), "r"(accumulate));')


def source(rows: int, xw: int, split: int, has_bias: bool, stages: int = 4, what_if: int = 0) -> str:
    # HH: the window rows a depth tap's plane holds.
    defines = dict(C_IN=32, C_OUT=64, KD=3, KH=3, KW=3, R=rows, HH=rows + 2, XW=xw, SPLIT=split,
                   HAS_BIAS=int(has_bias), PROMOTE=phase_conv.PROMOTE, THREADS=THREADS, STAGES=stages,
                   AHEAD=stages - 2, WHAT_IF=what_if)
    head = "".join(f"#define {name} {value}\n" for name, value in defines.items())
    return head + phase_conv.WGMMA_HELPERS.replace("WGMMA_ASM", "") + HELPERS + SOURCE.replace(
        "WGMMA_SS", wgmma_ss_asm(positions(rows, xw)))


def positions(rows: int, xw: int) -> int:
    return -(-rows * xw // 8) * 8


def shared_bytes(rows: int, xw: int, stages: int = 4) -> int:
    plane_pos = -(-(positions(rows, xw) + 2 * xw + 2) // 8) * 8
    return max(stages * 4 * 64 * 32 + 128 * plane_pos, 4 * 64 * (positions(rows, xw) + 4))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rows", default="4,6", help="tile rows R to try in FP16 (3xFP16: 4; N = R x XW, to a "
                        "multiple of 8, at most 256)")
    parser.add_argument("--what-if", action="store_true",
                        help="also time each config with its planes after the first not loaded, and with no output "
                        "written (results wrong: what the rest costs)")
    parser.add_argument("--kd-fp16", default="4:1:64:2:3:0,4:1:64:2:3:1",
                        help="the depth-tap kernel's configs in FP16, R:WBUF:ROW:PROMOTE:programs per SM:PREFETCH, "
                        "','-separated")
    parser.add_argument("--kd-3xfp16", default="4:1:128:6:2:0",
                        help="the same in 3xFP16")
    parser.add_argument("--stages", default="4,8", help="weight ring stages to try (copies run stages - 2 taps ahead)")
    args = parser.parse_args()
    torch.manual_seed(0)
    w = torch.randn(32, 64, 3, 3, 3, device="cuda") * 0.02
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    plan = make_plan(tuple(x.shape), tuple(w.shape), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
    phase_list = tuple(p for _, p in _regions(plan, True) if p is not None)
    out_shape = plan.output_shape
    rows_out = []

    def row(mode, what, fn, check=""):
        t = time_cuda(fn, iters=args.iters)
        rows_out.append((mode, what, f"{t.mean_ms:.4f}", f"{t.min_ms:.4f}", check))
        print(rows_out[-1], flush=True)

    for mode, split in (("FP16", 3), ("3xFP16", 2)):
        torch.backends.cudnn.allow_tf32 = split == 3
        reference = F.conv_transpose3d(x.double(), w.double(), None, **P77)
        eager = F.conv_transpose3d(x, w, None, **P77)
        compact_reference = reference[:, :, 1::2, 1::2, 1::2]
        start, extent, launches = cuda_phases._forward_geometry(plan, phase_list, split)
        counts, dilation, grid, ((phases, offsets, firsts, steps),) = launches[0]
        tile_rows = [int(r) for r in args.rows.split(",")] if split == 3 else [4]
        # The window's rows: as many as every tile of every R reads (the library's correlation reads fewer).
        qd, qh, qw = grid
        extent = (extent[0], max(extent[1], *(offsets[1] + -(-qh // r) * r + 2 for r in tile_rows)), extent[2])
        out = torch.empty(out_shape, device="cuda")
        lattice_offset, _, lattice_strides = _lattice_geometry(plan, phases, out.stride())
        window, taps, scales = correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False, split=split)
        block_max, _, w_inverse = scales
        n, xd, xh, xw, _ = window.shape
        print(mode, "window", tuple(window.shape), "offsets", offsets, "firsts", firsts, "steps", steps,
              "block_max", tuple(block_max.shape), flush=True)
        assert offsets[2] == 0 and counts == (3, 3, 3) and dilation == (1, 1, 1)

        def library(y, offset, strides):
            cuda.correlate(window, taps, None, y, offset, strides, grid, offsets, counts, firsts, steps, dilation,
                           scales, split)

        compact = torch.empty((n, 64, qd, qh, qw), device="cuda")
        library(compact, 0, compact.stride())
        expected = compact.clone()
        row(mode, "library correlation, compact", lambda: library(compact, 0, compact.stride()),
            f"{relative_error(expected, compact_reference):.2e}")
        row(mode, "library correlation into the lattice",
            lambda: library(out, lattice_offset, lattice_strides))

        def library_forward():
            y = torch.empty(out_shape, device="cuda")
            y.zero_()
            window, taps, scales = correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False,
                                                        split=split)
            cuda.correlate(window, taps, None, y, lattice_offset, lattice_strides, grid, offsets, counts, firsts,
                           steps, dilation, scales, split)
            return y

        configs = [(f"ring R={rows} S={stages}", rows,
                    lambda what_if, rows=rows, stages=stages: cuda._Kernel(
                        source(rows, xw, split, False, stages, what_if), "turned", shared_bytes(rows, xw, stages),
                        THREADS))
                   for rows in tile_rows for stages in (int(s) for s in args.stages.split(","))]
        for text in (args.kd_fp16 if split == 3 else args.kd_3xfp16).split(","):
            rows, wbuf, row_bytes, promote, min_blocks, prefetch = (int(v) for v in text.split(":"))
            configs.append((f"depth taps R={rows} WBUF={wbuf} ROW={row_bytes}" + (f" PROMOTE={promote}" if split == 2
                                                                                  else "")
                            + (" PREFETCH" if prefetch else "") + f" ({min_blocks}/SM)",
                            rows, lambda what_if, a=(rows, xw, split, False, wbuf, row_bytes, promote, min_blocks,
                                                     prefetch):
                            cuda._Kernel(source_kd(*a), "turned", shared_bytes_kd(*a[:2], *a[4:6], a[8]), THREADS)))
        for label, rows, make in configs:
            kernel = make(0)
            qh_blocks = -(-qh // rows)
            ints = (xd, xh, qd, qh, qw, qh_blocks, block_max.shape[-1], offsets[0], offsets[1], *firsts, *steps,
                    3, 3)

            def turned(y, offset, strides, operands=(window, taps, scales), kernel=kernel, ints=ints,
                       qh_blocks=qh_blocks):
                window, taps, (block_max, _, w_inverse) = operands
                kernel.launch(n * qd * qh_blocks, (window.data_ptr(), taps.data_ptr(), 0, block_max.data_ptr(),
                                                   w_inverse.data_ptr(), y.data_ptr() + 4 * offset),
                              ints, tuple(strides), _current_stream(0))

            compact.fill_(float("nan"))
            turned(compact, 0, compact.stride())
            torch.cuda.synchronize()
            diff = (compact - expected).abs().max().item()
            check = (f"max |turned - library| {diff:.2e}, {relative_error(compact, compact_reference):.2e} off "
                     f"float64, NaN {bool(compact.isnan().any())}")
            print(check, flush=True)
            row(mode, f"{label}, compact", lambda: turned(compact, 0, compact.stride()), check)
            row(mode, f"{label} into the lattice", lambda: turned(out, lattice_offset, lattice_strides))
            for what_if, what in ((1, "one plane load"), (2, "no output")) if args.what_if and "ring" in label else ():
                variant = make(what_if)
                row(mode, f"what-if: {label}, compact, {what}",
                    lambda: turned(compact, 0, compact.stride(), kernel=variant))

            def turned_forward(turned=turned):
                y = torch.empty(out_shape, device="cuda")
                y.zero_()
                operands = correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False, split=split)
                turned(y, lattice_offset, lattice_strides, operands)
                return y

            for round_ in range(args.rounds):
                for name, forward in (("library", lambda: convt3d.conv_transpose3d(x, w, None, backend="torch",
                                                                                   **P77)),
                                      ("zero_, pass, library correlation", library_forward),
                                      (f"zero_, pass, {label}", turned_forward)):
                    torch.cuda.empty_cache()
                    poisoned = torch.full(out_shape, float("nan"), device="cuda")
                    del poisoned
                    result = forward()
                    torch.cuda.synchronize()
                    check = (f"{relative_error(result, reference):.2e} off float64, KB check "
                             f"{kernelbench_check(result, eager)}")
                    del result
                    row(mode, f"forward: {name} (round {round_ + 1})", forward, check)
        del reference, eager, compact_reference, expected
        torch.cuda.empty_cache()
    torch.backends.cudnn.allow_tf32 = True
    print(markdown_table(["mode", "what", "mean ms", "min ms", "check"], rows_out))


if __name__ == "__main__":
    main()
