"""Whole forward calls (operand pass and main kernel, as a layer's later calls make them) of layers that turned.py's
kernel serves, in one of two forms per process (autotuning is per process), GPU, TF32 mode:

    general   CONVT3D_TURNED=0's: the general and tap_columns kernels only
    turned    the library's default: turned.py's configs among the candidates

    PYTHONPATH=src python3 benchmarks/diag_turned_calls.py --form turned [--layers vae_k4s2p1,...] [--iters 100]

Written when, on an H100 (ninetieth session), autotuning had found turned.py's kernel 13% faster alone on
video_spatial_k144 but the whole call slower with it (median 0.0372 ms against 0.0340). Its first run (call 5, on
6df3ab0's library, which launched turned.py's kernel as the operand pass's dependent, as the general kernel is
launched) had a third form, the kernel launched after the pass instead ("turned_no_pdl"); the dependent launch was the
slower or equal of the two on each layer (benchmarks/RESULTS.md), and the library's kernel is now launched after the
pass. Rows: the layer, the form, the main kernel chosen, KernelBench's check against eager, cold-L2 mean / median /
minimum and queued mean (ms), median host time.
"""

import argparse
import copy

import torch

from convt3d import convert
from convt3d.backends.triton import forward, turned
from convt3d.bench.protocol import host_time_cuda, kernelbench_check, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import DTYPES, sweep_layers


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--form", choices=("general", "turned"), required=True)
    parser.add_argument("--layers", default="video_spatial_k144,vae_k4s2p1,wide_256to128_k3s2")
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args()
    turned.ENABLED = args.form == "turned"
    torch.backends.cudnn.allow_tf32 = True
    rows = []
    for layer in sweep_layers(args.layers):
        dtype = DTYPES[layer.dtype]
        torch.manual_seed(0)
        eager = layer.module().cuda().to(dtype)
        x = torch.rand(layer.input_shape, device="cuda", dtype=dtype)
        with torch.no_grad():
            expected = eager(x)
            module = convert(copy.deepcopy(eager), backend="triton")
            passed = kernelbench_check(module(x), expected)
            chosen = [str(cfg.get("KERNEL", "general")) for cfg in forward._best_config.values()]
            forward._best_config.clear()  # (so that the next layer's choice is its own)
            cold = time_cuda(lambda: module(x), iters=args.iters)
            queued = time_cuda(lambda: module(x), iters=args.iters, synchronize=False)
            host = host_time_cuda(lambda: module(x), calls=args.iters)
        rows.append((layer.name, args.form, ",".join(chosen), passed, f"{cold.mean_ms:.4f}", f"{cold.median_ms:.4f}",
                     f"{cold.min_ms:.4f}", f"{queued.mean_ms:.4f}", f"{host:.4f}"))
        print(rows[-1], flush=True)
    print(markdown_table(["layer", "form", "kernel", "KB check", "cold mean", "cold median", "cold min", "queued mean",
                          "host ms"], rows))


if __name__ == "__main__":
    main()
