"""Problem 77's correlation in FP16 with the weights kept and the input planes in rings: a program of two warpgroups
a multiprocessor (128 of them) copies its block's whole weight (27 taps, 110 KB of FP16 halves) into shared memory
once; each warpgroup owns an item, a sample's band of ROWS rows over half the output depths, and reads and splits each
window plane once into its ring of three, then runs a depth's 54 MMAs and writes its tile from the registers while
the other warpgroup's MMAs run.

    PYTHONPATH=src python3 benchmarks/diag_depth_ring.py [--iters 100] [--rounds 2]

Why: row_runs.py's kernel (the library's) takes 0.124 ms into the lattice (Nsight Compute, sixty-ninth session) while
its MMAs need about 0.033 ms of the tensor cores (54 m64n136k16 a program, 2,048 programs): they are busy about a
quarter of the time. Each of its programs copies the 27 taps' weights and reads and splits three input planes for one
output depth, waits for its MMAs, then stages and writes its tile; three programs a multiprocessor overlap each
other's waits only in part, and four did not help (diag_programs_per_sm.py). Here the weights are copied once a
program, each plane is split once (not three times), and one warpgroup's MMAs overlap the other's loads and writes.

One scale an item (the largest magnitude of every plane it reads, from the pass's block maxima), where the library
takes one a depth: both are powers of two, so the results differ only where a value falls into FP16's subnormal range
under one scale and not the other. The check is float64's and KernelBench's; the largest difference to the library's
output is printed.

A first form, one warpgroup with two accumulators taking turns (the next depth's MMAs issued before this depth's tile
is written), compiled with ptxas's "wgmma.mma_async instructions are serialized" (the accumulators of one warpgroup
read between a wgmma and its wait) and 196 bytes of spill: hence two warpgroups, each with one.

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call): the library's forward and the
ring's (out.zero_(), the pass, the ring's correlation), the library's correlation alone and the ring's (the operands
made before). Outputs NaN-poisoned before their first call.

Prepared in the sixty-ninth session and compiled on the project's CPU (NVRTC 12.9, ptxas for sm_90a: 255 registers,
no spill, 190 KB of shared memory); not run on the GPU, so neither its result nor its time is known.
"""

import argparse

import torch

from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.cuda import row_runs
from convt3d.backends.cuda.phase_conv import (COPY_HELPERS, FP16_HELPERS, MAX_PHASES, PHASE_FIELDS, PHASE_HELPERS,
                                              TILE_HELPERS)
from convt3d.backends.triton.launch import _current_stream
from convt3d.backends.triton.window import correlation_operands
from diag_overlap import checked
from p77_correlation import Timings, correlation_geometry, library_forward, modes, problem_77

SLOTS = 3  # planes in a warpgroup's ring: a depth's KD
DEPTH_PARTS = 2  # items a band's depths are cut into: 2 x 8 x 16 = 256 items, two warpgroups a program
THREADS = 256

RING_SOURCE = r"""
#define TAPS (KD * KH * KW)
#define PLANE_WORDS (PLANE_POS * ROW / 4)
#define GROUP 128                              // threads of a warpgroup

// The threads of warpgroup wg (barrier 1 + wg) wait for each other.
__device__ __forceinline__ void group_sync(int wg) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(1 + wg), "n"(GROUP) : "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
phase_conv_ring(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ w_lo,
                const float* __restrict__ bias, const float* __restrict__ block_max,
                const float* __restrict__ w_inverse, float* __restrict__ y, int XD, int XH, int XW_, int KHF, int KWF,
                int QD, int QH, int QW, int qh_blocks, int qw_blocks, int max_block, int max_blocks, int phase_count,
                long long syn, long long syc, long long syd, long long syh, long long syw, const Phases phases)
{
    // row_runs.py's arguments (one phase: phase_count 1; x the input, as INPUT_DIRECT's). Each warpgroup owns an item:
    // a sample's band of ROWS rows, a block of 64 output channels and a part of the depths (DEPTH_PARTS a band).
    extern __shared__ __align__(1024) float4 smem4[];
    float* weights = (float*)smem4;                               // [TAPS][COB][16 floats], swizzled
    const int tid = threadIdx.x, wg = tid / GROUP, gt = tid % GROUP;
    const int lane = gt & 31, warp = gt >> 5, g = lane >> 2, t = lane & 3;
    unsigned* ring = (unsigned*)(weights + TAPS * W_TAP_FLOATS) + wg * SLOTS * PLANE_WORDS;  // [SLOTS][PLANE_POS][16]
    TAKE_PHASE(0);
    // The block's weights, once, by every thread (the two warpgroups' items share the block).
    const int ob = blockIdx.x % (C_OUT / COB);
    const float* w_block = w + (long long)ob * COB * 32;
    #pragma unroll 1
    for (int tap = 0; tap < TAPS; tap++) {
        const long long at = (long long)(((td0 + tap / (KH * KW) * tds) * KHF + th0 + tap / KW % KH * ths) * KWF
                                         + tw0 + tap % KW * tws) * C_OUT * 32;
        for (int e = tid; e < COB * 4; e += THREADS) {
            const int oc = e / 4, c = e % 4;
            cp_async16(weights + tap * W_TAP_FLOATS + oc * 16 + (SWIZZLE(c, oc) << 2), w_block + at + oc * 32 + c * 4);
        }
    }
    cp_commit();
    for (int e = gt; e < SLOTS * PLANE_WORDS; e += GROUP)
        if (e % PLANE_WORDS >= HH * XW * 16) ring[e] = 0u;  // each slot's positions past its plane's rows

    int item = blockIdx.x / (C_OUT / COB) * (THREADS / GROUP) + wg;
    const int part = item % DEPTH_PARTS; item /= DEPTH_PARTS;
    const int qh0 = (item % qh_blocks) * ROWS, n = item / qh_blocks;
    const int depths = (QD + DEPTH_PARTS - 1) / DEPTH_PARTS;
    const int q_begin = part * depths, q_end = min(QD, q_begin + depths);
    const bool active = q_begin < q_end;

    // One scale for every plane the item reads.
    const long long first_row = ((long long)n * XD + off_d) * XH + qh0 + off_h;  // window plane 0's row 0
    float amax = 0.f, a_inverse = 1.f;
    for (int a = q_begin; a < q_end + (KD - 1) * DD; a++)
        amax = fmaxf(amax, plane_max(block_max, first_row + (long long)a * XH, HH, 0, max_blocks, max_blocks, lane));
    const float a_scale = pow2_scale(amax, a_inverse);

    // Window plane a (input depth a + off_d + START_D) into its slot: two units a thread a round, loads first.
    auto split_plane = [&](int a) {
        const int x_d = a + off_d + START_D;
        const bool depth_inside = x_d >= 0 && x_d < X_D;
        const float* x_plane = x + (long long)n * X_SN + (long long)x_d * X_SD;
        unsigned* plane = ring + (a % SLOTS) * PLANE_WORDS;
        #pragma unroll
        for (int base = 0; base < UNITS; base += 2 * GROUP) {
            float v[2][16];
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const int u = base + h * GROUP + gt;
                const int c16 = u / (HH * XW), p = u % (HH * XW);
                const int x_h = qh0 + off_h + p / XW + START_H, x_w = p % XW + START_W;
                const bool inside = u < UNITS && depth_inside && x_h >= 0 && x_h < X_H && x_w >= 0 && x_w < X_W;
                const float* at = x_plane + (long long)(16 * c16) * X_SC + (long long)x_h * X_SH + x_w;
                #pragma unroll
                for (int j = 0; j < 16; j++) v[h][j] = inside ? at[(long long)j * X_SC] : 0.f;
            }
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const int u = base + h * GROUP + gt;
                if (u >= UNITS) continue;
                const int c16 = u / (HH * XW), p = u % (HH * XW);
                unsigned hi[8];
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    hi[e] = to_half2(v[h][e], v[h][e + 4], a_scale);
                    hi[e + 4] = to_half2(v[h][e + 8], v[h][e + 12], a_scale);
                }
                uint4* row = (uint4*)(plane + p * (ROW / 4));
                row[SWIZZLE(2 * c16, p)] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
                row[SWIZZLE(2 * c16 + 1, p)] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
            }
        }
    };

    const unsigned weights_addr = smem_addr(weights), ring_addr = smem_addr((float*)ring);
    if (active)
        for (int a = q_begin; a < q_begin + (KD - 1) * DD; a++) split_plane(a);  // the first depth's planes but one
    cp_wait<0>();
    __syncthreads();  // the weights and every ring's zeros

    // d[4 j + e]: output channel 16 warp + g + 8 (e / 2) of the block, position 8 j + 2 t + e % 2 of the tile.
    float d[NP / 2];
    float bias_of[2], scale_of[2];
    #pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int o = ob * COB + 16 * warp + g + 8 * hf;
        bias_of[hf] = HAS_BIAS ? bias[o] : 0.f;
        scale_of[hf] = w_inverse[o];
    }
    float* y_band = y + n * syn + (long long)(ob * COB + 16 * warp + g) * syc;
    #pragma unroll 1
    for (int q = active ? q_begin : q_end; q < q_end; q++) {
        // Depth q's last plane into the slot of depth q - 1's first: those MMAs are done (below).
        split_plane(q + (KD - 1) * DD);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        group_sync(wg);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        #pragma unroll
        for (int kd = 0; kd < KD; kd++) {
            const unsigned plane_at = ring_addr + ((q + kd * DD) % SLOTS) * PLANE_WORDS * 4;
            #pragma unroll
            for (int tap = 0; tap < KH * KW; tap++) {
                const int kh = tap / KW, kw = tap % KW;
                const unsigned a_at = weights_addr + 4 * (kd * KH * KW + tap) * W_TAP_FLOATS;
                const unsigned b_at = plane_at + (off_w + kh * DH * XW + kw * DW) * ROW;
                #pragma unroll
                for (int ks = 0; ks < 2; ks++)
                    wgmma_ss(d, row_desc(a_at + 32 * ks), row_desc(b_at + 32 * ks), kd + tap + ks > 0);
            }
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        group_sync(wg);  // every warp's MMAs done: the ring's oldest plane free
        // The tile straight from the registers: each value to its lattice element.
        #pragma unroll
        for (int j = 0; j < NP / 8; j++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                const int position = 8 * j + 2 * t + (e & 1), r = position / XW, c = position % XW;
                if (c < QW && qh0 + r < QH)
                    y_band[(long long)(8 * (e >> 1)) * syc + (long long)q * syd + (long long)(qh0 + r) * syh
                           + (long long)c * syw] = d[4 * j + e] * scale_of[e >> 1] * a_inverse + bias_of[e >> 1];
            }
    }
}
"""


def ring_source(c_out: int, taps, dilation, window_columns: int, has_bias: bool, input_geometry) -> str:
    """The ring kernel's source for problem 77's kind of correlation: row_runs.source's macros (FP16, the input read
    itself), one program a multiprocessor."""
    (kd, kh, kw), (dd, dh, dw) = taps, dilation
    defines = dict(C_IN=32, C_OUT=c_out, KD=kd, KH=kh, KW=kw, DD=dd, DH=dh, DW=dw, XW=window_columns,
                   ROWS=row_runs.ROWS, HAS_BIAS=int(has_bias), SPLIT=3, SLOTS=SLOTS, DEPTH_PARTS=DEPTH_PARTS,
                   THREADS=THREADS, MAX_PHASES=MAX_PHASES, PHASE_FIELDS=PHASE_FIELDS,
                   **row_runs.input_macros(input_geometry))
    head = "".join(f"#define {name} {value}\n" for name, value in defines.items())
    return (head + COPY_HELPERS + FP16_HELPERS + TILE_HELPERS + PHASE_HELPERS + row_runs.mma_helpers(window_columns)
            + RING_SOURCE)


def shared_bytes(taps, dilation, window_columns: int) -> int:
    """The weights and both warpgroups' rings."""
    kd, kh, kw = taps
    plane = row_runs.plane_positions(taps, dilation, window_columns)
    return kd * kh * kw * 64 * 64 + THREADS // 128 * SLOTS * plane * 64


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    x, w, plan, phase_list = problem_77()
    mode, split, reference, eager = next(modes(x, w))  # FP16 (TF32 allowed)
    library, expected = library_forward(x, w)
    out = torch.empty(plan.output_shape, device="cuda")
    start, extent, geometry = correlation_geometry(plan, phase_list, split, out.stride())
    window_shape, input_geometry = cuda_phases.input_direct(x, plan, phase_list, split)
    counts, dilation, grid = geometry["taps"], geometry["dilation"], geometry["grid"]
    assert dilation[0] == 1 and grid[2] <= 32 and plan.out_channels % 64 == 0

    def operands():
        _, taps, scales = correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False, split=split,
                                               window=False)
        return taps, scales

    ops = operands()
    # The library's launch of the correlation (row_runs.py's kernel reading the input), for its arguments.
    phases = ((*geometry["offsets"], *geometry["first_taps"], *geometry["tap_steps"], geometry["out_offset"]),)
    (_, _, ints, longs, table), = cuda.phase_launches(
        0, window_shape, tuple(ops[0].shape[-4:-1]), split, False, tuple(geometry["out_strides"]), tuple(grid),
        tuple(counts), tuple(dilation), phases, (ops[1][1], ops[1][0].shape[-1]), input_geometry)
    ring = cuda._Kernel(ring_source(plan.out_channels, counts, dilation, window_shape[3], False, input_geometry),
                        "phase_conv_ring", shared_bytes(counts, dilation, window_shape[3]), THREADS)
    programs = plan.batch * -(-grid[1] // row_runs.ROWS) * DEPTH_PARTS * (plan.out_channels // 64) // (THREADS // 128)

    def ring_correlation(y, ops):
        taps, (block_max, _, w_inverse) = ops
        ring.launch(programs, (x.data_ptr(), taps.data_ptr(), 0, 0, block_max.data_ptr(), w_inverse.data_ptr(),
                               y.data_ptr()), ints, longs, _current_stream(0), table)

    def ring_forward():
        y = torch.empty(plan.output_shape, device="cuda")
        y.zero_()
        ring_correlation(y, operands())
        return y

    y = ring_forward()
    torch.cuda.synchronize()
    print("ring forward: largest difference to the library's", (y - expected).abs().max().item(),
          "|", checked(ring_forward, expected, reference, eager), flush=True)
    timings = Timings(args.iters)
    for round_ in range(args.rounds):
        timings.row(mode, f"library forward (round {round_ + 1})", library)
        timings.row(mode, f"ring forward (round {round_ + 1})", ring_forward)
        if round_ == 0:
            timings.row(mode, "library correlation into the lattice, operands made before",
                        lambda: cuda.correlate(x, ops[0], None, out, **geometry, scales=ops[1], split=split,
                                               direct=(window_shape, input_geometry)))
            timings.row(mode, "ring correlation into the lattice, operands made before",
                        lambda: ring_correlation(out, ops))
    print(timings.table())


if __name__ == "__main__":
    main()
