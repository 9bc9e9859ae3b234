"""Where the time goes on KernelBench L1/77 (GPU): host cost per call, the Triton forward's configs with and
without their GEMM or their stores, its pre-pass, the portable path, and the two backward decompositions.

    PYTHONPATH=src python3 benchmarks/diag_p77.py [--iters 20] [--only host,p77,configs,backward]

Kernel-only figures are warm (triton.testing.do_bench); whole calls are cold-L2 means (bench.protocol).
"""

import argparse
import time

import torch
import triton

import convt3d
from convt3d.backends.torch_phase import conv_transpose3d as torch_phase_forward
from convt3d.backends.torch_phase import conv_transpose3d_backward
from convt3d.backends.triton import forward as tf
from convt3d.bench.protocol import relative_error, time_cuda
from convt3d.bench.workloads import PROBLEM_77


def host_us_per_call(fn, calls=200):
    """Wall time per call when the GPU is not the bottleneck (a tiny layer, no synchronisation inside)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--only", default="host,p77,configs,backward")
    args = parser.parse_args()
    sections = args.only.split(",")
    torch.backends.cudnn.benchmark = False

    # 1. Host cost of one call on a tiny layer.
    xs = torch.rand(1, 4, 4, 4, 4, device="cuda")
    ws = torch.randn(4, 4, 3, 3, 3, device="cuda")
    print("host us per call (tiny layer):")
    for name in ("eager", "torch", "triton", "auto") if "host" in sections else ():
        us = host_us_per_call(lambda: convt3d.conv_transpose3d(xs, ws, None, 2, 1, backend=name))
        print(f"  {name:7s} {us:7.1f}")
    if "host" in sections:
        fn = lambda: torch.nn.functional.conv_transpose3d(xs, ws, None, 2, 1)  # noqa: E731
        print(f"  F.conv_transpose3d {host_us_per_call(fn):7.1f}")

    # 2. Problem 77.
    plan = PROBLEM_77.plan()
    x = torch.rand(PROBLEM_77.input_shape, device="cuda")
    w = torch.randn(PROBLEM_77.weight_shape(), device="cuda") * 0.05
    ref = torch.nn.functional.conv_transpose3d(x.double(), w.double(), None, plan.stride, plan.padding,
                                               plan.output_padding, plan.groups, plan.dilation)
    floor = time_cuda(lambda: torch.empty(plan.output_shape, device="cuda").zero_(), iters=args.iters).mean_ms
    eager = time_cuda(lambda: torch.nn.functional.conv_transpose3d(x, w, None, 2, 1, 0, 1, 2), iters=args.iters)
    phase = time_cuda(lambda: torch_phase_forward(x, w, None, plan), iters=args.iters)
    print(f"\np77 cold means: floor(zero_) {floor:.4f}  eager {eager.mean_ms:.4f}  torch-phase {phase.mean_ms:.4f} "
          f"(rel err {relative_error(torch_phase_forward(x, w, None, plan), ref):.1e})")
    for precision in (tf.TF32, tf.TF32X3) if "configs" in sections else ():
        ops = tf._operands(x, w, plan.groups, precision)
        pre_ms = triton.testing.do_bench(lambda: tf._operands(x, w, plan.groups, precision), warmup=5, rep=50)
        print(f"\nprecision {precision}: pre-pass kernel (warm) {pre_ms:.4f} ms")
        print("config | kernel warm ms | no GEMM | no GEMM stores | whole call cold ms | rel err")
        results = []
        for cfg in tf._configs():
            out = torch.full(plan.output_shape, float("nan"), device="cuda")
            try:
                tf._launch(cfg, plan, *ops, None, out, precision)
            except triton.runtime.errors.OutOfResources:
                print(f"{cfg}: out of resources")
                continue
            err = relative_error(out, ref)
            ms = triton.testing.do_bench(lambda: tf._launch(cfg, plan, *ops, None, out, precision), warmup=5, rep=50)
            cold = time_cuda(lambda: tf.conv_transpose3d_triton(x, w, None, plan, precision, cfg), iters=args.iters)
            results.append((ms, cfg, err, cold.mean_ms))
        results.sort(key=lambda r: r[0])
        for rank, (ms, cfg, err, cold) in enumerate(results):
            diag = []
            if rank < 2 and precision == tf.TF32:
                for d in (1, 2):
                    c = dict(cfg, DIAG=d)
                    diag.append(triton.testing.do_bench(lambda: tf._launch(c, plan, *ops, None, out, precision),
                                                        warmup=5, rep=50))
            diag_s = " | ".join(f"{d:.4f}" for d in diag) if diag else " | "
            name = "/".join(str(cfg[k]) for k in ("BLOCK_M", "BLOCK_CO", "BLOCK_CI", "num_warps", "num_stages",
                                                   "PER_SM"))
            print(f"{name} | {ms:.4f} | {diag_s} | {cold:.4f} | {err:.1e}")

    if "backward" not in sections:
        return
    # 3. Backward of problem 77: aten's strided convolution_backward against the phase decomposition.
    g = torch.randn(plan.output_shape, device="cuda")

    def aten_backward():
        return torch.ops.aten.convolution_backward(g, x, w, None, [2] * 3, [1] * 3, [2] * 3, True, [0] * 3, 1,
                                                   [True, True, False])

    def phase_backward():
        return conv_transpose3d_backward(g, x, w, plan)

    a, b = aten_backward(), phase_backward()
    print(f"\nbackward cold means: aten {time_cuda(aten_backward, iters=args.iters).mean_ms:.4f}  "
          f"phase {time_cuda(phase_backward, iters=args.iters).mean_ms:.4f}  "
          f"grad_input rel diff {relative_error(b[0], a[0].double()):.1e}  "
          f"grad_weight rel diff {relative_error(b[1], a[1].double()):.1e}")


if __name__ == "__main__":
    main()
