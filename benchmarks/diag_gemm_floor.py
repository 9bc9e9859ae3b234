"""How far the tiled GEMM (backends/triton/tiled.py) is from cuBLAS on the same GEMM (GPU): for the sweep's k2 s2
float32 layers in TF32 mode, cuBLAS's FP16 GEMM of the layer's size (M input positions, K input channels, N output
channels x taps), with float32 and with FP16 results, beside the library's tiled kernel alone, its operand pass alone,
backend="triton" end to end, writing the output once (zero_) and eager.

    PYTHONPATH=src python3 benchmarks/diag_gemm_floor.py [--iters 100] [--layers unet3d_k2s2_deep,unet3d_k2s2]

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call). cuBLAS's operands are random
FP16 of the layer's shapes, A (M, K) and B as (N, K) (both K-major, as the tiled kernel's), its result (M, N) row-major:
not the layer's output layout, so it says what a GEMM of this size costs, not what the layer could. The library's rows
are checked against eager by KernelBench's check.
"""

import argparse

import torch

import convt3d
from convt3d.backends.triton import tiled
from convt3d.backends.triton.forward import precision_for
from convt3d.bench.protocol import kernelbench_check, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import sweep_layers


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--layers", default="unet3d_k2s2_deep,unet3d_k2s2")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = True
    rows = []
    for layer in sweep_layers(args.layers):
        plan = layer.plan()
        module, x, w, b, _ = layer.kernel_case("cuda")
        m = plan.batch * plan.input_spatial[0] * plan.input_spatial[1] * plan.input_spatial[2]
        k, n = plan.in_channels, w[0].numel()
        flops = 2 * m * n * k
        a16 = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b16 = torch.randn(n, k, device="cuda", dtype=torch.float16)
        out = torch.empty(plan.output_shape, device="cuda")
        with torch.no_grad():
            expected = module(x)
        precision = tiled.operand_precision(x.dtype, precision_for(x.dtype))
        convt3d.conv_transpose3d(x, w, b, stride=layer.stride, backend="triton")  # picks the tile config
        key = tiled._chosen_key(x, plan, precision, None, expected, b is not None)
        main_launch = tiled._chosen[key]
        operands = tiled._operands(x, w, precision)
        pointers = (*operands, b if b is not None else operands[2], out)
        main_launch(pointers)
        variants = {
            "eager": lambda: module(x),
            "convt3d, backend=triton": lambda: convt3d.conv_transpose3d(x, w, b, stride=layer.stride,
                                                                        backend="triton"),
            "tiled kernel alone": lambda: main_launch(pointers),
            "tiled operand pass alone": lambda: tiled._operands(x, w, precision),
            "cuBLAS FP16 GEMM, float32 result": lambda: torch.mm(a16, b16.t(), out_dtype=torch.float32),
            "cuBLAS FP16 GEMM, FP16 result": lambda: torch.mm(a16, b16.t()),
            "write the output once (zero_)": lambda: out.zero_(),
        }
        checks = {"tiled kernel alone": lambda: kernelbench_check(out, expected),
                  "convt3d, backend=triton": lambda: kernelbench_check(
                      convt3d.conv_transpose3d(x, w, b, stride=layer.stride, backend="triton"), expected)}
        for label, fn in variants.items():
            try:
                with torch.no_grad():
                    if label == "tiled kernel alone":
                        out.fill_(float("nan"))
                        fn()
                    note = f"KB {checks[label]()}" if label in checks else ""
                    t = time_cuda(fn, iters=args.iters)
            except Exception as error:  # (out_dtype needs torch 2.8 or later): say so and go on
                rows.append((layer.name, label, float("nan"), float("nan"), "", repr(error)[:80]))
                continue
            tflops = f"{flops / t.mean_ms / 1e9:.0f}" if "GEMM" in label or "tiled kernel" in label else ""
            rows.append((layer.name, label, t.mean_ms, t.min_ms, tflops, note))
            print(rows[-1], flush=True)
    print(markdown_table(["layer", "what", "mean ms", "min ms", "TFLOP/s (mean)", "check"], rows))


if __name__ == "__main__":
    main()
