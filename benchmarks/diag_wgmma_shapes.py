"""Two questions about the CUDA phase correlation's MMAs (backends/cuda/phase_conv.py) on an sm_90 GPU, answered by
small kernels of their own:

1. Can wgmma read its B operand (N rows of 32 TF32 channels, 128-byte rows swizzled by their shared-memory address, as
   the kernel stores its weight) from a first row that is not a multiple of 8, with the descriptor's base offset
   left at 0? That would let window positions serve as B at any tap offset. Checked exactly on small integers.
2. What do the main loop's MMAs reach on their own: k-steps of MMAS wgmma.m64n{N}k8 (A from registers, B through
   descriptors, one group left in flight) and LDSM ldmatrix.x4 loading the next A fragments, two programs of one
   warpgroup per multiprocessor, no copies, no barriers. The library's kernel on problem 77 has 4 x m64n64k8 and 4
   ldmatrix per k-step.

    PYTHONPATH=src python3 benchmarks/diag_wgmma_shapes.py
"""

import torch

from convt3d.backends.cuda import phase_conv
from convt3d.bench.report import markdown_table

PROBE = r"""
__device__ __forceinline__ void wgmma32(float* d, const unsigned* a, unsigned long long desc, int accumulate = 1) {
    WGMMA32
}
// D (64 x 32) = A (64 x 8) x rows start..start+31 of P (npos x 32 channels), channels 8 ks..8 ks + 7.
extern "C" __global__ void probe(const float* A, const float* P, float* D, int start, int ks, int npos) {
    extern __shared__ __align__(1024) float4 smem4[];
    float* rows = (float*)smem4;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    for (int e = tid; e < npos * 8; e += 128) {  // 16-byte chunk c of row p at chunk c ^ (p & 7), as copy_weight
        const int p = e / 8, c = e % 8;
        *(float4*)(rows + p * 32 + ((c ^ (p & 7)) << 2)) = *(const float4*)(P + p * 32 + c * 4);
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int m = 16 * warp + g;
    unsigned a[4] = {__float_as_uint(A[m * 8 + t]), __float_as_uint(A[(m + 8) * 8 + t]),
                     __float_as_uint(A[m * 8 + t + 4]), __float_as_uint(A[(m + 8) * 8 + t + 4])};
    float d[16];
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    wgmma32(d, a, b_desc(smem_addr(rows) + start * 128 + ks * 32), 0);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    for (int i = 0; i < 4; i++) {
        D[m * 32 + 8 * i + 2 * t] = d[4 * i];
        D[m * 32 + 8 * i + 2 * t + 1] = d[4 * i + 1];
        D[(m + 8) * 32 + 8 * i + 2 * t] = d[4 * i + 2];
        D[(m + 8) * 32 + 8 * i + 2 * t + 1] = d[4 * i + 3];
    }
}
"""

LOOP = r"""
__device__ __forceinline__ void wgmma_n(float* d, const unsigned* a, unsigned long long desc, int accumulate = 1) {
    WGMMA_N
}
__device__ __forceinline__ void ldmatrix4(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
extern "C" __global__ void __launch_bounds__(128, 1) loop(float* out, int iters) {
    extern __shared__ __align__(1024) float4 smem4[];
    float* smem = (float*)smem4;
    const int tid = threadIdx.x, lane = tid & 31;
    for (int e = tid; e < 16384; e += 128) smem[e] = (e % 7) * 0.125f;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    float d[MMAS][N / 2];
    for (int s = 0; s < MMAS; s++)
        for (int k = 0; k < N / 2; k++) d[s][k] = 0.f;
    unsigned a[3][LDSM][4];  // three fragment buffers, as the library's kernel: indexed by constants only
    const unsigned base = smem_addr(smem), a_lane = base + 32768 + (lane * 144) % 16384;
    #define STEP(B) { \
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); \
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); \
        _Pragma("unroll") for (int s = 0; s < MMAS; s++) \
            wgmma_n(d[s], a[B][s % LDSM], b_desc(base + ((s * 34 + B) * 128 + (it % 4) * 32) % 32768)); \
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); \
        _Pragma("unroll") for (int l = 0; l < LDSM; l++) ldmatrix4(a[(B + 1) % 3][l], a_lane + 16 * ((it + l) % 8)); \
        it++; }
    for (int it = 0; it < iters;) { STEP(0) STEP(1) STEP(2) }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    float sum = 0.f;
    for (int s = 0; s < MMAS; s++)
        for (int k = 0; k < N / 2; k++) sum += d[s][k];
    out[blockIdx.x * 128 + tid] = sum;
}
"""

# (label, N, MMAS, LDSM): every k-step computes 64 x 256 x 8.
SHAPES = [("4 x m64n64k8, 4 ldmatrix (the library's, problem 77)", 64, 4, 4), ("4 x m64n64k8, 1 ldmatrix", 64, 4, 1),
          ("8 x m64n32k8, 1 ldmatrix", 32, 8, 1), ("8 x m64n32k8, 4 ldmatrix", 32, 8, 4),
          ("2 x m64n128k8, 1 ldmatrix", 128, 2, 1)]


def compile_kernel(source: str, name: str):
    return torch.cuda._compile_kernel(phase_conv.WGMMA_HELPERS.replace("WGMMA_ASM", phase_conv.wgmma_asm(64))
                                      + source, name, compute_capability="90a")


def check_unaligned_rows() -> None:
    probe = compile_kernel(PROBE.replace("WGMMA32", phase_conv.wgmma_asm(32)), "probe")
    torch.manual_seed(0)
    A = torch.randint(-4, 5, (64, 8), device="cuda").float() * 0.25  # exact in TF32 and in the sums
    P = torch.randint(-4, 5, (64, 32), device="cuda").float() * 0.5
    worst = 0.0
    for start in (0, 1, 3, 5, 8, 13, 20):
        for ks in range(4):
            D = torch.full((64, 32), float("nan"), device="cuda")
            probe(grid=(1, 1, 1), block=(128, 1, 1), args=[A, P, D, start, ks, 64], shared_mem=64 * 128)
            expected = A.double() @ P[start:start + 32, 8 * ks:8 * ks + 8].double().T
            worst = max(worst, (D.double() - expected).abs().max().item())
    print(f"B from rows 0, 1, 3, 5, 8, 13, 20 (k-steps 0-3): largest error {worst} (exact: {worst == 0})")


def time_shapes(iters: int = 3999) -> list[tuple]:
    """(k-step, ms, TFLOP/s) per shape of SHAPES."""
    rows = []
    programs = 2 * torch.cuda.get_device_properties(0).multi_processor_count
    smem = 80 * 1024
    out = torch.empty(programs * 128, device="cuda")
    for label, n, mmas, ldsm in SHAPES:
        kernel = compile_kernel(f"#define N {n}\n#define MMAS {mmas}\n#define LDSM {ldsm}\n"
                                + LOOP.replace("WGMMA_N", phase_conv.wgmma_asm(n)), "loop")
        kernel.set_shared_memory_config(smem)
        launch = lambda: kernel(grid=(programs, 1, 1), block=(128, 1, 1), args=[out, iters], shared_mem=smem)
        launch(), launch()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            launch()
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / 5
        rows.append((label, f"{ms:.3f}", f"{programs * iters * 64 * 256 * 8 * 2 / ms / 1e9:.0f}"))
    return rows


if __name__ == "__main__":
    check_unaligned_rows()
    print(markdown_table(["k-step", "ms", "TFLOP/s"], time_shapes()))
