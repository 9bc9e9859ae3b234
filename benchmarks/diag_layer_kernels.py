"""Where a sweep layer's forward spends its time, per implementation (GPU): host, GPU, and each kernel.

    PYTHONPATH=src python3 benchmarks/diag_layer_kernels.py [--layers unet3d_k2s2,...] [--tf32 on|off]
        [--impls eager,auto,triton,torch] [--iters 50] [--calls 20]

Per implementation: the bench's cold-L2 mean (a synchronisation before each call), the same calls queued (no
synchronisation), the median host time of a call, KernelBench's check against eager; then --calls calls under
torch.profiler, each after an L2 flush by a kernel of its own (bitwise_not, so that the trace tells it apart): the
GPU's time from the flush's end to the call's first kernel ("gap") and to its last kernel's end ("span"), the sum of
its kernels' times ("busy"), and each kernel's median time.
"""

import argparse
import copy
import json
import os
import statistics
import tempfile
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from convt3d import convert
from convt3d.bench.protocol import host_time_cuda, kernelbench_check, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import DTYPES, sweep_layers


def call_kernels(fn, flush, calls: int):
    """Per call after the first two: (gap, span, busy) in us and its kernels as (index, name, us)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            torch.cuda.synchronize()
            flush.bitwise_not_()
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as file:
            events = [e for e in json.load(file)["traceEvents"] if e.get("cat") == "kernel"]
    per_call, current = [], None
    for event in sorted(events, key=lambda e: e["ts"]):
        if "bitwise_not" in event["name"]:
            current = {"flush_end": event["ts"] + event["dur"], "kernels": []}
            per_call.append(current)
        elif current is not None:
            current["kernels"].append(event)
    return [c for c in per_call[2:] if c["kernels"]]  # the first two: warm-up under the profiler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="unet3d_k2s2,video_k3s2p1op1,vae_k4s2p1_fp16,unet3d_k2s2_deep")
    parser.add_argument("--tf32", choices=("on", "off"), default="on")
    parser.add_argument("--impls", default="eager,auto")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = args.tf32 == "on"
    flush = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda")
    rows = []
    for layer in sweep_layers(args.layers):
        dtype = DTYPES[layer.dtype]
        torch.manual_seed(0)
        eager = layer.module().cuda().to(dtype)
        x = torch.rand(layer.input_shape, device="cuda", dtype=dtype)
        with torch.no_grad():
            expected = eager(x)
            for label in args.impls.split(","):
                module = eager if label == "eager" else convert(copy.deepcopy(eager), backend=label)
                passed = kernelbench_check(module(x), expected)
                cold = time_cuda(lambda: module(x), iters=args.iters)
                queued = time_cuda(lambda: module(x), iters=args.iters, synchronize=False)
                host = host_time_cuda(lambda: module(x), calls=args.iters)
                calls = call_kernels(lambda: module(x), flush, args.calls)
                gap = statistics.median(c["kernels"][0]["ts"] - c["flush_end"] for c in calls)
                span = statistics.median(c["kernels"][-1]["ts"] + c["kernels"][-1]["dur"] - c["flush_end"]
                                         for c in calls)
                busy = statistics.median(sum(k["dur"] for k in c["kernels"]) for c in calls)
                rows.append((layer.name, label, f"{cold.mean_ms:.4f}", f"{queued.mean_ms:.4f}", f"{host:.4f}",
                             f"{gap / 1e3:.4f}", f"{span / 1e3:.4f}", f"{busy / 1e3:.4f}", passed))
                print(rows[-1], flush=True)
                durations = defaultdict(list)
                for c in calls:
                    for index, kernel in enumerate(c["kernels"]):
                        durations[(index, kernel["name"][:70])].append(kernel["dur"])
                for (index, name), us in sorted(durations.items()):
                    print(f"    {index} {statistics.median(us):8.1f} us  {name}", flush=True)
    print(markdown_table(["layer", "implementation", "cold mean ms", "queued mean ms", "host ms", "gap ms",
                          "span ms", "kernels ms", "KB check"], rows))


if __name__ == "__main__":
    main()
