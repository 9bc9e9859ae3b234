"""Forward calls on sweep layers (GPU): the host's time against the GPU's, under no_grad, or with --grad as the bench
and KernelBench call them (grad mode on, the parameters requiring grad).

    PYTHONPATH=src python3 benchmarks/diag_host_forward.py [--iters 50] [--layers unet3d_k2s2,...] [--gc freeze]
        [--pin 0] [--grad]

Per implementation: the bench's cold-L2 mean and minimum (a synchronisation before each call, so the GPU waits
whenever the host is late), the same calls queued back to back (no synchronisation: the GPU's own time), and the
median host time from a synchronisation to the call's return. To see whether a slow process's host time is Python's
garbage collector or the scheduler: --gc freeze (gc.freeze() after each layer's first calls) or off, --pin CPU
(the process on that one CPU).
"""

import argparse
import copy
import gc
import os

import torch

from convt3d import convert
from convt3d.bench.protocol import host_time_cuda, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import DTYPES, sweep_layers


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--layers", default="unet3d_k2s2,unet3d_k2s2_bf16,k3s1p1,video_k3s2p1op1,batch1_small_k3s2")
    parser.add_argument("--tf32", choices=("on", "off"), default="on")
    parser.add_argument("--gc", choices=("on", "freeze", "off"), default="on")
    parser.add_argument("--pin", type=int, default=None, help="run on this one CPU")
    parser.add_argument("--grad", action="store_true", help="grad mode on, as the bench times modules")
    args = parser.parse_args()
    if args.pin is not None:
        os.sched_setaffinity(0, {args.pin})
    if args.gc == "off":
        gc.disable()
    torch.backends.cudnn.allow_tf32 = args.tf32 == "on"
    rows = []
    for layer in sweep_layers(args.layers):
        name = layer.name
        dtype = DTYPES[layer.dtype]
        torch.manual_seed(0)
        eager = layer.module().cuda().to(dtype)
        impls = {"eager": eager, "triton": convert(copy.deepcopy(eager), backend="triton"),
                 "auto": convert(copy.deepcopy(eager))}
        x = torch.rand(layer.input_shape, device="cuda", dtype=dtype)
        with torch.set_grad_enabled(args.grad):
            for label, module in impls.items():
                if args.gc == "freeze":
                    module(x)  # its first call: autotuning, caches
                    gc.freeze()
                cold = time_cuda(lambda: module(x), iters=args.iters)
                queued = time_cuda(lambda: module(x), iters=args.iters, synchronize=False)
                host = host_time_cuda(lambda: module(x), calls=args.iters)
                rows.append((name, label, cold.mean_ms, cold.min_ms, queued.mean_ms, host))
                print(rows[-1], flush=True)
    print(markdown_table(["layer", "implementation", "cold mean ms", "cold min ms", "queued mean ms",
                          "host ms (median)"], rows))


if __name__ == "__main__":
    main()
