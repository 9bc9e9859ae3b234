"""Experiment: problem 77's compact phase convolution, and its whole forward, as CUDA C++ kernels compiled at run
time by NVRTC (torch.cuda._compile_kernel, in torch 2.11 and later), with the input tile and its halo staged once in
shared memory and read there by every tap.

Plain Triton reloads each tap's input tile from L2 (diag_conv_l1.py); Gluon (Triton 3.6) can slice shared memory
only at offsets that are multiples of the slice's length, not at a tap's row offset. Here a program owns BH rows x
32 columns of one output depth plane and all C_OUT channels; each warp owns RW rows. Per depth tap it copies the
window plane its positions read (BH + KH - 1 rows of BW + KW - 1 channel rows; the window is the input zero-padded,
channels-last and TF32-rounded, made beforehand) into shared memory, and streams each tap's weight [C_OUT, C_IN]
through a three-stage ring two taps ahead (16-byte cp.async). The MMAs are mma.sync m16n8k8 TF32 whose fragments
come from ldmatrix at the tap's offset (rows padded to C_IN + 4 floats: no bank conflicts, every address a per-lane
base plus a compile-time offset).

- phase_conv stores the compact result through any strides (compact, or the output's lattice).
- the wgmma version (sm_90a: A fragments from registers as above, the weight read by the tensor cores from a
  128-byte-swizzled stage through a descriptor), first written here as phase_conv_wgmma, is now the library's
  (src/convt3d/backends/cuda/phase_conv.py), and this script times that one.
- fused_forward writes problem 77's whole output (stride 2, one reached phase): after its tile it writes every
  element of its band of output planes and rows once, the zero planes with 16-byte stores, the lattice plane row by
  row from the tile staged in shared memory.

    python3 benchmarks/diag_conv_cuda.py [--fused | --profile]    (--profile: one launch of each phase kernel, for ncu)

Figures: benchmarks/RESULTS.md, eleventh session.
"""

import sys

import torch

PRELUDE = r"""
#define C_IN {c_in}
#define C_OUT {c_out}
#define KD {kd}
#define KH {kh}
#define KW {kw}
#define BH {bh}
#define RW {rows_per_warp}
#define BW 32
#define HH (BH + KH - 1)
#define HW (BW + KW - 1)
#define PLANE (HH * HW)
#define TAPS (KD * KH * KW)
#define THREADS (BH / RW * 32)
#define MI (RW * BW / 16)
#define NJ (C_OUT / 8)
#define KS (C_IN / 8)
#define CPA (C_IN + 4)
#define STAGES 3

__device__ __forceinline__ unsigned smem_addr(const float* p) {{ return (unsigned)__cvta_generic_to_shared(p); }}

// Four 8 x (4 floats) matrices, one row address per lane: lane l gets element (l / 4, l % 4) of each, i.e. the A
// fragment of mma m16n8k8 TF32 (or two B fragments) when the lanes address the rows accordingly.
__device__ __forceinline__ void ldmatrix4(unsigned* r, unsigned addr) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0,%1,%2,%3}}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}}
__device__ __forceinline__ void cp_async16(float* dst, const float* src) {{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(smem_addr(dst)), "l"(src));
}}
__device__ __forceinline__ void cp_commit() {{ asm volatile("cp.async.commit_group;\n" ::); }}
template <int N> __device__ __forceinline__ void cp_wait() {{ asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }}
__device__ __forceinline__ void mma_tf32(float* c, const unsigned* a, unsigned b0, unsigned b1) {{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, "
        "{{%0,%1,%2,%3}};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}}

// The window plane one depth tap reads for a tile: HH rows of HW channel rows, each contiguous in the window.
// Warps take rows, lanes the row's 16-byte chunks.
#define ROW_CHUNKS (HW * C_IN / 4)
__device__ __forceinline__ void copy_plane(float* buf, const float* plane, int XW, int warp, int lane) {{
    for (int r = warp; r < HH; r += THREADS / 32) {{
        const float* src = plane + (long long)r * XW * C_IN + lane * 4;
        float* dst = buf + (r * HW + lane / (C_IN / 4)) * CPA + (lane % (C_IN / 4)) * 4;
        #pragma unroll
        for (int m = 0; m < (ROW_CHUNKS + 31) / 32; m++)
            if (m * 32 + lane < ROW_CHUNKS) cp_async16(dst + m * (32 / (C_IN / 4)) * CPA, src + m * 128);
    }}
}}
__device__ __forceinline__ void copy_weight(float* stage, const float* w, int tap, int tid) {{
    const float* src = w + (long long)tap * C_OUT * C_IN;
    #pragma unroll
    for (int e = tid; e < C_OUT * C_IN / 4; e += THREADS)
        cp_async16(stage + (e / (C_IN / 4)) * CPA + (e % (C_IN / 4)) * 4, src + e * 4);
}}

// acc (MI x NJ fragments: the warp's RW rows x BW columns x C_OUT channels) = the correlation over every tap of the
// window from plane0 (the tile's first plane: depth qd, row qh0, column qw0) with w (TAPS, C_OUT, C_IN).
__device__ __forceinline__ void conv_tile(float (&acc)[MI][NJ][4], const float* plane0, const float* w, int XH,
                                          int XW, float* smem, int tid) {{
    float* halo = smem;                 // [PLANE][CPA]
    float* ring = smem + PLANE * CPA;   // [STAGES][C_OUT][CPA]
    const int lane = tid & 31, warp = tid >> 5;
    copy_weight(ring, w, 0, tid);
    cp_commit();
    copy_weight(ring + C_OUT * CPA, w, 1, tid);
    cp_commit();
    copy_plane(halo, plane0, XW, warp, lane);
    cp_commit();

    // ldmatrix row addresses. A (one m16 tile, one k-step): lanes 0-7 rows 0-7, 8-15 rows 8-15, channels k..k+3,
    // lanes 16-31 the same rows, channels k+4..k+7. B (two n8 tiles): lanes 0-7 / 16-23 output channels 0-7 of
    // the first / second tile, channels k..k+3; lanes 8-15 / 24-31 the same, channels k+4..k+7.
    const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1), a_k = 4 * (lane >> 4);
    const unsigned a_lane = smem_addr(halo + (warp * RW * HW + a_row) * CPA + a_k);
    const unsigned w_lane = smem_addr(ring + ((lane & 7) + 8 * (lane >> 4)) * CPA + 4 * ((lane >> 3) & 1));
    #pragma unroll
    for (int i = 0; i < MI; i++)
        #pragma unroll
        for (int j = 0; j < NJ; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

    #pragma unroll 1
    for (int kd = 0; kd < KD; kd++) {{
        if (kd > 0) {{
            __syncthreads();  // every warp is done with the previous plane
            copy_plane(halo, plane0 + (long long)kd * XH * XW * C_IN, XW, warp, lane);
            cp_commit();
        }}
        #pragma unroll
        for (int kh = 0; kh < KH; kh++)
            #pragma unroll
            for (int kw = 0; kw < KW; kw++) {{
                const int tap = (kd * KH + kh) * KW + kw;
                if (kh == 0 && kw == 0) cp_wait<0>(); else cp_wait<1>();
                __syncthreads();  // this tap's weight (and plane) landed; every warp is done with tap - 1's stage
                if (tap + 2 < TAPS) copy_weight(ring + ((tap + 2) % STAGES) * C_OUT * CPA, w, tap + 2, tid);
                cp_commit();
                const unsigned w_tap = w_lane + 4 * (tap % STAGES) * C_OUT * CPA;
                #pragma unroll
                for (int ks = 0; ks < KS; ks++) {{
                    unsigned a[MI][4], b[NJ][2];
                    #pragma unroll
                    for (int i = 0; i < MI; i++)
                        ldmatrix4(a[i], a_lane + 4 * (((i / (BW / 16) + kh) * HW + (i % (BW / 16)) * 16 + kw) * CPA
                                                      + 8 * ks));
                    #pragma unroll
                    for (int j = 0; j < NJ; j += 2) ldmatrix4(b[j], w_tap + 4 * (j * 8 * CPA + 8 * ks));
                    #pragma unroll
                    for (int j = 0; j < NJ; j++)
                        #pragma unroll
                        for (int i = 0; i < MI; i++) mma_tf32(acc[i][j], a[i], b[j][0], b[j][1]);
                }}
            }}
    }}
    cp_wait<0>();
    __syncthreads();  // shared memory free for the caller
}}
"""

PHASE_CONV = PRELUDE + r"""
extern "C" __global__ void __launch_bounds__(THREADS, 2)
phase_conv(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
           int XD, int XH, int XW, int QD, int QH, int QW,
           int syn, int syc, int syd, int syh, int syw, int qh_blocks, int qw_blocks)
{{
    // x: the window (N, XD, XH, XW, C_IN), channels-last, zero-padded so that every tile's reads lie inside it,
    // TF32-rounded; w: (TAPS, C_OUT, C_IN), TF32-rounded, taps in the correlation's order.
    // y[n, oc, qd, qh, qw] = sum x[n, qd + kd, qh + kh, qw + kw, ic] * w[tap, oc, ic], y through its strides.
    extern __shared__ float4 smem4[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    int tile = blockIdx.x;
    const int qw0 = (tile % qw_blocks) * BW; tile /= qw_blocks;
    const int qh0 = (tile % qh_blocks) * BH; tile /= qh_blocks;
    const int qd = tile % QD, n = tile / QD;
    float acc[MI][NJ][4];
    conv_tile(acc, x + (((long long)n * XD + qd) * XH + qh0) * XW * C_IN + qw0 * C_IN, w, XH, XW, (float*)smem4, tid);
    #pragma unroll
    for (int i = 0; i < MI; i++) {{
        const int qh = qh0 + warp * RW + i / (BW / 16);
        float* yb = y + (long long)n * syn + (long long)qd * syd + (long long)qh * syh;
        #pragma unroll
        for (int hf = 0; hf < 2; hf++) {{
            const int qw = qw0 + (i % (BW / 16)) * 16 + g + 8 * hf;
            if (qh < QH && qw < QW) {{
                #pragma unroll
                for (int j = 0; j < NJ; j++) {{
                    const long long oc = j * 8 + 2 * t;
                    yb[oc * syc + (long long)qw * syw] = acc[i][j][2 * hf];
                    yb[(oc + 1) * syc + (long long)qw * syw] = acc[i][j][2 * hf + 1];
                }}
            }}
        }}
    }}
}}
"""

FUSED_FORWARD = PRELUDE + r"""
#define OCS (BH * BW + 4)
#define LATTICE_ROWS_ONLY {lattice_rows_only}

// Zeros (or the bias) into n floats from dst, 16-byte stores where aligned; lanes of one warp share the run.
__device__ __forceinline__ void fill_run(float* dst, long long n, float v, int lane) {{
    long long head = (4 - (((unsigned long long)dst >> 2) & 3)) & 3;
    if (head > n) head = n;
    if (lane < head) dst[lane] = v;
    float4* body = (float4*)(dst + head);
    long long chunks = (n - head) >> 2;
    float4 v4 = make_float4(v, v, v, v);
    for (long long c = lane; c < chunks; c += 32) body[c] = v4;
    long long done = head + chunks * 4;
    if (lane < n - done) dst[done + lane] = v;
}}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
fused_forward(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
              float* __restrict__ y, int XD, int XH, int XW, int QD, int QH, int QW, int OD, int OH, int OW,
              int LD, int LH, int LW, int qh_blocks)
{{
    // conv_transpose3d with stride 2 along every axis and one reached phase: y (N, C_OUT, OD, OH, OW), contiguous,
    // holds at (2qd + LD, 2qh + LH, 2qw + LW) the phase's correlation of the window x (as in phase_conv) plus the
    // bias, and the bias everywhere else. A program computes BH x QW (QW <= BW) phase positions of one qd, then
    // writes its band: the output planes from its lattice plane up to the next program's, and in each the rows
    // from its first lattice row up to the next block's, whole rows, every element once.
    extern __shared__ float4 smem4[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    int tile = blockIdx.x;
    const int qh0 = (tile % qh_blocks) * BH; tile /= qh_blocks;
    const int qd = tile % QD, n = tile / QD;
    float acc[MI][NJ][4];
    conv_tile(acc, x + (((long long)n * XD + qd) * XH + qh0) * XW * C_IN, w, XH, XW, (float*)smem4, tid);

    // The tile staged as [oc][row][qw], channel rows OCS apart (the fragment stores of a warp hit 32 banks).
    float* S = (float*)smem4;
    #pragma unroll
    for (int i = 0; i < MI; i++)
        #pragma unroll
        for (int hf = 0; hf < 2; hf++) {{
            const int pos = (warp * RW + i / (BW / 16)) * BW + (i % (BW / 16)) * 16 + g + 8 * hf;
            #pragma unroll
            for (int j = 0; j < NJ; j++) {{
                S[(j * 8 + 2 * t) * OCS + pos] = acc[i][j][2 * hf];
                S[(j * 8 + 2 * t + 1) * OCS + pos] = acc[i][j][2 * hf + 1];
            }}
        }}
    __syncthreads();

    const int lat_d = 2 * qd + LD;
    const int p0 = qd == 0 ? 0 : lat_d, p1 = qd == QD - 1 ? OD : lat_d + 2;
    const int r0 = qh0 == 0 ? 0 : 2 * qh0 + LH, r1 = qh0 + BH >= QH ? OH : 2 * (qh0 + BH) + LH;
    const int rows = r1 - r0;
    // The other planes of the band: whole runs of rows, a warp per (channel, plane). With LATTICE_ROWS_ONLY only
    // the lattice rows (whole, zeros between the values) are written: the rest is another kernel's.
    for (int job = warp; !LATTICE_ROWS_ONLY && job < C_OUT * (p1 - p0); job += THREADS / 32) {{
        const int oc = job / (p1 - p0), od = p0 + job % (p1 - p0);
        if (od != lat_d)
            fill_run(y + ((((long long)n * C_OUT + oc) * OD + od) * OH + r0) * OW, (long long)rows * OW, bias[oc],
                     lane);
    }}
    // The lattice plane, a warp per row: lane l writes columns l, l + 32, ...
    for (int job = warp; job < C_OUT * rows; job += THREADS / 32) {{
        const int oc = job / rows, oh = r0 + job % rows;
        const float v = bias[oc];
        float* dst = y + ((((long long)n * C_OUT + oc) * OD + lat_d) * OH + oh) * OW;
        const int qh = (oh - LH) >> 1;
        const bool lat_row = ((oh - LH) & 1) == 0 && oh >= LH && qh < QH;
        if (LATTICE_ROWS_ONLY && !lat_row) continue;
        const float* src = S + oc * OCS + (qh - qh0) * BW;
        for (int ow = lane; ow < OW; ow += 32) {{
            const int qw = (ow - LW) >> 1;
            dst[ow] = lat_row && ((ow - LW) & 1) == 0 && ow >= LW && qw < QW ? src[qw] + v : v;
        }}
    }}
}}
"""


def _compile(source, name, c_in, c_out, bh, rows_per_warp, taps=(3, 3, 3), extra_floats=0, **defines):
    source = source.format(c_in=c_in, c_out=c_out, kd=taps[0], kh=taps[1], kw=taps[2], bh=bh,
                           rows_per_warp=rows_per_warp, **defines)
    kernel = torch.cuda._compile_kernel(source, name)
    plane = (bh + taps[1] - 1) * (32 + taps[2] - 1)
    smem = 4 * max((plane + 3 * c_out) * (c_in + 4), extra_floats)
    kernel.set_shared_memory_config(smem)
    return kernel, smem


def compile_phase_conv(c_in, c_out, bh=8, rows_per_warp=2):
    return _compile(PHASE_CONV, "phase_conv", c_in, c_out, bh, rows_per_warp)


def compile_fused(c_in, c_out, bh=8, rows_per_warp=2, lattice_rows_only=False):
    return _compile(FUSED_FORWARD, "fused_forward", c_in, c_out, bh, rows_per_warp, extra_floats=c_out * (bh * 32 + 4),
                    lattice_rows_only=int(lattice_rows_only))


def launch_phase_conv(kernel, smem, x_win, w_taps, y, bh=8, rows_per_warp=2):
    n, c_out, qd, qh, qw = y.shape
    _, d, h, w, c_in = x_win.shape
    qh_blocks, qw_blocks = -(-qh // bh), -(-qw // 32)
    kernel(grid=(n * qd * qh_blocks * qw_blocks, 1, 1), block=(bh // rows_per_warp * 32, 1, 1),
           args=[x_win, w_taps, y, d, h, w, qd, qh, qw, *y.stride(), qh_blocks, qw_blocks], shared_mem=smem)


def launch_fused(kernel, smem, x_win, w_taps, bias, y, q_shape, lattice_offsets, bh=8, rows_per_warp=2):
    n, c_out, od, oh, ow = y.shape
    _, xd, xh, xw, c_in = x_win.shape
    qd, qh, qw = q_shape
    assert qw <= 32 and y.is_contiguous()
    qh_blocks = -(-qh // bh)
    kernel(grid=(n * qd * qh_blocks, 1, 1), block=(bh // rows_per_warp * 32, 1, 1),
           args=[x_win, w_taps, bias, y, xd, xh, xw, qd, qh, qw, od, oh, ow, *lattice_offsets, qh_blocks],
           shared_mem=smem)


def round_tf32(t):
    return ((t.view(torch.int32) + 0x1000) & -8192).view(torch.float32)


def time_ms(fn, iters=50):
    """Mean of CUDA events around fn after an L2 flush; includes the host's launch time (ctypes, for these)."""
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        flush.fill_(1)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sum(times) / len(times)


def print_table(header, rows):
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for row in rows:
        print("| " + " | ".join(f"{v:.4f}" if isinstance(v, float) and v > 1e-3 else
                                (f"{v:.1e}" if isinstance(v, float) else str(v)) for v in row) + " |")


def phase_convolutions():
    """The compact convolutions of problem 77's forward (32 -> 64) and grad_input (64 -> 32), against cuDNN."""
    f = torch.nn.functional
    torch.manual_seed(0)
    rows = []
    for c_in, c_out in ((32, 64), (64, 32)):
        x = torch.rand(16, c_in, 16, 32, 32, device="cuda")
        w = torch.rand(c_out, c_in, 3, 3, 3, device="cuda") - 0.5  # conv3d weight
        ref = f.conv3d(x.double(), w.double(), padding=1)
        err = lambda y: ((y.double() - ref).norm() / ref.norm()).item()
        x_cl, w_cl = x.to(memory_format=torch.channels_last_3d), w.to(memory_format=torch.channels_last_3d)
        rows.append(((c_in, c_out), "cuDNN conv3d NCDHW", time_ms(lambda: f.conv3d(x, w, padding=1)),
                     err(f.conv3d(x, w, padding=1))))
        rows.append(((c_in, c_out), "cuDNN conv3d channels-last", time_ms(lambda: f.conv3d(x_cl, w_cl, padding=1)),
                     err(f.conv3d(x_cl, w_cl, padding=1))))
        # The window: zero-padded by 1 (the taps' reach), channels-last, TF32-rounded.
        window = lambda: round_tf32(f.pad(x, (1, 1) * 3).permute(0, 2, 3, 4, 1).contiguous())
        x_win = window()
        w_taps = round_tf32(w.permute(2, 3, 4, 0, 1).reshape(27, c_out, c_in).contiguous())
        rows.append(((c_in, c_out), "window: pad + channels-last + round (torch)", time_ms(window), 0.0))
        for bh, rw in ((8, 2), (4, 2), (4, 1)):
            kernel, smem = compile_phase_conv(c_in, c_out, bh=bh, rows_per_warp=rw)
            run = lambda out: launch_phase_conv(kernel, smem, x_win, w_taps, out, bh=bh, rows_per_warp=rw)
            y = torch.full((16, c_out, 16, 32, 32), float("nan"), device="cuda")
            run(y)
            rows.append(((c_in, c_out), f"phase_conv BH={bh} RW={rw} ({smem} B shared)", time_ms(lambda: run(y)),
                         err(y)))
            if c_out == 64:  # into the lattice of a zero-filled output
                out = torch.zeros(16, 64, 33, 65, 65, device="cuda")
                lattice = out[:, :, 1::2, 1::2, 1::2]
                run(lattice)
                rows.append(((c_in, c_out), "  the same into the lattice", time_ms(lambda: run(lattice)),
                             err(lattice)))
            print(rows[-1], flush=True)
        y = torch.full((16, c_out, 16, 32, 32), float("nan"), device="cuda")
        run = lambda out: library_correlate(x_win, w_taps, out)
        run(y)
        rows.append(((c_in, c_out), "the library's wgmma phase correlation", time_ms(lambda: run(y)), err(y)))
        print(rows[-1], flush=True)
    print_table("| C_in, C_out | what | ms | rel. err. vs float64 |", rows)


def fused_problem77():
    """Problem 77's whole forward in one kernel (after a window pass), against eager and convt3d in the same run."""
    import convt3d
    f = torch.nn.functional
    torch.manual_seed(0)
    rows = []
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    w = torch.rand(32, 64, 3, 3, 3, device="cuda") * 2 - 1  # conv_transpose3d weight (C_in, C_out, taps)
    conv = lambda: f.conv_transpose3d(x, w, stride=2, padding=1, dilation=2)
    ref = f.conv_transpose3d(x.double(), w.double(), stride=2, padding=1, dilation=2)
    err = lambda out: ((out.double() - ref).norm() / ref.norm()).item()
    window = lambda: round_tf32(f.pad(x, (1, 1) * 3).permute(0, 2, 3, 4, 1).contiguous())
    # Within the phase (odd outputs), input i = q + 1 - t: the correlation's tap k = 2 - t over the window (pad 1).
    w_taps = round_tf32(w.flip(2, 3, 4).permute(2, 3, 4, 1, 0).reshape(27, 64, 32).contiguous())
    bias = torch.zeros(64, device="cuda")
    x_win = window()
    for bh, rw in ((8, 2), (4, 1)):
        kernel, smem = compile_fused(32, 64, bh=bh, rows_per_warp=rw)
        y = torch.full((16, 64, 33, 65, 65), float("nan"), device="cuda")
        run = lambda: launch_fused(kernel, smem, x_win, w_taps, bias, y, (16, 32, 32), (1, 1, 1), bh=bh,
                                   rows_per_warp=rw)
        run()
        torch.cuda.synchronize()
        rows.append((f"fused_forward BH={bh} RW={rw}", time_ms(run), err(y),
                     f"NaN left: {torch.isnan(y).any().item()}"))
        print(rows[-1], flush=True)
    # The zeros apart, on a second stream at the same time: the kernel writes only the lattice rows (whole rows).
    kernel, smem = compile_fused(32, 64, lattice_rows_only=True)
    y = torch.full((16, 64, 33, 65, 65), float("nan"), device="cuda")
    lattice_rows = lambda: launch_fused(kernel, smem, x_win, w_taps, bias, y, (16, 32, 32), (1, 1, 1))
    fill_rest = lambda: (y[:, :, 0::2].zero_(), y[:, :, 1::2, 0::2].zero_())
    side = torch.cuda.Stream()

    def split():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fill_rest()
        lattice_rows()
        torch.cuda.current_stream().wait_stream(side)

    split()
    torch.cuda.synchronize()
    rows.append(("fused_forward lattice rows only, the rest zeroed on a second stream", time_ms(split), err(y),
                 f"NaN left: {torch.isnan(y).any().item()}"))
    rows.append(("  its lattice rows alone", time_ms(lattice_rows), 0.0, ""))
    rows.append(("  its two strided zero_() alone", time_ms(fill_rest), 0.0, ""))
    rows.append(("  y.zero_() then the lattice rows, one stream", time_ms(lambda: (y.zero_(), lattice_rows())), 0.0,
                 ""))
    rows.append(("window pass (torch pad + permute + round)", time_ms(window), 0.0, ""))
    rows.append(("eager F.conv_transpose3d", time_ms(conv), err(conv()), ""))
    layer = lambda: convt3d.conv_transpose3d(x, w, stride=2, padding=1, dilation=2)
    rows.append(("convt3d auto", time_ms(layer), err(layer()), ""))
    out = torch.empty(16, 64, 33, 65, 65, device="cuda")
    rows.append(("out.zero_() (the floor)", time_ms(out.zero_), 0.0, ""))
    print_table("| what | ms | rel. err. vs float64 | |", rows)


def library_correlate(x_win, w_taps, y):
    """The library's wgmma phase correlation on this script's operands: the window (N, D + 2, H + 2, W + 2, C_in)
    and the weight (27, C_out, C_in) in correlation order, that is (3, 3, 3, C_out, C_in), taps ascending."""
    from convt3d.backends import cuda

    n, c_out, qd, qh, qw = y.shape
    taps = w_taps.view(3, 3, 3, c_out, -1)
    cuda.correlate(x_win, taps, None, y, 0, y.stride(), (qd, qh, qw), (0, 0, 0), (3, 3, 3), (0, 0, 0), (1, 1, 1),
                   (1, 1, 1))


def profile_once():
    """One launch of phase_conv and of the library's wgmma correlation on problem 77's forward shape, for ncu."""
    x_win = round_tf32(torch.rand(16, 18, 34, 34, 32, device="cuda"))
    w_taps = round_tf32(torch.rand(27, 64, 32, device="cuda") - 0.5)
    y = torch.empty(16, 64, 16, 32, 32, device="cuda")
    kernel, smem = compile_phase_conv(32, 64)
    launch_phase_conv(kernel, smem, x_win, w_taps, y)
    library_correlate(x_win, w_taps, y)
    torch.cuda.synchronize()


if __name__ == "__main__":
    sys.exit(profile_once() if "--profile" in sys.argv else
             fused_problem77() if "--fused" in sys.argv else phase_convolutions())
