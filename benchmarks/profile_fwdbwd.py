"""Where problem 77's forward+backward spends its time (GPU): torch.profiler over a few calls of the module,
L2 flushed before each as the benchmark does. Prints the kernels by total device time, and per call the host
time against the summed device time, to tell kernel time from gaps between kernels.

    PYTHONPATH=src python3 benchmarks/profile_fwdbwd.py [--calls 10]
"""

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

import convt3d
from convt3d.bench.protocol import FLUSH_BYTES
from convt3d.bench.workloads import PROBLEM_77


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    layer = convt3d.convert(PROBLEM_77.module().cuda())
    x = torch.rand(PROBLEM_77.input_shape, device="cuda", requires_grad=True)
    grad = torch.rand(PROBLEM_77.plan().output_shape, device="cuda")
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    for _ in range(5):
        layer(x).backward(grad)
    torch.cuda.synchronize()
    cases = (("L2 flush alone", lambda: None), ("forward", lambda: layer(x.detach())),
             ("forward+backward", lambda: layer(x).backward(grad)))
    for name, fn in cases:
        host = []
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.calls):
                flush.fill_(1)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                host.append((time.perf_counter() - t0) * 1e3)
                torch.cuda.synchronize()
        events = prof.key_averages()
        device_ms = sum(e.self_device_time_total for e in events) / 1e3 / args.calls
        print(f"\n{name}: host time to issue one call {sorted(host)[len(host) // 2]:.3f} ms (median); device time "
              f"per call {device_ms:.3f} ms (kernels, the flush's included)")
        print(events.table(sort_by="self_device_time_total", row_limit=14, max_name_column_width=70))


if __name__ == "__main__":
    main()
