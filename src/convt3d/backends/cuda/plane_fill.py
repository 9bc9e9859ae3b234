"""CUDA C++ source of the fill of an output's planes off a phase's depth lattice, for the whole-planes forward
(phases.write_whole_planes): the phase correlation writes the lattice planes whole, and this kernel, on a second
stream at the same time, every other plane.

Few programs (one per multiprocessor, 128 threads, 32 registers), each looping over planes: they stay resident beside
the correlation's two programs per multiprocessor (206 registers x 128 threads each, 64 K registers in all) instead of
taking every slot until they end, as out.zero_()'s grid does (twelfth session: the correlation beside zero_() on a
second stream, no overlap at all). A plane is contiguous: 16-byte stores between scalar ones at its ends.
"""

THREADS = 128

SOURCE = r"""
// value over [0, n) from base: scalar stores up to the first 16-byte boundary and after the last, 16-byte stores between.
__device__ __forceinline__ void fill_range(float* base, long long n, float value)
{
    const long long head = min(n, (long long)((0u - (unsigned)((unsigned long long)base / 4u)) & 3u));
    if (threadIdx.x < head) base[threadIdx.x] = value;
    float4* body = reinterpret_cast<float4*>(base + head);
    const long long chunks = (n - head) / 4;
    const float4 v = make_float4(value, value, value, value);
    for (long long k = threadIdx.x; k < chunks; k += THREADS) body[k] = v;
    for (long long e = head + 4 * chunks + threadIdx.x; e < n; e += THREADS) base[e] = value;
}

// out (N x C planes of D planes of plane floats each, contiguous): every plane d off the lattice LOD + LSD q (q < QD)
// set to its channel's bias, or zero.
extern "C" __global__ void __launch_bounds__(THREADS) plane_fill(const float* __restrict__ bias, float* __restrict__ out,
                                                                 int planes, int D, int C, int LOD, int LSD, int QD,
                                                                 long long plane)
{
    for (int p = blockIdx.x; p < planes; p += gridDim.x) {
        const int nc = p / D, rd = p - nc * D - LOD;
        if (rd >= 0 && rd % LSD == 0 && rd / LSD < QD) continue;  // a lattice plane: the correlation writes it
        fill_range(out + (long long)p * plane, plane, HAS_BIAS ? bias[nc % C] : 0.f);
    }
}
"""


def source(has_bias: bool) -> str:
    return f"#define THREADS {THREADS}\n#define HAS_BIAS {int(has_bias)}\n" + SOURCE
