"""KernelBench L1/77 at batch 2 on the CPU: convt3d's portable path against torch.nn.functional.conv_transpose3d.

Both sides in one run, interleaved (eager, convt3d, eager, ...) so that machine noise hits both alike;
wall clock, warm-up first, fresh torch.rand input, relative error against float64.
    PYTHONPATH=src python3 benchmarks/cpu_problem77.py [--repeats 10] [--batch 2]
"""

import argparse
import statistics

import torch
import torch.nn.functional as F

import convt3d
from convt3d.bench.protocol import time_interleaved


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    layer = torch.nn.ConvTranspose3d(32, 64, 3, stride=2, padding=1, dilation=2, bias=False)
    x = torch.rand(args.batch, 32, 16, 32, 32)
    w = layer.weight.detach()
    eager = lambda: F.conv_transpose3d(x, w, None, stride=2, padding=1, dilation=2)  # noqa: E731
    ours = lambda: convt3d.conv_transpose3d(x, w, None, stride=2, padding=1, dilation=2)  # noqa: E731
    ref = F.conv_transpose3d(x.double(), w.double(), None, stride=2, padding=1, dilation=2)
    err = {name: ((fn().double() - ref).norm() / ref.norm()).item()
           for name, fn in (("eager", eager), ("convt3d", ours))}
    # 3 warm-up rounds: the first calls allocate and fault in memory.
    times = time_interleaved({"eager": eager, "convt3d": ours}, args.repeats, warmup=3)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, {args.repeats} repeats")
    for name in times:
        t = times[name]
        print(f"{name:8s} mean {statistics.fmean(t):7.2f} ms  std {statistics.stdev(t):5.2f}  "
              f"median {statistics.median(t):7.2f}  min {min(t):7.2f}  max {max(t):7.2f}  "
              f"rel err vs fp64 {err[name]:.1e}")
    mean, median = statistics.fmean, statistics.median
    print(f"speed-up: mean {mean(times['eager']) / mean(times['convt3d']):.2f}x, "
          f"median {median(times['eager']) / median(times['convt3d']):.2f}x")


if __name__ == "__main__":
    main()
