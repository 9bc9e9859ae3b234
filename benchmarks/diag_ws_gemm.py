"""Whether Triton's Hopper warp specialisation runs here at all (GPU, Hopper): a plain FP16 GEMM of the deep k2 s2
layer's size (M 4096 positions, N 2048 weight rows, K 512 channels, 128 x 128 x 64 tiles, 4 warps, 3 stages), its
K-loop warp-specialised or not, the TMA descriptors made on the host (triton.tools.tensor_descriptor) or on the device
(tl.make_tensor_descriptor). Prints the largest error against a float32 matmul of the same FP16 values and
triton.testing.do_bench's time. Run each form in its own process: a fault poisons the CUDA context. Results:
benchmarks/RESULTS.md, forty-fourth session.

    python3 benchmarks/diag_ws_gemm.py host|dev 0|1
"""

import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _gemm_tile(a_desc, b_desc, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               WS: tl.constexpr):
    """The program's [BM, BN] tile of C = A B^T, A (M, K) and B (N, K) read through the descriptors."""
    pid = tl.program_id(0)
    pm = pid % (M // BM)
    pn = pid // (M // BM)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in tl.range(0, K, BK, warp_specialize=WS):
        acc = tl.dot(a_desc.load([pm * BM, k]), b_desc.load([pn * BN, k]).T, acc)
    offs_m = pm * BM + tl.arange(0, BM)
    offs_n = pn * BN + tl.arange(0, BN)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc)


@triton.jit
def mm_host(a_desc, b_desc, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, WS: tl.constexpr):
    _gemm_tile(a_desc, b_desc, c_ptr, M, N, K, BM, BN, BK, WS)


@triton.jit
def mm_dev(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, WS: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    _gemm_tile(a_desc, b_desc, c_ptr, M, N, K, BM, BN, BK, WS)


def main():
    which, ws = sys.argv[1], int(sys.argv[2])
    # Device-made descriptors take their global memory from this allocator.
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    M, N, K = 4096, 2048, 512
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(N, K, device="cuda", dtype=torch.float16)
    c = torch.full((M, N), float("nan"), device="cuda")
    grid = ((M // 128) * (N // 128),)
    if which == "host":
        def fn():
            mm_host[grid](TensorDescriptor.from_tensor(a, [128, 64]), TensorDescriptor.from_tensor(b, [128, 64]), c,
                          M, N, K, 128, 128, 64, ws, num_warps=4, num_stages=3)
    else:
        def fn():
            mm_dev[grid](a, b, c, M, N, K, 128, 128, 64, ws, num_warps=4, num_stages=3)
    fn()
    torch.cuda.synchronize()
    err = ((c - a.float() @ b.float().T).abs().max()).item()
    t = triton.testing.do_bench(fn, warmup=5, rep=50)
    print(which, ws, "max err", err, "ms", round(t, 4), "TFLOP/s", round(2 * M * N * K / t / 1e9, 1))


if __name__ == "__main__":
    main()
