"""Why convt3d's calls sometimes take twice eager's host time in the bench (GPU machine).

In several sweeps (twentieth, twenty-fifth, thirty-fourth sessions) convt3d's rows of a layer took 0.10 ms of host
time per call where eager's row just before took 0.045, even where "auto" had chosen eager's own kernel, whose call
costs convt3d 4 us more than eager's in a quiet process. This script runs the bench's own rows for some layers
(bench.runner.run_layer) and, before and after each, measures the host time of: eager's module; a convt3d module
that runs eager's kernel; a pure-Python probe (nested calls of a trivial function, no torch); a CUDA torch.empty
(C++ only); along with the process's state (threads, trace and profile hooks, Dynamo's frame callback, the
garbage collector's counts, load average). If the probe slows with convt3d, the cause is the interpreter's (a hook,
the GIL); if only convt3d's calls slow, it is in convt3d's own path.

    PYTHONPATH=src python3 benchmarks/diag_slow_host.py [--layers k3s1p1,video_spatial_k144] [--iters 30]
"""

import argparse
import gc
import os
import statistics
import sys
import threading
import time

import torch

from convt3d import convert
from convt3d.bench.protocol import host_time_cuda
from convt3d.bench.runner import run_layer
from convt3d.bench.workloads import sweep_layers


def _leaf(x):
    return x + 1


def _nested(depth, x=0):
    return _leaf(x) if depth == 0 else _nested(depth - 1, x)


def python_probe_us(calls=2000):
    """Median over 5 runs of one 30-deep call chain's time, in us."""
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            _nested(30)
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs)


def state():
    eval_frame = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    callback = getattr(eval_frame, "get_eval_frame_callback", lambda: "n/a")()
    return dict(threads=sorted(t.name for t in threading.enumerate()), trace=sys.gettrace(),
                profile=sys.getprofile(), dynamo_callback=callback, gc_count=gc.get_count(),
                gc_objects=len(gc.get_objects()), load=os.getloadavg())


def measure(label, modules, x):
    with torch.no_grad():
        figures = {name: host_time_cuda(lambda m=m: m(x), calls=200) * 1e3 for name, m in modules.items()}
    figures["torch.empty (cuda)"] = host_time_cuda(lambda: torch.empty(64, device="cuda"), calls=200) * 1e3
    figures["python probe"] = python_probe_us()
    print(f"--- {label}: " + ", ".join(f"{k} {v:.1f} us" for k, v in figures.items()), flush=True)
    print(f"    state: {state()}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="k3s1p1,video_spatial_k144")
    parser.add_argument("--iters", type=int, default=30)
    args = parser.parse_args()
    layers = sweep_layers(args.layers)
    probe_layer = layers[0]
    torch.manual_seed(0)
    eager = probe_layer.module().cuda()
    modules = {"eager module": eager, "convt3d (eager's kernel)": convert(
        type(eager)(eager.in_channels, eager.out_channels, eager.kernel_size, eager.stride, eager.padding,
                    eager.output_padding).cuda(), backend="eager")}
    x = torch.rand(probe_layer.input_shape, device="cuda")
    measure("fresh process", modules, x)
    for layer in layers:
        rows = run_layer(layer, torch.device("cuda"), compile=False, iters=args.iters)
        for row in rows:
            if "host_ms" in row:
                print(f"    {layer.name}: {row['implementation']:36s} mean {row['mean_ms']:.4f} ms, "
                      f"host {row['host_ms'] * 1e3:.1f} us", flush=True)
        measure(f"after the bench's rows of {layer.name}", modules, x)
    gc.collect()
    measure("after gc.collect()", modules, x)
    time.sleep(3)
    measure("after 3 s of sleep", modules, x)


if __name__ == "__main__":
    main()
